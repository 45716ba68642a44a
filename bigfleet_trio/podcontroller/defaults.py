"""PriorityClass -> penalty defaults (the ``--priority-class-defaults`` file).

The pod controller fills a CapacityRequest's penalties from the Pod's annotations, else from
its PriorityClass's entry in this YAML file, else leaves them absent. The file's shape::

    ml-research:
      interruptionPenalty: "8192"
      reclamationPenalty: "65536"
    batch-best-effort: {interruptionPenalty: "16", reclamationPenalty: "0"}

The file is validated completely at start; every problem is a
:class:`PriorityClassDefaultsError` whose message starts with ``priority-class-defaults:``.
Rules:

- The top level is a map from PriorityClass name (string) to a map (or null = no defaults).
- ``interruptionPenalty`` / ``reclamationPenalty`` must be quoted strings holding a Kubernetes
  quantity (dollars; negative and fractional accepted). An unquoted YAML number is rejected with
  a hint to quote it (the Go binary rejects it too, with a less helpful message).
- An empty string, null or a missing field means "no default" (absent).
- Any other key inside an entry is an error naming it (a misspelt ``interuptionPenalty`` would
  otherwise silently mean "no default"), with the nearest known key as a hint.
- An empty file means no defaults; so does no path at all.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from bigfleet_trio.quantity import Quantity, QuantityError

logger = logging.getLogger(__name__)

__all__ = [
    "PenaltyDefaults",
    "PriorityClassDefaults",
    "PriorityClassDefaultsError",
    "load_priority_class_defaults",
    "parse_priority_class_defaults",
]

_PREFIX = "priority-class-defaults: "
_FIELDS = (
    ("interruptionPenalty", "interruption_penalty"),
    ("reclamationPenalty", "reclamation_penalty"),
)
_KNOWN = tuple(key for key, _ in _FIELDS)


class PriorityClassDefaultsError(ValueError):
    """The defaults file is unreadable or invalid.

    The message always starts with ``priority-class-defaults:``.
    """


@dataclass(frozen=True)
class PenaltyDefaults:
    """Default penalties for one PriorityClass.

    Attributes:
        interruption_penalty: dollars, or None when the file gives none.
        reclamation_penalty: dollars, or None when the file gives none.
    """

    interruption_penalty: Quantity | None = None
    reclamation_penalty: Quantity | None = None


@dataclass(frozen=True)
class PriorityClassDefaults:
    """PriorityClass name -> :class:`PenaltyDefaults` (read-only).

    Attributes:
        classes: the entries, keyed by PriorityClass name.
    """

    classes: Mapping[str, PenaltyDefaults] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))

    def get(self, priority_class_name: str | None) -> PenaltyDefaults | None:
        """The defaults for ``priority_class_name``, or None (unknown class, or no name)."""
        if not priority_class_name:
            return None
        return self.classes.get(priority_class_name)

    def __len__(self) -> int:
        return len(self.classes)


def _parse_field(class_name: str, key: str, value: Any) -> Quantity | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str):
        raise PriorityClassDefaultsError(
            f'{_PREFIX}PriorityClass "{class_name}" {key}: must be a quoted string, got '
            f'{type(value).__name__} {value!r} (write {key}: "{value}")'
        )
    if value == "":
        return None
    try:
        return Quantity.parse(value)
    except QuantityError as exc:
        raise PriorityClassDefaultsError(
            f'{_PREFIX}PriorityClass "{class_name}" {key}: {value!r} is not a quantity: {exc}'
        ) from exc


def parse_priority_class_defaults(text: str) -> PriorityClassDefaults:
    """Parse and validate the defaults YAML text.

    Args:
        text: the YAML document (see the module docstring for the shape).

    Returns:
        The validated defaults; empty for an empty document.

    Raises:
        PriorityClassDefaultsError: the YAML does not parse or breaks a rule of the module
            docstring.
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PriorityClassDefaultsError(f"{_PREFIX}parse: {exc}") from exc
    if doc is None:
        return PriorityClassDefaults()
    if not isinstance(doc, dict):
        raise PriorityClassDefaultsError(
            f"{_PREFIX}the top level must be a map of PriorityClass name to "
            f"{{interruptionPenalty, reclamationPenalty}}, got {type(doc).__name__}"
        )
    classes: dict[str, PenaltyDefaults] = {}
    for name, entry in doc.items():
        if not isinstance(name, str) or not name:
            raise PriorityClassDefaultsError(
                f"{_PREFIX}PriorityClass names must be non-empty strings, got {name!r}"
            )
        if entry is None:
            classes[name] = PenaltyDefaults()
            continue
        if not isinstance(entry, dict):
            raise PriorityClassDefaultsError(
                f'{_PREFIX}PriorityClass "{name}": must be a map with interruptionPenalty and/or '
                f"reclamationPenalty, got {type(entry).__name__} {entry!r}"
            )
        unknown = sorted(str(k) for k in entry if k not in _KNOWN)
        if unknown:
            close = difflib.get_close_matches(unknown[0], _KNOWN, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PriorityClassDefaultsError(
                f'{_PREFIX}PriorityClass "{name}": unknown key '
                f"{', '.join(repr(k) for k in unknown)} (known: {', '.join(_KNOWN)}){hint}"
            )
        values = {attr: _parse_field(name, key, entry.get(key)) for key, attr in _FIELDS}
        classes[name] = PenaltyDefaults(**values)
    return PriorityClassDefaults(classes)


def load_priority_class_defaults(path: str | os.PathLike[str] | None) -> PriorityClassDefaults:
    """Load and validate the ``--priority-class-defaults`` file.

    Args:
        path: the file path; None or "" means no defaults file (empty defaults).

    Returns:
        The validated defaults.

    Raises:
        PriorityClassDefaultsError: the file cannot be read, or its content is invalid
            (see :func:`parse_priority_class_defaults`).
    """
    if path is None or os.fspath(path) == "":
        return PriorityClassDefaults()
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PriorityClassDefaultsError(f"{_PREFIX}read {os.fspath(path)}: {exc}") from exc
    defaults = parse_priority_class_defaults(text)
    logger.info("priority-class defaults loaded path=%s classes=%d", os.fspath(path), len(defaults))
    return defaults
