"""The realkube tier's wait helper (tests/support/realkube.py ``until``): a timeout names what
the last check saw and the last exception a check raised, so a CI failure is diagnosable from
its output alone."""

from __future__ import annotations

import pytest
import trio

from tests.support.realkube import until


async def test_timeout_reports_what_the_last_check_saw(autojump_clock: trio.abc.Clock) -> None:
    calls = 0

    async def check() -> bool:
        nonlocal calls
        calls += 1
        return False

    with pytest.raises(pytest.fail.Exception) as failed:
        await until("4 web Pods", check, 5, logs=lambda: "--- logs",
                    status=lambda: f"{calls} checks")
    msg = str(failed.value)
    assert msg.startswith("timed out after 5 s waiting for 4 web Pods\n")
    assert f"\nlast check saw: {calls} checks\n" in msg
    assert "raised" not in msg
    assert msg.endswith("--- logs")


async def test_timeout_reports_the_exception_the_last_check_raised(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def check() -> bool:
        raise ConnectionError("apiserver restarting")

    with pytest.raises(pytest.fail.Exception) as failed:
        await until("the Lease", check, 5)
    assert "\nlast check raised: ConnectionError('apiserver restarting')\n" in str(failed.value)


async def test_a_check_that_passes_after_errors_returns(autojump_clock: trio.abc.Clock) -> None:
    results = iter([RuntimeError("down"), False, True])

    async def check() -> bool:
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    await until("it", check, 60)
    assert next(results, "exhausted") == "exhausted"  # returned on the first true check
