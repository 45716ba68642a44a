"""``find_in_group``: the start-up error the CLI prints, found inside Trio's exception groups."""

from __future__ import annotations

from bigfleet_trio.excgroups import find_in_group


class Boom(Exception):
    pass


def test_the_exception_itself() -> None:
    e = OSError("port in use")
    assert find_in_group(e, OSError) is e
    assert find_in_group(Boom(), OSError) is None


def test_nested_groups_depth_first_in_order() -> None:
    first, second = Boom("first"), Boom("second")
    group = BaseExceptionGroup(
        "outer", [ValueError("x"), ExceptionGroup("inner", [first]), second]
    )
    assert find_in_group(group, Boom) is first
    assert find_in_group(group, (KeyError, ValueError)) is group.exceptions[0]
    assert find_in_group(group, KeyError) is None


def test_tuple_of_types_and_base_exceptions() -> None:
    leaf = KeyboardInterrupt()
    group = BaseExceptionGroup("g", [BaseExceptionGroup("h", [leaf])])
    assert find_in_group(group, (OSError, KeyboardInterrupt)) is leaf
