"""Kubernetes name syntax (apimachinery ``validation``): one copy for every part of the project.

The agent names objects (``un-<machine_id>``, ``cr-<pod uid>``), the embedded apiserver validates
names, label keys/values and selectors, and the simulated shard validates its catalog, all with
these rules. Whole-string matching (``fullmatch``): a pattern ending in ``$`` would also accept a
trailing newline, which the real apiserver refuses.
"""

from __future__ import annotations

import re

__all__ = [
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "LABEL_VALUE_MAX",
    "QUALIFIED_NAME_MAX",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_label_value",
    "is_qualified_name",
    "is_qualified_name_part",
]

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63  # the name part after an optional "<dns-subdomain>/" prefix
LABEL_VALUE_MAX = 63

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_dns1123_label(s: str) -> bool:
    """RFC 1123 label: lower-case alphanumerics and ``-``, alphanumeric at both ends, <= 63
    characters (namespace names)."""
    return len(s) <= DNS1123_LABEL_MAX and _DNS1123_LABEL.fullmatch(s) is not None


def is_dns1123_subdomain(s: str) -> bool:
    """RFC 1123 subdomain: dot-separated DNS-1123 labels, <= 253 characters (most object
    names, label-key prefixes)."""
    return len(s) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(s) is not None


def is_qualified_name_part(s: str) -> bool:
    """The name part of a qualified name: alphanumerics, ``-``, ``_``, ``.``, alphanumeric at
    both ends, 1-63 characters."""
    return len(s) <= QUALIFIED_NAME_MAX and _QUALIFIED_NAME_PART.fullmatch(s) is not None


def is_qualified_name(s: str) -> bool:
    """Label key / resource name: ``[<dns-subdomain>/]<name part>``."""
    prefix, slash, name = s.rpartition("/")
    if slash and not (prefix and is_dns1123_subdomain(prefix)):
        return False
    return is_qualified_name_part(name)


def is_label_value(s: str) -> bool:
    """Label value: empty, or a qualified name part (<= 63 characters)."""
    return s == "" or is_qualified_name_part(s)
