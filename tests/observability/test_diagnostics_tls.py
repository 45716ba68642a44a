"""The diagnostics listener over TLS (docs/crds.md#diagnostics-tls): a certificate from files
(trustme) re-read on change, a self-signed one generated at start, a clear error for a bad pair,
plain HTTP refused on the TLS port, probes still plain. Real loopback sockets, real time."""

from __future__ import annotations

import io
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
import trustme

from bigfleet_trio import cli
from bigfleet_trio.config import PodControllerConfig
from bigfleet_trio.knobs import ConfigError, ConfigFileError
from bigfleet_trio.observability.events import (
    EventFeed,
    events_url,
    follow_events,
    token_may_travel,
)
from bigfleet_trio.observability.http import serve_observability
from bigfleet_trio.observability.tls import (
    ServingCertificate,
    TLSPlan,
    check_pair,
    client_context,
    plan_tls,
)


def _write_pair(ca: trustme.CA, directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    leaf = ca.issue_cert(*(names or ("127.0.0.1", "localhost")))
    (directory / "tls.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
    (directory / "tls.key").write_bytes(leaf.private_key_pem.bytes())
    return directory


def _ca_file(ca: trustme.CA, path: Path) -> str:
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@asynccontextmanager
async def _listener(tls: ServingCertificate | None, **kw: Any) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(partial(serve_observability, "127.0.0.1:0", tls=tls, **kw))
        assert isinstance(addr, str)
        try:
            yield addr
        finally:
            nursery.cancel_scope.cancel()


async def _peer_cert(addr: str, ctx: ssl.SSLContext) -> bytes:
    """The DER certificate the listener presents to a new connection."""
    host, port = addr.rsplit(":", 1)
    stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=ctx)
    try:
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True)
        assert der is not None
        return der
    finally:
        await stream.aclose()


async def _untrusted(addr: str) -> None:
    """A client trusting the system's CAs refuses the listener's certificate."""
    with pytest.raises(trio.BrokenResourceError) as err:
        await _peer_cert(addr, client_context())
    assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)


# ------------------------------------------------------------------------------ decisions (pure)


def test_plan_follows_the_settings() -> None:
    assert plan_tls(auth=False, plain_http=False, cert_dir=None).mode == "plain"
    assert plan_tls(auth=True, plain_http=False, cert_dir=None).mode == "self-signed"
    assert plan_tls(auth=True, plain_http=True, cert_dir=None).mode == "plain"
    files = plan_tls(auth=False, plain_http=False, cert_dir="/certs")
    assert files == TLSPlan("files", "/certs/tls.crt", "/certs/tls.key")
    named = plan_tls(auth=True, plain_http=False, cert_dir="/certs", cert_name="c.pem",
                     key_name="/keys/k.pem")
    assert (named.cert_file, named.key_file) == ("/certs/c.pem", "/keys/k.pem")


