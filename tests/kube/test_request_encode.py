"""Request bodies: compact JSON, the stdlib's meaning for what orjson alone would refuse."""

from __future__ import annotations

import json

import pytest

from bigfleet_trio.kube.request import encode_json


@pytest.mark.parametrize("body", [
    {"metadata": {"name": "x", "labels": {"a": "b"}}, "spec": {"n": 1.5, "l": [None, True]}},
    {1: "int key", "s": "é\u2028"},
    {"beyond_64_bits": 2**70},
])
def test_encode_json_means_what_json_dumps_means(body: object) -> None:
    out = encode_json(body)
    assert isinstance(out, bytes)
    assert json.loads(out) == json.loads(json.dumps(body))


def test_encode_json_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(TypeError):
        encode_json({"x": object()})
