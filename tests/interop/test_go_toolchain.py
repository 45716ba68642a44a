"""The interop tier's one gate: a Go toolchain to build the peer (docs/wire.md#go-interop)."""

from __future__ import annotations

import pytest

from tests.interop._peer import GO, NO_GO, REQUIRE_GO

pytestmark = pytest.mark.interop


@pytest.mark.skipif(GO is None and not REQUIRE_GO, reason=NO_GO)
def test_go_toolchain_present() -> None:
    assert GO is not None, NO_GO