@pytest.mark.parametrize(("kw", "message"), [
    ({"metrics_plain_http": True, "metrics_addr": ":8080"},
     "--metrics-plain-http needs a loopback --metrics-addr"),
    ({"metrics_plain_http": True, "metrics_addr": "10.0.0.1:8080"},
     "--metrics-plain-http needs a loopback --metrics-addr"),
    ({"metrics_plain_http": True, "metrics_cert_path": "/certs"},
     "--metrics-plain-http contradicts --metrics-cert-path"),
    ({"metrics_cert_name": ""}, "--metrics-cert-name must not be empty"),
])
def test_usage_errors_name_the_flag(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        PodControllerConfig(metrics_auth=True, **kw).validate()
    assert not isinstance(err.value, ConfigFileError)  # exit 2, a usage error


def test_plain_http_opt_out_on_loopback_only() -> None:
    for addr in ("127.0.0.1:8080", "[::1]:8080", "localhost:8080"):
        cfg = PodControllerConfig(metrics_auth=True, metrics_plain_http=True, metrics_addr=addr)
        cfg.validate()
        assert cfg.metrics_tls().mode == "plain"


# ------------------------------------------------------------------------------ bad files


def test_bad_certificate_files_are_one_line_naming_the_flag(tmp_path: Path) -> None:
    ca, other = trustme.CA(), trustme.CA()
    good = _write_pair(ca, tmp_path / "good")
    with pytest.raises(ConfigFileError, match=r"^--metrics-cert-path: read certificate "
                       rf"{tmp_path}/missing/tls.crt: No such file or directory$"):
        check_pair(str(tmp_path / "missing/tls.crt"), str(good / "tls.key"))
    with pytest.raises(ConfigFileError, match=r"read private key .*/nokey: No such file"):
        check_pair(str(good / "tls.crt"), str(tmp_path / "nokey"))
    (tmp_path / "junk").write_text("not a certificate\n")
    with pytest.raises(ConfigFileError, match=r"junk holds no PEM certificate$"):
        check_pair(str(tmp_path / "junk"), str(good / "tls.key"))
    with pytest.raises(ConfigFileError, match=r"junk holds no PEM private key$"):
        check_pair(str(good / "tls.crt"), str(tmp_path / "junk"))
    stranger = _write_pair(other, tmp_path / "other")
    with pytest.raises(ConfigFileError, match=r"are not a pair: the private key does not match"):
        check_pair(str(good / "tls.crt"), str(stranger / "tls.key"))


def test_cli_exits_1_with_one_line_for_a_missing_cert_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file problem is exit 1 (the command line is fine; docs/reference.md#exit-codes), named
    before anything starts."""
    rc = cli.main(["pod-controller", "--metrics-auth", "--metrics-addr=:0",
                   f"--metrics-cert-path={tmp_path}/nope", f"--kubeconfig={tmp_path}/kc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err == [f"pod-controller: --metrics-cert-path: read certificate {tmp_path}/nope/"
                   "tls.crt: No such file or directory"]


def test_cli_exits_2_for_plain_http_on_every_interface(
    capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["pod-controller", "--metrics-auth", "--metrics-plain-http",
                   "--metrics-addr=:8080"])
    assert rc == 2
    assert "--metrics-plain-http needs a loopback --metrics-addr" in capsys.readouterr().err


# ------------------------------------------------------------------------------ serving


async def test_files_serve_https_and_refuse_plain_http(tmp_path: Path) -> None:
    ca = trustme.CA()
    certs = _write_pair(ca, tmp_path / "certs")
    tls = ServingCertificate(plan_tls(auth=False, plain_http=False, cert_dir=str(certs)))
    cafile = _ca_file(ca, tmp_path / "ca.pem")
    with trio.fail_after(20):
        async with _listener(tls) as addr:
            async with httpx.AsyncClient(verify=client_context(cafile)) as https:
                r = await https.get(f"https://{addr}/metrics")
                assert r.status_code == 200 and "python_info" in r.text
                assert (await https.get(f"https://{addr}/healthz")).text == "ok\n"
            # the system's trust store refuses the certificate
            await _untrusted(addr)
            # plain HTTP on the TLS port: no answer, the connection is dropped
            async with httpx.AsyncClient() as plain:
                with pytest.raises(httpx.TransportError):
                    await plain.get(f"http://{addr}/metrics")


async def test_self_signed_fallback_serves_tls() -> None:
    tls = ServingCertificate(plan_tls(auth=True, plain_http=False, cert_dir=None))
    assert tls.self_signed and len(tls.fingerprint.split(":")) == 32
    with trio.fail_after(20):
        async with _listener(tls) as addr:
            async with httpx.AsyncClient(verify=client_context(insecure=True)) as client:
                r = await client.get(f"https://{addr}/metrics")
                assert r.status_code == 200
            await _untrusted(addr)
    # a fresh key every start
    again = ServingCertificate(plan_tls(auth=True, plain_http=False, cert_dir=None))
    assert again.fingerprint != tls.fingerprint


async def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    """cert-manager renews into the mounted Secret: the next connection gets the new pair; a
    half-written or mismatched pair is refused, counted, and the current one stays."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("bigfleet_diagnostics_cert_reloads_total",
                                         {"result": "error"}) or 0.0

    first, second = trustme.CA(), trustme.CA()
    certs = _write_pair(first, tmp_path / "certs")
    tls = ServingCertificate(plan_tls(auth=True, plain_http=False, cert_dir=str(certs)))
    insecure = client_context(insecure=True)
    with trio.fail_after(20):
        async with _listener(tls) as addr:
            before = await _peer_cert(addr, insecure)
            assert tls.reload() is False  # unchanged files: nothing to do
            (certs / "tls.crt").write_bytes(second.issue_cert("127.0.0.1").cert_chain_pems[0]
                                            .bytes())  # the key still the old one
            failed = errors()
            assert tls.reload() is False
            assert errors() == failed + 1
            assert await _peer_cert(addr, insecure) == before
            _write_pair(second, certs)
            assert tls.reload() is True
            after = await _peer_cert(addr, insecure)
            assert after != before
            # verifiable against the new CA only
            new_ca = client_context(_ca_file(second, tmp_path / "second.pem"))
            assert await _peer_cert(addr, new_ca) == after


async def test_events_over_wss_with_the_ca_or_skip_verify(tmp_path: Path) -> None:
    ca = trustme.CA()
    tls = ServingCertificate(plan_tls(auth=False, plain_http=False,
                                      cert_dir=str(_write_pair(ca, tmp_path / "certs"))))
    feed = EventFeed()
    cafile = _ca_file(ca, tmp_path / "ca.pem")
    with trio.fail_after(20):
        async with _listener(tls, feed=feed) as addr:
            with pytest.raises(OSError, match=r"certificate verify failed.*"
                               r"--certificate-authority.*--insecure-skip-tls-verify"):
                await follow_events(f"https://{addr}", io.StringIO())
            with pytest.raises(OSError, match=rf"serve TLS .*\? use https://{addr}$"):
                await follow_events(addr, io.StringIO())
            for ctx in (client_context(cafile), client_context(insecure=True),
                        client_context(cafile, server_name="localhost")):
                out = io.StringIO()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(partial(follow_events, addr, out, max_events=1,
                                               tls=ctx))
                    while feed.statistics().subscribers == 0:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    feed.publish("rollup", needs=1)
                assert '"kind":"rollup"' in out.getvalue()
            with pytest.raises(OSError, match="certificate verify failed"):
                await follow_events(addr, io.StringIO(),
                                    tls=client_context(cafile, server_name="elsewhere.example"))


def test_events_sends_no_token_in_clear_text_across_a_network() -> None:
    assert token_may_travel(events_url("10.0.0.7:8770", tls=True))
    assert token_may_travel(events_url("https://agent.example:8770"))
    assert token_may_travel(events_url("127.0.0.1:8770"))  # kubectl port-forward
    assert token_may_travel(events_url("[::1]:8770"))
    assert not token_may_travel(events_url("10.0.0.7:8770"))
    assert not token_may_travel(events_url("http://agent.example:8770"))


def test_events_flags_build_the_client_context(tmp_path: Path) -> None:
    ns = cli.parse_args(["events", "--addr", "https://127.0.0.1:8770",
                         "--certificate-authority", str(tmp_path / "missing.pem")])
    with pytest.raises(ConfigFileError, match=r"certificate-authority: .*missing.pem"):
        cli.events_tls(ns.certificate_authority, ns.insecure_skip_tls_verify,
                       ns.tls_server_name)
    assert cli.events_tls(None, False, None) is None
    ctx = cli.events_tls(None, True, None)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE


async def test_pod_controller_metrics_https_probes_plain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The binary as shipped: --metrics-auth, no certificate given, probes on their own port.
    /metrics answers over HTTPS (401 without a token), never over HTTP; the kubelet's probes
    get plain HTTP."""
    import logging

    from bigfleet_trio.kube.config import load_kubeconfig
    from bigfleet_trio.podcontroller.app import serve_pod_controller
    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

    caplog.set_level(logging.INFO, logger="bigfleet_trio.observability.http")
    server = ApiServer()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve, server)
            kc = tmp_path / "kubeconfig"
            write_kubeconfig(url, str(kc))
            cfg = PodControllerConfig(kubeconfig=str(kc), metrics_addr="127.0.0.1:0",
                                      metrics_auth=True, health_probe_addr="127.0.0.1:0")
            cfg.validate()
            assert cfg.metrics_tls().mode == "self-signed"
            await nursery.start(serve_pod_controller, cfg, load_kubeconfig(str(kc)), None)
            listening = {getattr(r, "scheme", ""): str(getattr(r, "addr", ""))
                         for r in caplog.records if r.getMessage().startswith(
                             "diagnostics listening")}
            assert set(listening) == {"https", "http"}, listening
            metrics, probes = listening["https"], listening["http"]
            async with httpx.AsyncClient(verify=client_context(insecure=True)) as client:
                r = await client.get(f"https://{metrics}/metrics")
                assert r.status_code == 401
                with pytest.raises(httpx.TransportError):
                    await client.get(f"http://{metrics}/metrics")
                r = await client.get(f"http://{probes}/healthz")
                assert r.status_code == 200
                assert (await client.get(f"http://{probes}/metrics")).status_code == 404
            nursery.cancel_scope.cancel()


async def test_watch_rereads_the_files_every_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's own loop (not a test's reload()): a renewal lands within one interval."""
    async def inline(fn: Any, *args: Any, **_kw: Any) -> Any:
        return fn(*args)

    # The loop reads in a worker thread; under the autojump clock a thread lets virtual time
    # race ahead while it runs (on a loaded box the deadline fired before the read ended), so
    # the read runs inline here and the test's time is exact.
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    first, second = trustme.CA(), trustme.CA()
    certs = _write_pair(first, tmp_path / "certs")
    tls = ServingCertificate(plan_tls(auth=True, plain_http=False, cert_dir=str(certs)))
    before = tls.fingerprint
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(tls.watch, interval=10.0))
        await trio.sleep(25)  # two reads of unchanged files (t=10, t=20)
        assert tls.reloads == 0
        _write_pair(second, certs)
        await trio.sleep(10)  # the read at t=30 sees the renewal
        assert tls.reloads == 1
        nursery.cancel_scope.cancel()
    assert tls.fingerprint != before
    # a self-signed certificate has no files to watch
    self_signed = ServingCertificate(plan_tls(auth=True, plain_http=False, cert_dir=None))
    with trio.fail_after(1):
        await self_signed.watch(interval=1.0)


