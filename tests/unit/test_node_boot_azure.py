"""clusterbake-node-boot (role cloud_boot) on Azure, against a stand-in of Azure's IMDS and Key Vault.

The program is loaded from roles/cloud_boot/files and run through its `main`; only the
steps that would change this machine are replaced (hostname, host keys, the login user,
the paths of join-source.json and the bundle) and the join program is a small script
that records what it was given. The stand-ins are real HTTP servers on 127.0.0.1 that
check every request the way the services document them and refuse wrong ones (each
refusal is also recorded, and a test fails when a request was refused that it did not
make on purpose):

- IMDS: `Metadata: true` required, X-Forwarded-For refused (400), the api-version each
  path documents, `/metadata/instance` (compute.name, vmSize, tagsList, userData in
  base64), `/metadata/instance/compute/userData?format=text`, and
  `/metadata/identity/oauth2/token` (resource https://vault.azure.net, the user-assigned
  identity's client_id; an unknown one: 400 invalid_request "Identity not found").
- Key Vault: `GET /secrets/{name}[/{version}]?api-version=7.4` with a bearer token the
  IMDS issued for the vault's audience (none: 401 with the challenge), 403 Forbidden
  (ForbiddenByRbac) for an identity without a role, 404 SecretNotFound until published,
  403 Forbidden (SecretDisabled) for a disabled version. The secret holds what the
  provider publishes: the bundle's envelope (src/clusterbake/providers/join_envelope.py).

What real Azure does beyond these documented shapes (the token's contents, RBAC
propagation times) is not shown here; see roles/cloud_boot/README.md.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import programs
import pytest
import yaml
from playbook_run import ANSIBLE_PLAYBOOK, playbook_env

from clusterbake.providers import join_envelope
from clusterbake.providers.userdata import user_data

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "cloud_boot" / "files" / "clusterbake-node-boot"

CLIENT_ID = "5e1a0c7b-2f4d-4a8e-9c3b-7d6f1e2a9b40"
OTHER_CLIENT_ID = "0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f"
SECRET = "clusterbake-demo-gpu-join"
BUNDLE = '{"munge_key": "c2VjcmV0", "hosts": "10.0.0.4 head\\n"}'
ENVELOPE = join_envelope.pack(BUNDLE, 25 * 1024).inline  # what the provider publishes (join_envelope.py)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemo controller"


def load_program():
    return programs.load_program("clusterbake_node_boot_azure", PROGRAM)


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler, state):
        super().__init__(("127.0.0.1", 0), handler)
        self.state = state
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *args):
        pass

    def answer(self, status: int, body, headers: dict | None = None, content_type: str = "application/json"):
        data = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status: int, body, headers: dict | None = None):
        self.server.state["refused"].append(f"{self.command} {self.path}: {status} {body}")
        self.answer(status, body, headers)

    def do_POST(self):
        self.refuse(405, {"error": "Method not allowed"})

    do_PUT = do_POST


class Imds(Handler):
    """Azure's IMDS, as documented: header, api-version, paths."""

    def do_GET(self):
        state = self.server.state
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        state["imds"].append((url.path, query, self.headers.get("Metadata")))
        if self.headers.get("Metadata") != "true":
            return self.refuse(400, {"error": "Bad request. Required metadata header not specified"})
        if self.headers.get("X-Forwarded-For"):
            return self.refuse(400, {"error": "Bad request. Requests with X-Forwarded-For are refused"})
        if "api-version" not in query:
            return self.refuse(400, {"error": "Bad request. api-version was not specified in the request."})
        if url.path == "/metadata/instance":
            if query["api-version"] not in ("2021-01-01", "2021-02-01", "2021-05-01"):
                return self.refuse(400, {"error": "Bad request. api-version is invalid for this path"})
            compute = {
                "name": "cb-demo-gpu-3",
                "vmSize": "Standard_ND96isr_H100_v5",
                "osProfile": {"computerName": "cb-demo-gpu-3"},
                "tagsList": [{"name": k, "value": v} for k, v in state["tags"].items()],
                "tags": ";".join(f"{k}:{v}" for k, v in state["tags"].items()),
            }
            if state["user_data_in_document"]:
                compute["userData"] = state["user_data"]
            return self.answer(200, {"compute": compute, "network": {"interface": []}})
        if url.path == "/metadata/instance/compute/userData":
            if query["api-version"] < "2021-01-01" or query.get("format") != "text":
                return self.refuse(400, {"error": "Bad request. userData needs 2021-01-01 and format=text"})
            return self.answer(200, state["user_data"], content_type="text/plain")
        if url.path == "/metadata/identity/oauth2/token":
            if query["api-version"] != "2018-02-01":
                return self.refuse(400, {"error": "invalid_request", "error_description": "bad api-version"})
            if query.get("resource") != "https://vault.azure.net":
                return self.refuse(400, {"error": "invalid_resource", "error_description": "AADSTS500011"})
            client_id = query.get("client_id")
            if client_id not in state["identities"]:
                # What Azure answers when the VM has no identity with that client id (not a test's mistake).
                return self.answer(400, {"error": "invalid_request", "error_description": "Identity not found"})
            token = secrets.token_urlsafe(24)
            state["tokens"][token] = client_id
            return self.answer(
                200,
                {
                    "access_token": token,
                    "client_id": client_id,
                    "expires_in": "86399",
                    "expires_on": "4102444800",
                    "ext_expires_in": "86399",
                    "not_before": "1700000000",
                    "resource": "https://vault.azure.net",
                    "token_type": "Bearer",
                },
            )
        return self.refuse(404, {"error": "Not found"})


