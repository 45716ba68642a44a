"""Shard transport defaults: 256 MiB message limit and HTTP/2 keepalive wiring into grpclib.

The Go reference dials with 256 MiB limits; grpclib offers keepalive only through the underscore
fields of its ``Configuration``. No network: the grpclib ``Channel`` is the real
class with only its socket dial replaced, so the test sees the configuration grpclib itself would
hand to the HTTP/2 protocol object that schedules the pings.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from grpclib.client import Channel

from bigfleet_trio.shard import grpc as shard_grpc
from bigfleet_trio.shard.grpc import MAX_MESSAGE_BYTES, GrpcConnector, LimitedProtoCodec
from bigfleet_trio.shard.tls import TLSFiles
from bigfleet_trio.shard.transport import StreamClosed

DEADLINE = 10.0


def test_max_message_bytes_is_256_mib_and_the_default_everywhere() -> None:
    assert MAX_MESSAGE_BYTES == 268_435_456  # 256 * 1024 * 1024
    assert LimitedProtoCodec().max_message_bytes == 268_435_456
    assert GrpcConnector("shard", 7443).max_message_bytes == 268_435_456


def test_keepalive_defaults_in_built_configuration() -> None:
    conf = GrpcConnector("shard", 7443)._config()
    # Above grpc-go's default enforcement MinTime (5 min) with room for jitter: an idle
    # downlink never earns a ping strike (docs/wire.md#keepalive-against-a-go-shard).
    assert conf._keepalive_time == 330.0
    assert conf._http2_min_sent_ping_interval_without_data == 330.0
    assert conf._keepalive_timeout == 20.0
    assert conf._keepalive_permit_without_calls is False
    assert conf.ssl_target_name_override is None


def test_keepalive_and_server_name_from_arguments_in_built_configuration() -> None:
    conf = GrpcConnector(
        "10.0.0.9",
        7443,
        tls=TLSFiles(ca="/ca.pem", server_name="shard.bigfleet.test"),
        keepalive_time=7.5,
        keepalive_timeout=3.0,
    )._config()
    assert (conf._keepalive_time, conf._keepalive_timeout) == (7.5, 3.0)
    # The configured interval is the real one: grpclib would otherwise hold pings to one per
    # 300 s (its own floor) whatever keepalive_time says.
    assert conf._http2_min_sent_ping_interval_without_data == 7.5
    assert conf.ssl_target_name_override == "shard.bigfleet.test"
    # None switches the pings off (grpclib's own client default)
    assert GrpcConnector("shard", 7443, keepalive_time=None)._config()._keepalive_time is None


async def test_keepalive_and_message_limit_reach_the_grpclib_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """connect() builds a real grpclib Channel; its client config and codec carry our values."""
    channels: list[Channel] = []
    protocols: list[Any] = []

    class RecordingChannel(Channel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            channels.append(self)

        async def _create_connection(self) -> Any:
            # What grpclib would attach to the socket; then fail the dial (no network).
            protocols.append(self._protocol_factory())
            raise ConnectionRefusedError(111, "Connection refused (test)")

    monkeypatch.setattr(shard_grpc, "Channel", RecordingChannel)
    connector = GrpcConnector(
        "127.0.0.1", 7443, keepalive_time=7.5, keepalive_timeout=3.0, max_message_bytes=4096
    )
    with trio.fail_after(DEADLINE):
        with pytest.raises(StreamClosed, match="connection error.*Connection refused"):
            async with connector.connect():
                pytest.fail("should not connect")

    [channel] = channels
    assert (channel._host, channel._port) == ("127.0.0.1", 7443)
    assert channel._config._keepalive_time == 7.5
    assert channel._config._keepalive_timeout == 3.0
    assert channel._config._keepalive_permit_without_calls is False
    [protocol] = protocols
    assert protocol.config is channel._config  # the object the HTTP/2 connection reads
    assert isinstance(channel._codec, LimitedProtoCodec)
    assert channel._codec.max_message_bytes == 4096


async def test_default_connector_channel_gets_330s_20s_and_256_mib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    channels: list[Channel] = []

    class RecordingChannel(Channel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            channels.append(self)

        async def _create_connection(self) -> Any:
            raise ConnectionRefusedError(111, "Connection refused (test)")

    monkeypatch.setattr(shard_grpc, "Channel", RecordingChannel)
    with trio.fail_after(DEADLINE):
        with pytest.raises(StreamClosed):
            async with GrpcConnector("127.0.0.1", 7443).connect():
                pytest.fail("should not connect")
    [channel] = channels
    assert (channel._config._keepalive_time, channel._config._keepalive_timeout) == (330.0, 20.0)
    assert isinstance(channel._codec, LimitedProtoCodec)
    assert channel._codec.max_message_bytes == 268_435_456


def test_operator_keepalive_flags_reach_the_connector() -> None:
    from bigfleet_trio import cli
    from bigfleet_trio.operator.app import _grpc_connector

    base = ["operator", "--cluster-id", "c1", "--shard-addr", "127.0.0.1:7443"]
    default = _grpc_connector(cli.operator_config(cli.parse_args(base)))
    assert isinstance(default, GrpcConnector)
    assert (default.keepalive_time, default.keepalive_timeout) == (330.0, 20.0)
    cfg = cli.operator_config(cli.parse_args(
        [*base, "--keepalive-time", "1s", "--keepalive-timeout", "500ms"]))
    tight = _grpc_connector(cfg)
    assert isinstance(tight, GrpcConnector)
    assert (tight.keepalive_time, tight.keepalive_timeout) == (1.0, 0.5)
    off = _grpc_connector(cli.operator_config(cli.parse_args([*base, "--keepalive-time", "0"])))
    assert isinstance(off, GrpcConnector) and off.keepalive_time is None
