"""TLS / mTLS contexts for the ``Shard.Session`` stream (client and test server).

The cluster dials, the shard never reaches back (docs/wire.md#shardsession-and-its-messages);
flags ``--tls-cert/--tls-key/--tls-ca`` as the Go binaries. Rules:

* no files -> plaintext (h2c);
* ``ca`` alone -> TLS that verifies the shard against ``ca`` (no client certificate);
* ``ca`` + ``cert`` + ``key`` -> mTLS; the shard checks the client certificate's
  ``bigfleet://cluster/<cluster_id>`` URI SAN (ADR-0048, the shard's business);
* ``cert`` without ``key`` (or the reverse), or a client pair without ``ca``, is a
  :class:`TLSConfigError` at startup, like the Go ``grpcutil.Validate``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


class TLSConfigError(ValueError):
    """Inconsistent or unreadable TLS file settings."""


@dataclass(frozen=True)
class TLSFiles:
    """Paths for the agent's TLS settings (all optional).

    Attributes:
        ca: PEM bundle that verifies the shard's certificate.
        cert: PEM client certificate (mTLS).
        key: PEM private key of ``cert``.
        server_name: overrides the name checked against the shard's certificate (SNI and
            hostname check); default is the host dialled.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def validate(self) -> None:
        """Raise :class:`TLSConfigError` for a partial set (see module rules)."""
        if bool(self.cert) != bool(self.key):
            raise TLSConfigError("tls: --tls-cert and --tls-key must be set together")
        if self.cert and not self.ca:
            raise TLSConfigError("tls: mTLS needs --tls-ca as well as --tls-cert/--tls-key")
        if self.server_name is not None and not self.server_name:
            raise TLSConfigError("tls: server name override must not be empty")

    @property
    def enabled(self) -> bool:
        """True when any TLS is configured."""
        return bool(self.ca)


def client_ssl_context(files: TLSFiles) -> ssl.SSLContext | None:
    """Build the client context for ``files`` (None for plaintext).

    Built from disk on every call, and the connector builds one per connect, so a rotated client
    certificate is picked up at the next reconnect (the Go code reloads on mtime).

    Returns:
        An SSLContext with TLS >= 1.3, ALPN ``h2``, hostname checking on, the CA loaded and,
        for mTLS, the client certificate chain loaded.

    Raises:
        TLSConfigError: partial settings, or a file that cannot be read/parsed.
    """
    files.validate()
    if not files.enabled:
        return None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
        if files.cert and files.key:
            ctx.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"tls: cannot load client TLS files: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # the Go reference's minimum too
    ctx.set_alpn_protocols(["h2"])
    return ctx


def server_ssl_context(
    cert: str, key: str, *, client_ca: str | None = None, require_client_cert: bool = True
) -> ssl.SSLContext:
    """Build a server context for the shard side (tests, simulation).

    Args:
        cert: PEM server certificate chain.
        key: PEM private key.
        client_ca: when set, client certificates are verified against it.
        require_client_cert: with ``client_ca``, reject clients without a certificate (mTLS).

    Raises:
        TLSConfigError: a file that cannot be read/parsed.
    """
    try:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        if client_ca:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"tls: cannot load server TLS files: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["h2"])
    return ctx