class Vault(Handler):
    """Key Vault's Get Secret, as documented: api-version, bearer token, 401/403/404 shapes."""

    def do_GET(self):
        state = self.server.state
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        state["vault"].append(url.path)
        if query.get("api-version") != "7.4":
            return self.refuse(400, {"error": {"code": "BadParameter", "message": "invalid API version"}})
        authorization = self.headers.get("Authorization", "")
        if not authorization:
            return self.refuse(
                401,
                {"error": {"code": "Unauthorized", "message": "AKV10000: Request is missing a Bearer or PoP token."}},
                {
                    "WWW-Authenticate": 'Bearer authorization="https://login.microsoftonline.com/t", resource="https://vault.azure.net"'
                },
            )
        client_id = (
            state["tokens"].get(authorization.removeprefix("Bearer ")) if authorization.startswith("Bearer ") else None
        )
        if client_id is None:
            return self.refuse(401, {"error": {"code": "Unauthorized", "message": "AKV10032: Invalid issuer."}})
        if len(parts) not in (2, 3) or parts[0] != "secrets":
            return self.refuse(404, {"error": {"code": "NotFound", "message": f"{url.path} is not a secret"}})
        state["gets"] += 1
        if state["grant_after"] is not None and state["gets"] > state["grant_after"]:
            state["readers"].add(client_id)
        if client_id not in state["readers"]:
            return self.answer(
                403,
                {
                    "error": {
                        "code": "Forbidden",
                        "message": "Caller is not authorized to perform action on resource.\r\n"
                        f"Caller: appid={client_id}\r\nAction: 'Microsoft.KeyVault/vaults/secrets/getSecret/action'",
                        "innererror": {"code": "ForbiddenByRbac"},
                    }
                },
            )
        if state["publish_after"] is not None and state["gets"] > state["publish_after"]:
            state["secrets"].setdefault(SECRET, ENVELOPE)
        if len(parts) == 3:
            return self.version(parts[1], parts[2])
        value = state["secrets"].get(parts[1])
        if parts[1] == SECRET and state["published_next"]:
            state["secrets"][SECRET] = state["published_next"].pop(0)  # the controller publishes right after
        if value is None:
            return self.answer(
                404,
                {
                    "error": {
                        "code": "SecretNotFound",
                        "message": f"A secret with (name/id) {parts[1]} was not found in this key vault.",
                    }
                },
            )
        return self.answer(
            200,
            {
                "value": value,
                "id": f"{state['vault_url']}/secrets/{parts[1]}/4387e9f3d6e14c459867679a90fd0f79",
                "attributes": {"enabled": True, "created": 1700000000, "updated": 1700000000},
            },
        )

    def version(self, name: str, version: str):
        """Get Secret of one version: 404 SecretNotFound if it has none such, 403 SecretDisabled if disabled."""
        found = self.server.state["versions"].get((name, version))
        if found is None:
            message = f"A secret with (name/id) {name}/{version} was not found in this key vault."
            return self.answer(404, {"error": {"code": "SecretNotFound", "message": message}})
        value, enabled = found
        if not enabled:
            error = {
                "code": "Forbidden",
                "message": "Operation get is not allowed on a disabled secret.",
                "innererror": {"code": "SecretDisabled"},
            }
            return self.answer(403, {"error": error})
        attributes = {"enabled": True, "created": 1700000000, "updated": 1700000000}
        return self.answer(200, {"value": value, "id": f"{self.server.state['vault_url']}/secrets/{name}/{version}",
                                 "attributes": attributes})  # fmt: skip


