"""TLS of the diagnostics listener: the serving certificate from files (re-read when they change)
or self-signed at start, as controller-runtime serves secure metrics. docs/crds.md#diagnostics-tls.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from bigfleet_trio.knobs import ConfigError, ConfigFileError

__all__ = [
    "DEFAULT_CERT_NAME",
    "DEFAULT_KEY_NAME",
    "RELOAD_INTERVAL",
    "ServingCertificate",
    "TLSPlan",
    "check_pair",
    "client_context",
    "default_hosts",
    "fingerprint",
    "plan_tls",
    "self_signed_pem",
    "server_context",
    "serving_certificate",
]

log = logging.getLogger(__name__)

DEFAULT_CERT_NAME = "tls.crt"
DEFAULT_KEY_NAME = "tls.key"
"""The key names of a ``kubernetes.io/tls`` Secret (what cert-manager writes), as controller-runtime
defaults ``CertName``/``KeyName``."""

RELOAD_INTERVAL = 10.0
"""Seconds between two reads of the certificate files (controller-runtime's certwatcher polls at
the same period); a Secret volume update reaches the pod within the kubelet's sync period
(about a minute), so this adds at most 10 s to a rotation."""

CERT_FLAG = "--metrics-cert-path"


@dataclass(frozen=True)
class TLSPlan:
    """How the diagnostics listener speaks: ``mode`` is ``"files"`` (``cert_file``/``key_file``),
    ``"self-signed"`` or ``"plain"`` (HTTP)."""

    mode: str
    cert_file: str = ""
    key_file: str = ""


def plan_tls(*, auth: bool, plain_http: bool, cert_dir: str | None,
             cert_name: str = DEFAULT_CERT_NAME, key_name: str = DEFAULT_KEY_NAME) -> TLSPlan:
    """Decide the listener's transport from the settings (pure; docs/crds.md#diagnostics-tls).

    A certificate directory always means TLS; ``--metrics-auth`` means TLS (self-signed without a
    directory) unless ``--metrics-plain-http`` opts out (the settings allow that only on
    loopback); otherwise plain HTTP. A name in ``cert_dir`` may also be an absolute path.
    """
    if cert_dir:
        return TLSPlan("files", os.path.join(cert_dir, cert_name),
                       os.path.join(cert_dir, key_name))
    if auth and not plain_http:
        return TLSPlan("self-signed")
    return TLSPlan("plain")


# ------------------------------------------------------------------------------ certificates


def _read(path: str, what: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        what = f" {what}" if what else ""
        raise ConfigFileError(f"{flag}: read{what} {path}: {exc.strerror or exc}") from exc


def check_pair(cert_file: str, key_file: str, *, flag: str = CERT_FLAG) -> tuple[bytes, bytes]:
    """Read and check a PEM certificate (chain) and its private key.

    Returns:
        ``(cert_pem, key_pem)`` as read.

    Raises:
        ConfigFileError: one line naming ``flag`` and the file: unreadable, no PEM certificate,
            no (unencrypted) PEM private key, or a key that is not the certificate's.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    cert_pem = _read(cert_file, "certificate", flag)
    key_pem = _read(key_file, "private key", flag)
    try:
        certs = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigFileError(f"{flag}: {cert_file} holds no PEM certificate")
    try:
        key = load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        why = "is encrypted" if isinstance(exc, TypeError) else "holds no PEM private key"
        raise ConfigFileError(f"{flag}: {key_file} {why}") from exc

    def spki(k: object) -> bytes:
        return k.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)  # type: ignore[attr-defined,no-any-return]

    if spki(certs[0].public_key()) != spki(key.public_key()):
        raise ConfigFileError(
            f"{flag}: {cert_file} and {key_file} are not a pair: the private key does not "
            "match the certificate's public key")
    now = datetime.datetime.now(datetime.UTC)
    if certs[0].not_valid_after_utc < now:
        # Not fatal (a renewal may be on its way and is picked up on change), but loud: every
        # verifying scraper refuses it.
        log.warning("diagnostics TLS: the certificate in %s expired at %s", cert_file,
                    certs[0].not_valid_after_utc.isoformat(),
                    extra={"cert_file": cert_file})
    return cert_pem, key_pem