async def test_operator_metrics_and_events_https_probes_plain(tmp_path: Path) -> None:
    """The operator's listeners as it starts them: a certificate directory, /metrics and the
    /events WebSocket over TLS only (401 without a token, before any review), probes plain."""
    from bigfleet_trio.config import OperatorConfig
    from bigfleet_trio.operator.app import _start_diagnostics

    ca = trustme.CA()
    cfg = OperatorConfig(cluster_id="c1", shard_addr="127.0.0.1:1", metrics_auth=True,
                         metrics_addr="127.0.0.1:0", health_probe_addr="127.0.0.1:0",
                         metrics_cert_path=str(_write_pair(ca, tmp_path / "certs")))
    cfg.validate()
    cafile = _ca_file(ca, tmp_path / "ca.pem")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            client: Any = object()  # never asked: no token means 401 before any review
            metrics, probes = await _start_diagnostics(
                nursery, cfg, client, lambda: (True, ["ok"]), EventFeed())
            async with httpx.AsyncClient(verify=client_context(cafile)) as https:
                assert (await https.get(f"https://{metrics}/metrics")).status_code == 401
                with pytest.raises(httpx.TransportError):
                    await https.get(f"http://{metrics}/metrics")
                assert (await https.get(f"http://{probes}/readyz")).status_code == 200
            with pytest.raises(OSError, match="HTTP 401"):
                await follow_events(str(metrics), io.StringIO(), tls=client_context(cafile))
            nursery.cancel_scope.cancel()