def join_part(**changes):
    join = {"cloud": "azure", "vault_url": "", "secret_name": SECRET, "client_id": CLIENT_ID}
    join.update(changes)
    return join


@pytest.fixture
def azure(tmp_path, monkeypatch):
    """The stand-ins, the program with this machine's side effects replaced, and what it did."""
    state = {
        "refused": [],
        "imds": [],
        "vault": [],
        "tokens": {},
        "identities": {CLIENT_ID},
        "readers": {CLIENT_ID},
        "secrets": {SECRET: ENVELOPE},
        "versions": {},  # (name, version) -> (value, enabled): the bundle's parts
        "published_next": [],  # the envelopes the controller publishes, one after each read of SECRET
        "tags": {"clusterbake-cluster": "demo", "clusterbake-nodegroup": "gpu", "clusterbake-name": "gpu-3"},
        "user_data_in_document": True,
        "gets": 0,
        "publish_after": None,
        "grant_after": None,
    }
    imds, vault = StandIn(Imds, state), StandIn(Vault, state)
    for server in (imds, vault):
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    state["vault_url"] = vault.url

    def set_user_data(join: dict | None, hostname: str = "gpu-3", raw: str | None = None):
        text = raw
        if text is None:
            text = user_data(cluster="demo", hostname=hostname, ssh_user="azureuser", authorized_keys=[KEY], join=join)
        state["user_data"] = base64.b64encode(text.encode()).decode()

    set_user_data(join_part(vault_url=vault.url))

    boot = load_program()
    done = {"hostname": [], "users": [], "host_keys": 0}
    monkeypatch.setattr(boot, "set_hostname", lambda name: done["hostname"].append(name))
    monkeypatch.setattr(boot, "host_keys", lambda: done.__setitem__("host_keys", done["host_keys"] + 1))
    monkeypatch.setattr(boot, "login_user", lambda name, keys, keys_dir: done["users"].append((name, keys, keys_dir)))
    monkeypatch.setattr(boot, "SOURCE", tmp_path / "etc" / "join-source.json")
    monkeypatch.setattr(boot, "BUNDLE", str(tmp_path / "etc" / "node-join.json"))
    joined = tmp_path / "joined"
    join_program = tmp_path / "clusterbake-node-join"
    join_program.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(joined)!r}, 'w').write(json.dumps({{'argv': sys.argv[1:], 'stdin': sys.stdin.read()}}))\n"
        "print('node-join: applied')\n"
    )
    join_program.chmod(0o755)
    monkeypatch.setattr(boot, "JOIN_PROGRAM", str(join_program))
    # Retries without the real waits; the waits' lengths stay as the program has them otherwise.
    monkeypatch.setattr(boot, "BACKOFF_FIRST", 0.01)
    monkeypatch.setattr(boot, "BACKOFF_MOST", 0.02)

    env = {
        "state": state,
        "boot": boot,
        "done": done,
        "imds_url": imds.url,
        "vault_url": vault.url,
        "joined": joined,
        "tmp": tmp_path,
        "set_user_data": set_user_data,
    }
    yield env
    for server in (imds, vault):
        server.shutdown()
        server.server_close()
    assert state["refused"] == [], "the program made requests Azure would refuse"


