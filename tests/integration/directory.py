"""A real directory server for the tests: OpenLDAP's slapd on this host, over TLS (ldaps, a CA of its
own), with an rfc2307 tree (people, groups, a read-only service account for SSSD) and the
openssh-lpk attribute that carries a user's SSH key. Its own process and files; the system's slapd
(installed unconfigured by `make test-deps`) is never touched.

The cluster file names where it is (tests/integration/cluster.yaml: `directory`): its address on
the cluster's bridge, its CA and the service account's password under FILES.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

FILES = Path("/run/clusterbake-tests/directory")
BASE = "dc=cluster,dc=test"
SERVICE_DN = f"cn=sssd,ou=services,{BASE}"
GROUP = "hpc-users"
# Everyone's primary group (a cluster group only by membership: a primary group would count too).
PEOPLE_GROUP, PEOPLE_GID = "people", 3001
PORT = 6636
# The OpenSSH LPK schema (the attribute SSSD reads a user's keys from: ldap_user_ssh_public_key).
OPENSSH_LPK = """
attributetype ( 1.3.6.1.4.1.24552.500.1.1.1.13 NAME 'sshPublicKey'
  DESC 'MANDATORY: OpenSSH Public key' EQUALITY octetStringMatch
  SYNTAX 1.3.6.1.4.1.1466.115.121.1.40 )
objectclass ( 1.3.6.1.4.1.24552.500.1.1.2.0 NAME 'ldapPublicKey' SUP top AUXILIARY
  DESC 'MANDATORY: OpenSSH LPK objectclass' MAY ( sshPublicKey $ uid ) )
"""


@dataclass
class Person:
    name: str
    uid: int
    key: str  # an OpenSSH public key line
    member: bool  # of GROUP: a cluster user


class DirectoryServer:
    def __init__(self, address: str, root: Path = FILES):
        self.address, self.root = address, root
        self.uri = f"ldaps://{address}:{PORT}"
        self.admin_password = secrets.token_urlsafe(24)
        self.process: subprocess.Popen | None = None

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    @property
    def bind_password_file(self) -> Path:
        return self.root / "bind.password"

    def start(self, people: list[Person]) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "data").mkdir(parents=True, mode=0o700)
        self._certificates()
        (self.root / "openssh-lpk.schema").write_text(OPENSSH_LPK)
        (self.root / "slapd.conf").write_text(self._config())
        self.bind_password_file.write_text(secrets.token_urlsafe(24) + "\n")
        self.bind_password_file.chmod(0o600)
        log = open(self.root / "slapd.log", "wb")  # noqa: SIM115 (the server's, closed with it)
        self.process = subprocess.Popen(
            ["/usr/sbin/slapd", "-d", "256", "-h", f"ldaps://0.0.0.0:{PORT}/", "-f", str(self.root / "slapd.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while self._ldap("ldapsearch", "-b", BASE, "-s", "base", check=False).returncode not in (0, 32):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"slapd did not answer: {(self.root / 'slapd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        self._ldap("ldapadd", input=self._entries(people))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)

    def add(self, person: Person) -> None:
        """A person added later (and to the group): what the head's accounting timer picks up."""
        self._ldap("ldapadd", input=self._person(person))
        if person.member:
            change = f"dn: cn={GROUP},ou=groups,{BASE}\nchangetype: modify\nadd: memberUid\nmemberUid: {person.name}\n"
            self._ldap("ldapmodify", input=change)

    # --- the server's files and tree -----------------------------------------------------------

    def _ldap(self, tool: str, *args: str, input: str | None = None, check: bool = True):
        argv = [tool, "-x", "-H", f"ldaps://127.0.0.1:{PORT}", "-D", f"cn=admin,{BASE}", "-w", self.admin_password]
        env = {"LDAPTLS_CACERT": str(self.ca), "LDAPTLS_REQCERT": "allow", "PATH": "/usr/bin:/bin"}
        return subprocess.run([*argv, *args], input=input, capture_output=True, text=True, env=env, check=check)

    def _certificates(self) -> None:
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.root)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=clusterbake test CA",
                "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={self.address}",
                "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
        (self.root / "san.ext").write_text(f"subjectAltName=IP:{self.address},IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip

    def _config(self) -> str:
        schemas = [f"/etc/ldap/schema/{name}.schema" for name in ("core", "cosine", "nis", "inetorgperson")]
        password = subprocess.run(
            ["slappasswd", "-s", self.admin_password], capture_output=True, text=True, check=True
        ).stdout.strip()
        return "\n".join(
            [
                *(f"include {schema}" for schema in schemas),
                f"include {self.root / 'openssh-lpk.schema'}",
                f"pidfile {self.root / 'slapd.pid'}",
                "modulepath /usr/lib/ldap",
                "moduleload back_mdb",
                f"TLSCACertificateFile {self.ca}",
                f"TLSCertificateFile {self.root / 'server.pem'}",
                f"TLSCertificateKeyFile {self.root / 'server.key'}",
                "database mdb",
                f"suffix {BASE}",
                f"rootdn cn=admin,{BASE}",
                f"rootpw {password}",
                f"directory {self.root / 'data'}",
                # The service account reads; no one else sees anything (no anonymous reads).
                f'access to attrs=userPassword by dn.exact="cn=admin,{BASE}" write by anonymous auth by * none',
                f'access to * by dn.exact="{SERVICE_DN}" read by anonymous auth by * none',
                "",
            ]
        )

    def _entries(self, people: list[Person]) -> str:
        service_password = self.bind_password_file.read_text().strip()
        members = "".join(f"memberUid: {p.name}\n" for p in people if p.member)
        tree = [
            f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: cluster\no: cluster\n",
            f"dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n",
            f"dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups\n",
            f"dn: ou=services,{BASE}\nobjectClass: organizationalUnit\nou: services\n",
            f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: sssd\n"
            f"userPassword: {service_password}\n",
            f"dn: cn={GROUP},ou=groups,{BASE}\nobjectClass: posixGroup\ncn: {GROUP}\ngidNumber: 3000\n{members}",
            f"dn: cn={PEOPLE_GROUP},ou=groups,{BASE}\nobjectClass: posixGroup\ncn: {PEOPLE_GROUP}\n"
            f"gidNumber: {PEOPLE_GID}\n",
            *(self._person(p) for p in people),
        ]
        return "\n".join(tree)

    @staticmethod
    def _person(person: Person) -> str:
        return (
            f"dn: uid={person.name},ou=people,{BASE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            f"objectClass: ldapPublicKey\nuid: {person.name}\ncn: {person.name}\nsn: {person.name}\n"
            f"uidNumber: {person.uid}\ngidNumber: {PEOPLE_GID}\nhomeDirectory: /home/{person.name}\n"
            f"loginShell: /bin/bash\nsshPublicKey: {person.key}\n"
        )
