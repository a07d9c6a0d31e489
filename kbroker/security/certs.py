"""A small local certificate authority (``cryptography``), for tests and ``scripts/run --secure``.

Files, all PEM (what ``ssl.keystore.type=PEM`` / ``ssl.truststore.type=PEM`` read):

- ``<dir>/ca.pem`` the CA certificate (a trust store), ``<dir>/ca-key.pem`` its key;
- ``<dir>/<name>.pem`` a leaf certificate, ``<dir>/<name>-key.pem`` its PKCS#8 key
  (encrypted when a password is given), and ``<dir>/<name>.keystore.pem`` both in one
  file (certificate chain, then key: an ``ssl.keystore.location``).

Keys are ECDSA P-256 (fast to make; every TLS stack takes them). Files are replaced
atomically (write + rename), so a broker re-reading them never sees half a file.
Thread safety: no shared state.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SANS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA certificate and its key, as files and as objects."""

    cert_path: Path
    key_path: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class IssuedCert:
    """A leaf certificate's files (see the module docstring)."""

    cert_path: Path
    key_path: Path
    keystore_path: Path
    ca_path: Path
    subject: str
    """The subject DN, RFC 2253 order (``CN=alice,OU=eng,O=kbroker``)."""


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _name(subject: str) -> x509.Name:
    """``"alice"`` -> CN=alice; ``"CN=alice,OU=eng,O=kbroker"`` as RFC 4514/2253 text."""
    if "=" not in subject:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return x509.Name.from_rfc4514_string(subject)


def _pem_key(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def make_ca(directory: Path, cn: str = "kbroker local CA", *, days: int = 3650) -> CertificateAuthority:
    """A new self-signed CA in ``directory`` (``ca.pem``, ``ca-key.pem``)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(cn)
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca = CertificateAuthority(directory / "ca.pem", directory / "ca-key.pem", cert, key)
    write_atomic(ca.cert_path, cert.public_bytes(serialization.Encoding.PEM))
    write_atomic(ca.key_path, _pem_key(key, None), 0o600)
    return ca


def load_ca(directory: Path) -> CertificateAuthority:
    """The CA :func:`make_ca` wrote in ``directory``."""
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca-key.pem'}: not an EC key")
    return CertificateAuthority(directory / "ca.pem", directory / "ca-key.pem", cert, key)


def issue(
    ca: CertificateAuthority,
    directory: Path,
    name: str,
    subject: str | None = None,
    sans: Iterable[str] = DEFAULT_SANS,
    *,
    server: bool = True,
    client: bool = True,
    key_password: str | None = None,
    days: int = 825,
) -> IssuedCert:
    """Sign a leaf certificate for ``subject`` (default ``CN=<name>``) and write its files.

    ``sans`` are DNS names or IP addresses; ``server``/``client`` choose the extended
    key usages (serverAuth, clientAuth); ``key_password`` encrypts the key files
    (``ssl.key.password``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject_name = _name(subject or name)
    alt: list[x509.GeneralName] = []
    for san in sans:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            alt.append(x509.DNSName(san))
    eku = ((ExtendedKeyUsageOID.SERVER_AUTH, server), (ExtendedKeyUsageOID.CLIENT_AUTH, client))
    usages = [oid for oid, wanted in eku if wanted]
    start, end = _validity(days)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject_name)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _pem_key(key, key_password)
    out = IssuedCert(
        directory / f"{name}.pem",
        directory / f"{name}-key.pem",
        directory / f"{name}.keystore.pem",
        ca.cert_path,
        subject_name.rfc4514_string(),
    )
    write_atomic(out.cert_path, cert_pem)
    write_atomic(out.key_path, key_pem, 0o600)
    write_atomic(out.keystore_path, cert_pem + key_pem, 0o600)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m kbroker.security.certs DIR NAME [--subject DN] [--san H]... [--client-only]
    [--key-password P]``: make the CA in DIR unless it is there, issue NAME, print the files."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kbroker.security.certs", description=main.__doc__)
    parser.add_argument("directory", type=Path, help="CA directory (ca.pem, ca-key.pem; made if missing)")
    parser.add_argument("name", help="file name stem of the certificate to issue")
    parser.add_argument("--subject", help="subject DN, e.g. CN=alice,OU=eng (default CN=<name>)")
    parser.add_argument("--san", action="append", help=f"DNS name or IP (repeatable; default {','.join(DEFAULT_SANS)})")
    parser.add_argument("--client-only", action="store_true", help="clientAuth usage only, no SANs by default")
    parser.add_argument("--key-password", help="encrypt the key (ssl.key.password / ssl_password)")
    args = parser.parse_args(argv)
    d: Path = args.directory
    ca = load_ca(d) if (d / "ca.pem").exists() else make_ca(d)
    sans = args.san if args.san is not None else (() if args.client_only else DEFAULT_SANS)
    out = issue(ca, d, args.name, args.subject, sans, server=not args.client_only, key_password=args.key_password)
    print(f"subject:  {out.subject}\ntrust:    {out.ca_path}\ncert:     {out.cert_path}")
    print(f"key:      {out.key_path}\nkeystore: {out.keystore_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