def run(azure, *argv: str) -> int:
    return azure["boot"].main([*argv, "--metadata-url", azure["imds_url"]])


def write_source(azure, **changes):
    source = azure["boot"].SOURCE
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(json.dumps(join_part(vault_url=azure["vault_url"], **changes)))


def request(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_stand_ins_refuse_what_azure_refuses(azure):
    """Not an echo: the requests the program must get right are refused when wrong."""
    imds, vault = azure["imds_url"], azure["vault_url"]
    instance = f"{imds}/metadata/instance?api-version=2021-02-01"
    assert request(instance)[0] == 400  # no Metadata header
    assert request(instance, {"Metadata": "true", "X-Forwarded-For": "10.0.0.9"})[0] == 400
    assert request(f"{imds}/metadata/instance", {"Metadata": "true"})[0] == 400  # no api-version
    token = f"{imds}/metadata/identity/oauth2/token?api-version=2018-02-01"
    assert (
        request(f"{token}&resource=https%3A%2F%2Fmanagement.azure.com&client_id={CLIENT_ID}", {"Metadata": "true"})[0]
        == 400
    )
    status, answer = request(
        f"{token}&resource=https%3A%2F%2Fvault.azure.net&client_id={CLIENT_ID}", {"Metadata": "true"}
    )
    assert status == 200 and answer["token_type"] == "Bearer"
    secret = f"{vault}/secrets/{SECRET}"
    assert request(f"{secret}?api-version=7.4")[0] == 401  # no token
    assert request(f"{secret}?api-version=7.4", {"Authorization": "Bearer forged"})[0] == 401
    assert request(secret, {"Authorization": f"Bearer {answer['access_token']}"})[0] == 400  # no api-version
    assert (
        request(f"{secret}?api-version=7.4", {"Authorization": f"Bearer {answer['access_token']}"})[1]["value"]
        == ENVELOPE
    )
    assert request(f"{secret}--1/0a1b?api-version=7.4", {"Authorization": f"Bearer {answer['access_token']}"})[0] == 404
    assert len(azure["state"]["refused"]) == 7
    azure["state"]["refused"].clear()


@pytest.mark.parametrize("in_document", [True, False], ids=["instance-document", "userData-endpoint"])
def test_identity_names_the_node_from_the_user_data_in_imds(azure, capsys, in_document):
    azure["state"]["user_data_in_document"] = in_document
    keys_dir = azure["tmp"] / "keys"
    assert run(azure, "identity", "--cloud", "azure", "--keys-dir", str(keys_dir)) == 0
    assert azure["done"]["hostname"] == ["gpu-3"]
    assert azure["done"]["host_keys"] == 1
    assert azure["done"]["users"] == [("azureuser", [KEY], keys_dir)]
    source = json.loads(azure["boot"].SOURCE.read_text())
    assert source == {"client_id": CLIENT_ID, "cloud": "azure", "secret_name": SECRET, "vault_url": azure["vault_url"]}
    assert "munge" not in azure["boot"].SOURCE.read_text()
    err = capsys.readouterr().err
    assert "VM cb-demo-gpu-3 (Standard_ND96isr_H100_v5) is gpu-3 of cluster demo" in err
    assert "differs" not in err
    paths = [path for path, _, _ in azure["state"]["imds"]]
    assert paths[0] == "/metadata/instance"
    assert ("/metadata/instance/compute/userData" in paths) is not in_document
    assert all(header == "true" for _, _, header in azure["state"]["imds"])
    assert azure["state"]["vault"] == []  # identity reads no secret


def test_identity_keeps_the_user_datas_name_over_a_disagreeing_tag(azure, capsys):
    azure["state"]["tags"]["clusterbake-name"] = "gpu-9"
    assert run(azure, "identity", "--cloud", "azure") == 0
    assert azure["done"]["hostname"] == ["gpu-3"]
    assert "tag clusterbake-name=gpu-9 differs from the user data's name gpu-3" in capsys.readouterr().err


@pytest.mark.parametrize("raw", ["#!/bin/sh\necho hi\n", ""], ids=["script", "none"])
def test_identity_without_a_clusterbake_part_does_nothing(azure, capsys, raw):
    azure["set_user_data"](None, raw=raw)
    assert run(azure, "identity", "--cloud", "azure") == 0
    assert azure["done"] == {"hostname": [], "users": [], "host_keys": 0}
    assert not azure["boot"].SOURCE.exists()
    assert "nothing to do" in capsys.readouterr().err


def test_fetch_hands_the_bundle_to_the_join_program(azure, capsys):
    write_source(azure)
    assert run(azure, "fetch", "--boot") == 0
    joined = json.loads(azure["joined"].read_text())
    assert joined == {"argv": ["--install", "--bundle", azure["boot"].BUNDLE, "--boot"], "stdin": BUNDLE}
    out, err = capsys.readouterr()
    assert "node-join: applied" in out
    assert f"joined from secret {SECRET} in {azure['vault_url']}" in err
    token_requests = [q for path, q, _ in azure["state"]["imds"] if path == "/metadata/identity/oauth2/token"]
    assert token_requests == [
        {"api-version": "2018-02-01", "resource": "https://vault.azure.net", "client_id": CLIENT_ID}
    ]
    assert azure["state"]["vault"] == [f"/secrets/{SECRET}"]


def split(state: dict, bundle: str, limit: int = 48) -> tuple[str, list[dict]]:
    """`bundle` as the provider publishes one that a secret does not hold (join_envelope.py, with a small
    limit): its parts as versions of secrets SECRET--1, --2, ...; returns the index and the parts."""
    packed = join_envelope.pack(bundle, limit)
    parts = []
    for number, chunk in enumerate(packed.chunks, start=1):
        part = {"name": f"{SECRET}--{number}", "version": secrets.token_hex(16)}
        state["versions"][(part["name"], part["version"])] = (chunk, True)
        parts.append(part)
    return packed.index(parts), parts


def test_fetch_puts_a_split_bundle_together_from_the_versions_its_envelope_names(azure, capsys):
    bundle = json.dumps({"files": [{"path": "/etc/hosts", "content_b64": secrets.token_urlsafe(300)}]})
    index, parts = split(azure["state"], bundle)
    assert len(parts) > 3
    azure["state"]["secrets"][SECRET] = index
    write_source(azure)
    assert run(azure, "fetch", "--boot") == 0
    assert json.loads(azure["joined"].read_text())["stdin"] == bundle
    assert azure["state"]["vault"] == [f"/secrets/{SECRET}"] + [f"/secrets/{p['name']}/{p['version']}" for p in parts]
    assert "changed while it was read" not in capsys.readouterr().err


def test_fetch_reads_the_envelope_again_when_a_newer_bundle_replaced_its_parts(azure, capsys):
    """The controller writes the new parts, then the index, then disables the old parts: a node that read
    the old index just before meets a disabled part, and reads the index again."""
    state = azure["state"]
    old_index, old_parts = split(state, json.dumps({"munge_key": "b2xk", "hosts": "10.0.0.4 head\n" * 9}))
    new_bundle = json.dumps({"munge_key": "bmV3", "hosts": "10.0.0.4 head\n" * 9})
    new_index, _ = split(state, new_bundle)
    for part in old_parts[1:]:
        state["versions"][(part["name"], part["version"])] = (
            state["versions"][(part["name"], part["version"])][0],
            False,
        )
    state["secrets"][SECRET] = old_index
    state["published_next"] = [new_index]
    write_source(azure)
    assert run(azure, "fetch") == 0
    assert json.loads(azure["joined"].read_text())["stdin"] == new_bundle
    err = capsys.readouterr().err
    assert "the join bundle changed while it was read" in err and "SecretDisabled" in err
    assert azure["state"]["vault"].count(f"/secrets/{SECRET}") == 2


def test_fetch_gives_up_on_a_bundle_whose_parts_stay_gone(azure, capsys, monkeypatch):
    monkeypatch.setattr(azure["boot"], "BACKOFF_FIRST", 0.01)
    index, parts = split(azure["state"], BUNDLE)
    azure["state"]["versions"].pop((parts[0]["name"], parts[0]["version"]))
    azure["state"]["secrets"][SECRET] = index
    write_source(azure)
    assert run(azure, "fetch") == 1
    err = capsys.readouterr().err
    assert f"the join bundle changed each time it was read ({azure['boot'].STALE_TRIES} times)" in err
    assert "SecretNotFound" in err and not azure["joined"].exists()


@pytest.mark.parametrize(
    ("published", "says"),
    [
        (BUNDLE, "not in format 2 (an envelope): it was published by a clusterbake of another release"),
        (ENVELOPE.replace('"sha256":"', '"sha256":"0'), "sha256 differs"),
        (ENVELOPE.replace('"data":"', '"data":"A'), "does not decode (gzip+base64)"),
        (ENVELOPE.replace("gzip+base64", "zstd+base64"), "encoding 'zstd+base64' is not gzip+base64"),
    ],
    ids=["plain-bundle", "digest", "data", "encoding"],
)
def test_fetch_refuses_what_is_not_a_whole_bundle(azure, capsys, published, says):
    """A plain bundle is an older release's (the node image and the controller ship together); a digest
    that differs, data that does not decode: nothing is handed to the join program."""
    azure["state"]["secrets"][SECRET] = published
    write_source(azure)
    assert run(azure, "fetch") == 1
    assert says in capsys.readouterr().err
    assert not azure["joined"].exists()


def test_fetch_waits_for_a_secret_not_published_yet(azure, capsys):
    azure["state"]["secrets"].clear()
    azure["state"]["publish_after"] = 3
    write_source(azure)
    assert run(azure, "fetch") == 0
    assert json.loads(azure["joined"].read_text())["stdin"] == BUNDLE
    assert azure["state"]["gets"] == 4
    err = capsys.readouterr().err
    assert f"waiting for the join bundle (secret {SECRET} in {azure['vault_url']}): not published yet" in err
    # One token for all the tries: it is kept until it nears expiry.
    assert sum(path == "/metadata/identity/oauth2/token" for path, _, _ in azure["state"]["imds"]) == 1


def test_fetch_gives_up_on_a_secret_never_published(azure, capsys, monkeypatch):
    azure["state"]["secrets"].clear()
    monkeypatch.setattr(azure["boot"], "PUBLISH_WAIT", 0.05)
    write_source(azure)
    assert run(azure, "fetch") == 1
    assert "was not published within" in capsys.readouterr().err
    assert not azure["joined"].exists()


def test_fetch_says_the_identity_may_not_read_the_secret(azure, capsys, monkeypatch):
    azure["state"]["readers"].clear()
    monkeypatch.setattr(azure["boot"], "AZURE_DENIED_GRACE", 0.05)
    write_source(azure)
    assert run(azure, "fetch", "--boot") == 1
    err = capsys.readouterr().err
    assert f"the managed identity {CLIENT_ID} may not read the join bundle (secret {SECRET}" in err
    assert "Forbidden (ForbiddenByRbac)" in err
    assert "Key Vault Secrets User" in err
    assert not azure["joined"].exists()
    assert azure["state"]["gets"] >= 2  # denied, retried for the grace (a new role assignment takes a while)


def test_fetch_rides_out_a_role_assignment_that_takes_effect_late(azure):
    azure["state"]["readers"].clear()
    azure["state"]["grant_after"] = 2
    write_source(azure)
    assert run(azure, "fetch") == 0
    assert json.loads(azure["joined"].read_text())["stdin"] == BUNDLE
    assert azure["state"]["gets"] == 3


def test_fetch_says_the_vm_lacks_the_identity(azure, capsys, monkeypatch):
    monkeypatch.setattr(azure["boot"], "IDENTITY_GRACE", 0.05)
    write_source(azure, client_id=OTHER_CLIENT_ID)
    assert run(azure, "fetch") == 1
    err = capsys.readouterr().err
    assert f"this VM has no user-assigned managed identity {OTHER_CLIENT_ID}" in err
    assert "invalid_request: Identity not found" in err
    assert azure["state"]["vault"] == []  # no token, no request to the vault
    assert not azure["joined"].exists()


def test_fetch_sends_no_token_over_plain_http_to_another_host(azure, capsys):
    source = azure["boot"].SOURCE
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(json.dumps(join_part(vault_url="http://demo.vault.azure.net")))
    assert run(azure, "fetch") == 1
    assert "must be https://<vault>.vault.azure.net" in capsys.readouterr().err
    assert azure["state"]["imds"] == [] and azure["state"]["vault"] == []


def test_aws_stays_the_default_cloud(azure, monkeypatch):
    """Without --cloud, identity reads EC2's instance metadata (the unit of an AWS image passes none)."""
    boot = azure["boot"]
    used = []

    class Ec2:
        def __init__(self, base):
            used.append(base)

        def user_data(self):
            return None

    monkeypatch.setattr(boot, "Metadata", Ec2)
    assert boot.main(["identity", "--metadata-url", azure["imds_url"]]) == 0
    assert used == [azure["imds_url"]]
    assert azure["state"]["imds"] == []


def test_the_role_picks_the_cloud_from_the_builders_group(tmp_path):
    """Role cloud_boot's default, argument spec, package list and identity unit for an aws and an azure builder."""
    role = REPO / "roles" / "cloud_boot"
    out = tmp_path / "out"
    plays = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {"ansible.builtin.import_role": {"name": "cloud_boot", "tasks_from": "os_vars"}},
                {
                    "ansible.builtin.validate_argument_spec": {
                        "argument_spec": "{{ (lookup('file', '%s') | from_yaml).argument_specs.install.options }}"
                        % (role / "meta" / "argument_specs.yml"),
                        "provided_arguments": {"cloud_boot_cloud": "{{ cloud_boot_cloud }}"},
                    }
                },
                {"ansible.builtin.file": {"path": f"{out}/{{{{ inventory_hostname }}}}", "state": "directory"}},
                {
                    "ansible.builtin.template": {
                        "src": str(role / "templates" / "clusterbake-node-identity.service.j2"),
                        "dest": f"{out}/{{{{ inventory_hostname }}}}/identity.service",
                        "mode": "0644",
                    }
                },
                {
                    "ansible.builtin.copy": {
                        "content": "{{ __cloud_boot_packages + __cloud_boot_cloud_packages[cloud_boot_cloud] }}",
                        "dest": f"{out}/{{{{ inventory_hostname }}}}/packages.json",
                        "mode": "0644",
                    }
                },
            ],
        }
    ]
    playbook = tmp_path / "cloud_boot.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False, width=300))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {"aws-builder": local, "azure-builder": local},
                    "children": {"aws": {"hosts": {"aws-builder": {}}}, "azure": {"hosts": {"azure-builder": {}}}},
                }
            }
        )
    )
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    env = playbook_env(tmp_path, fake_bin, tmp_path / "record.json")
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    unit = {host: (out / host / "identity.service").read_text() for host in ("aws-builder", "azure-builder")}
    assert "identity --cloud aws --keys-dir /etc/ssh/clusterbake_authorized_keys" in unit["aws-builder"]
    assert "identity --cloud azure --keys-dir /etc/ssh/clusterbake_authorized_keys" in unit["azure-builder"]
    packages = {
        host: json.loads((out / host / "packages.json").read_text()) for host in ("aws-builder", "azure-builder")
    }
    assert packages == {
        "aws-builder": ["hostname", "openssh-server", "nftables", "python3-boto3"],
        "azure-builder": ["hostname", "openssh-server", "nftables", "ca-certificates"],
    }
