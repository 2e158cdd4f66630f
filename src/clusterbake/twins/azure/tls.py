"""The twin's TLS: a CA of its own and one server certificate for every name it answers as.

The Azure SDK sends bearer tokens over https only (azure-core's BearerTokenCredentialPolicy
refuses http), so the twin speaks TLS like Azure does. Clients trust the twin's CA through
the standard `REQUESTS_CA_BUNDLE` (requests, under azure-core, reads it); nothing in
clusterbake disables verification. The server certificate names 127.0.0.1, localhost,
management.azure.com, *.vault.azure.net, *.blob.core.windows.net and *.blob.storage.azure.net
(Key Vault's, Blob Storage's and boot diagnostics' data planes are reached at their real URLs
through the twin's CONNECT proxy, see arm.py, and Key Vault and Blob Storage by the nodes at the
twin's address, which the twin's DNS gives those names).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DNS_NAMES = (
    "localhost",
    "management.azure.com",
    "*.vault.azure.net",
    "*.blob.core.windows.net",
    "*.blob.storage.azure.net",  # boot diagnostics' managed storage
    "prices.azure.com",
)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _names_all(cert_path: Path) -> bool:
    """Whether the server certificate names every name of DNS_NAMES (one made before a name was added does not)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    return set(DNS_NAMES) <= set(names)


def make_certificates(directory: Path, extra_ips: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate chain, server key) in `directory`, made once."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    if ca_path.exists() and cert_path.exists() and key_path.exists() and _names_all(cert_path):
        return ca_path, cert_path, key_path
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("clusterbake azure twin CA"))
        .issuer_name(_name("clusterbake azure twin CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(n) for n in DNS_NAMES]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", *extra_ips)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("clusterbake azure twin"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_path, key_path)
    return context
