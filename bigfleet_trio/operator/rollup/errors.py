"""The errors that keep a CapacityRequest out of the roll-up (each names the CR and field).

The operator reports an excluded CR (Event, log line, metric) instead of dropping its demand
silently (docs/deviations.md#2-roll-up-and-acknowledgement-operatorrollup-wiringpy-acknowledgepy).
"""

from __future__ import annotations

__all__ = ["CapacityRequestError", "InvalidCapacityRequest", "UnsupportedRequirement"]


class CapacityRequestError(ValueError):
    """A CapacityRequest that cannot contribute to the roll-up.

    Attributes:
        cr: "namespace/name" of the CR.
        field: the offending field path (e.g. ``spec.resources[cpu]``).
        message: what is wrong with it.
        reason: short machine-friendly reason (Event reason / metric label).
    """

    reason = "InvalidCapacityRequest"

    def __init__(self, cr: str, field_path: str, message: str) -> None:
        super().__init__(f"CapacityRequest {cr}: {field_path}: {message}")
        self.cr = cr
        self.field = field_path
        self.message = message


class UnsupportedRequirement(CapacityRequestError):
    """A requirement operator the wire cannot carry (Gt, Lt, "", anything else).

    Attributes:
        operator: the operator string as written in the CR.
    """

    reason = "UnsupportedRequirement"

    def __init__(self, cr: str, field_path: str, operator: object) -> None:
        super().__init__(
            cr,
            field_path,
            f"unsupported NodeSelectorOperator {operator!r} "
            "(only In, NotIn, Exists, DoesNotExist reach the roll-up)",
        )
        self.operator = operator


class InvalidCapacityRequest(CapacityRequestError):
    """A malformed field: bad quantity, negative resource, wrong type."""
