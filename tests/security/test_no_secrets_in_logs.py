"""No token or key material ever appears in logs, error messages or reprs.

The KubeClient is driven with a bearer token / basic credentials / client-key PEM through
failing requests of every kind (5xx, 401, 403, 429, transport error, watch error); every log
record (all loggers, DEBUG, with tracebacks formatted), every raised error's str/repr and the
reprs of the config objects are searched for the secrets.
"""

from __future__ import annotations

import logging
import traceback

import httpx
import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

TOKEN = "tok-SEKRET-9f8e7d6c5b4a"
PASSWORD = "pw-SEKRET-1234"
KEY_PEM = b"-----BEGIN PRIVATE KEY-----\nKEY-SEKRET-MATERIAL\n-----END PRIVATE KEY-----\n"
SECRETS = (TOKEN, PASSWORD, "KEY-SEKRET-MATERIAL", "SEKRET")


class Down(InProcessTransport):
    down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            await trio.lowlevel.checkpoint()
            raise httpx.ConnectError(f"connect failed: {request.headers!r}", request=request)
        return await super().handle_async_request(request)


def _formatted(records: list[logging.LogRecord]) -> str:
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    out = []
    for r in records:
        out.append(fmt.format(r))
        if r.exc_info:
            out.append("".join(traceback.format_exception(*r.exc_info)))
    return "\n".join(out)


def _assert_clean(text: str) -> None:
    for s in SECRETS:
        assert s not in text, f"secret {s!r} leaked: ...{text[max(0, text.find(s) - 200):][:400]}"


def test_config_reprs_hide_secrets() -> None:
    cfg = KubeConfig(server="https://k", token=TOKEN, password=PASSWORD, username="u",
                     client_key_data=KEY_PEM)
    _assert_clean(repr(cfg))
    _assert_clean(str(cfg))


@pytest.mark.parametrize("auth", ["token", "basic"])
async def test_failing_requests_never_log_credentials(
    auth: str, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = ApiServer()
    errors: list[BaseException] = []
    kw = {"token": TOKEN} if auth == "token" else {"username": "u", "password": PASSWORD}
    async with trio.open_nursery() as nursery:
        transport = Down(server.app, nursery)
        client = KubeClient(KubeConfig(server="http://apiserver", **kw), transport=transport)
        for code in (500, 401, 403, 429, 409, 404):
            server.faults.fail_next(10, code=code)
            try:
                with trio.fail_after(60):
                    await client.list(PODS, "default")
            except Exception as exc:  # noqa: BLE001 - we inspect every error
                errors.append(exc)
            server.faults.clear()
        transport.down = True
        for call in (client.list(CAPACITY_REQUESTS, "default"),
                     client.create(PODS, {"metadata": {"name": "p"}}, "default")):
            try:
                with trio.fail_after(60):
                    await call
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        transport.down = False
        server.faults.fail_next(3, code=500, verb="watch")
        try:
            with trio.fail_after(30):
                async for _ in client.watch(PODS, "default"):
                    break
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        nursery.cancel_scope.cancel()
    assert errors, "the faults produced no error at all"
    text = _formatted(caplog.records)
    text += "\n".join(f"{e!s} {e!r}" for e in errors)
    text += "\n".join("".join(traceback.format_exception(e)) for e in errors)
    _assert_clean(text)
