"""Certificates and keys for a loopback control plane: one CA, the apiserver's serving
certificate, a ``system:masters`` admin client certificate, and the ServiceAccount signing key.

Written as PEM files into one directory (:func:`write_pki`); nothing leaves it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "write_pki"]


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files :func:`write_pki` wrote."""

    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path  # RSA private key: signs ServiceAccount tokens (apiserver + controller-manager)
    sa_pub: Path


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_pki(directory: Path) -> Pki:
    """Write a fresh CA, serving and admin certificates and the SA key pair into ``directory``.

    Valid from one hour ago (clock skew) for one year. The serving certificate names
    127.0.0.1, ::1 and localhost, plus the in-cluster names of the ``kubernetes`` Service."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    until = now + dt.timedelta(days=365)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("bigfleet-trio-realkube-ca")
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(subject: x509.Name, usage: x509.ObjectIdentifier,
             sans: list[x509.GeneralName] | None) -> tuple[x509.Certificate, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()), _key_pem(key)

    serving, serving_key = leaf(_name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),  # first IP of the service range
        *(x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                     "kubernetes.default.svc")),
    ])
    admin, admin_key = leaf(_name("realkube-admin", "system:masters"),
                            ExtendedKeyUsageOID.CLIENT_AUTH, None)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = serialization.Encoding.PEM
    pki = Pki(directory / "ca.crt", directory / "ca.key", directory / "apiserver.crt",
              directory / "apiserver.key", directory / "admin.crt", directory / "admin.key",
              directory / "sa.key", directory / "sa.pub")
    pki.ca_crt.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_crt.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(serving_key)
    pki.admin_crt.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(admin_key)
    pki.sa_key.write_bytes(_key_pem(sa))
    pki.sa_pub.write_bytes(sa.public_key().public_bytes(
        pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    for p in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_key):
        p.chmod(0o600)
    return pki