def self_signed_pem(hosts: Iterable[str] = (), *, days: int = 365) -> tuple[bytes, bytes]:
    """A fresh ECDSA P-256 key and a self-signed certificate for ``localhost``, loopback and
    ``hosts`` (names or IP addresses), valid ``days`` from an hour ago.

    Returns:
        ``(cert_pem, key_pem)``; the key is never written anywhere by this function.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in ("localhost", "127.0.0.1", "::1", *hosts):
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                            "bigfleet-trio diagnostics (self-signed)")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return cert.public_bytes(Encoding.PEM), key_pem


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the first certificate's DER, as ``openssl x509 -fingerprint -sha256`` shows."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode("ascii", "replace").split(
        "-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n")
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def server_context() -> ssl.SSLContext:
    """A server context with hypercorn's settings (TLS >= 1.2, no compression, ALPN h2 and
    HTTP/1.1) and no certificate yet."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def _load_pem(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``load_cert_chain`` from bytes. ssl only reads files: an anonymous memory file
    (``memfd_create``) keeps the key off any disk; elsewhere a private temporary directory,
    removed at once."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fds = [memfd("bigfleet-tls-cert"), memfd("bigfleet-tls-key")]
        try:
            for fd, data in zip(fds, (cert_pem, key_pem), strict=True):
                os.write(fd, data)
            ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="bigfleet-tls-") as tmp:  # pragma: no cover
        paths = [os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")]
        for path, data in zip(paths, (cert_pem, key_pem), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(paths[0], paths[1])


def _context_for(cert_pem: bytes, key_pem: bytes, what: str) -> ssl.SSLContext:
    ctx = server_context()
    try:
        _load_pem(ctx, cert_pem, key_pem)
    except ssl.SSLError as exc:  # check_pair passed, so rare (an unsupported key type)
        raise ConfigFileError(f"{CERT_FLAG}: {what}: {exc.reason or exc}") from exc
    return ctx


class ServingCertificate:
    """The listener's certificate: one ``ssl.SSLContext`` handed to the server, which gives
    every new connection the newest certificate (an SNI callback swaps in the context built
    from the last good read; connections already open keep theirs).

    Args:
        plan: ``"files"`` or ``"self-signed"`` (see :func:`plan_tls`).
        hosts: extra names/IPs for a self-signed certificate's SANs.

    Raises:
        ConfigFileError: the files are unreadable or not a pair (one line naming the flag).
        ConfigError: ``plan.mode`` is ``"plain"``.
    """

    def __init__(self, plan: TLSPlan, *, hosts: Iterable[str] = ()) -> None:
        if plan.mode not in ("files", "self-signed"):
            raise ConfigError(f"no certificate for a {plan.mode!r} listener")
        self.plan = plan
        if plan.mode == "files":
            cert_pem, key_pem = check_pair(plan.cert_file, plan.key_file)
            what = f"{plan.cert_file}, {plan.key_file}"
        else:
            cert_pem, key_pem = self_signed_pem(hosts)
            what = "self-signed"
        self._loaded = (cert_pem, key_pem)
        self._current = _context_for(cert_pem, key_pem, what)
        self.fingerprint = fingerprint(cert_pem)
        self.reloads = 0
        # The context the listener holds: same settings, its own certificate (so a handshake
        # that somehow skips the callback still succeeds), and the callback that hands over.
        self.context = _context_for(cert_pem, key_pem, what)
        self.context.sni_callback = self._pick

    @property
    def self_signed(self) -> bool:
        return self.plan.mode == "self-signed"

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
              ctx: ssl.SSLContext) -> None:
        # OpenSSL calls this for every ClientHello, with or without SNI (server_name None).
        if self._current is not ctx:
            conn.context = self._current
        return None

    def read_changed(self) -> tuple[bytes, bytes, ssl.SSLContext] | None:
        """Re-read the files (blocking I/O: call in a thread); a new context when their
        contents changed and form a good pair, else None.

        Raises:
            ConfigFileError: the files changed but are unreadable or not a pair (yet: a writer
                that replaces them one by one is caught between the two).
        """
        if self.plan.mode != "files":
            return None
        before = (_read(self.plan.cert_file, "certificate", CERT_FLAG),
                  _read(self.plan.key_file, "private key", CERT_FLAG))
        if before == self._loaded:
            return None
        cert_pem, key_pem = check_pair(self.plan.cert_file, self.plan.key_file)
        if (cert_pem, key_pem) != before:  # changed again while we read: next round
            return None
        return cert_pem, key_pem, _context_for(cert_pem, key_pem, self.plan.cert_file)

    def reload(self) -> bool:
        """Check the files once and switch to a changed pair (sync; tests and :meth:`watch`).

        Returns:
            True when a new certificate is now served.
        """
        return self._apply(self._read_logged())

    def _read_logged(self) -> tuple[bytes, bytes, ssl.SSLContext] | None | ConfigFileError:
        try:
            return self.read_changed()
        except ConfigFileError as exc:
            return exc

    def _apply(self, result: tuple[bytes, bytes, ssl.SSLContext] | None | ConfigFileError,
               ) -> bool:
        from bigfleet_trio.observability.metrics import DIAGNOSTICS_CERT_RELOADS

        if result is None:
            return False
        if isinstance(result, ConfigFileError):
            DIAGNOSTICS_CERT_RELOADS.labels("error").inc()
            log.warning("diagnostics TLS: keeping the current certificate: %s", result,
                        extra={"cert_file": self.plan.cert_file})
            return False
        cert_pem, key_pem, ctx = result
        self._loaded = (cert_pem, key_pem)
        self._current = ctx
        self.fingerprint = fingerprint(cert_pem)
        self.reloads += 1
        DIAGNOSTICS_CERT_RELOADS.labels("loaded").inc()
        log.info("diagnostics TLS: serving the changed certificate from %s",
                 self.plan.cert_file,
                 extra={"cert_file": self.plan.cert_file, "sha256": self.fingerprint})
        return True

    async def watch(self, interval: float = RELOAD_INTERVAL) -> None:
        """Re-read the files every ``interval`` seconds until cancelled (files only; a
        self-signed certificate returns at once). A bad read is a WARNING, counted, and the
        current certificate stays."""
        if self.plan.mode != "files":
            return
        while True:
            await trio.sleep(interval)
            self._apply(await trio.to_thread.run_sync(self._read_logged))


def default_hosts(bind_host: str) -> list[str]:
    """SANs of a self-signed certificate besides loopback: the host name and a concrete bind
    address (not ``0.0.0.0``/``::``)."""
    hosts = [socket.gethostname()]
    try:
        if bind_host and not ipaddress.ip_address(bind_host).is_unspecified:
            hosts.append(bind_host)
    except ValueError:
        hosts.append(bind_host)
    return hosts


def serving_certificate(plan: TLSPlan, addr: str) -> ServingCertificate | None:
    """The certificate for a listener on ``addr`` (``--metrics-addr``) under ``plan``; None for
    plain HTTP or a disabled listener (``"0"``).

    Raises:
        ConfigFileError: see :class:`ServingCertificate`.
    """
    if plan.mode == "plain" or addr.strip() == "0":
        return None
    host = addr.strip().rsplit(":", 1)[0].strip("[]")
    return ServingCertificate(plan, hosts=default_hosts(host))


# ------------------------------------------------------------------------------ the client side


class _ServerNameContext(ssl.SSLContext):
    """A client context that checks the server's certificate against ``server_name`` instead
    of the host dialled (``--tls-server-name``: a port-forward to 127.0.0.1 reaching a
    certificate issued for the Service's DNS name)."""

    server_name: str = ""

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
                 server_side: bool = False, server_hostname: str | bytes | None = None,
                 session: ssl.SSLSession | None = None) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side,
                                self.server_name or server_hostname, session)


def client_context(ca_file: str | None = None, *, insecure: bool = False,
                   server_name: str | None = None) -> ssl.SSLContext:
    """The client side of a diagnostics connection (``bigfleet-trio events``), kubectl's options.

    Args:
        ca_file: PEM bundle to trust (``--certificate-authority``); None: the system's.
        insecure: skip certificate verification (``--insecure-skip-tls-verify``; for a
            self-signed listener, the connection is encrypted but its peer unproven).
        server_name: name to verify the certificate against (``--tls-server-name``).

    Raises:
        ConfigFileError: ``ca_file`` unreadable or not PEM (``--certificate-authority: …``).
    """
    ctx = _ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if server_name:
        ctx.server_name = server_name
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_file:
        pem = _read(ca_file, "", "--certificate-authority").decode("ascii", "replace")
        try:
            ctx.load_verify_locations(cadata=pem)
        except ssl.SSLError as exc:
            raise ConfigFileError(f"--certificate-authority: {ca_file} holds no PEM "
                                  f"certificate ({exc.reason or exc})") from exc
    else:
        ctx.load_default_certs()
    return ctx
