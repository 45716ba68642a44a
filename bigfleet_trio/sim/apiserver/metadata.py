"""ObjectMeta validation as the apiserver does it: names (DNS-1123 subdomain, label, or a
path segment for RBAC objects), label keys and values, ownerReferences, and the JSON types of
metadata fields.

Pure functions; nothing here mutates its inputs.
"""

from __future__ import annotations

from typing import Any

from bigfleet_trio.kube.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
)

from .errors import field_cause

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    r"used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def validate_name(
    name: Any, *, label: bool = False, field: str = "metadata.name"
) -> list[dict[str, str]]:
    """Validate an object name.

    Args:
        name: the proposed name.
        label: True for kinds whose names must be DNS-1123 labels (namespaces), else subdomain.

    Returns:
        A list of StatusCause dicts; empty when valid.
    """
    if not isinstance(name, str) or not name:
        return [
            field_cause(
                "FieldValueRequired", field, "Required value: name or generateName is required"
            )
        ]
    if label:
        if not is_dns1123_label(name):
            msg = LABEL_MSG if len(name) <= 63 else "must be no more than 63 characters"
            return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": {msg}')]
        return []
    if len(name) > 253:
        return [
            field_cause(
                "FieldValueInvalid",
                field,
                f'Invalid value: "{name}": must be no more than 253 characters',
            )
        ]
    if not is_dns1123_subdomain(name):
        return [
            field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": {SUBDOMAIN_MSG}')
        ]
    return []




def validate_path_segment_name(name: Any, field: str = "metadata.name") -> list[dict[str, str]]:
    """Names of kinds that only need to be one URL path segment (RBAC objects: ``system:x``).

    Returns:
        StatusCause dicts; empty when valid.
    """
    if not isinstance(name, str) or not name:
        return validate_name(name, field=field)
    if name in (".", ".."):
        return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": may not be '
                            f"'{name}'")]
    for bad in ("/", "%"):
        if bad in name:
            return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": may not '
                                f"contain '{bad}'")]
    return []


def metadata_type_error(meta: dict[str, Any]) -> str | None:
    """A decode error message when ObjectMeta fields have the wrong JSON types (→ 400).

    None when every field has the right type.
    """
    for field in ("labels", "annotations"):
        m = meta.get(field)
        if m is None:
            continue
        if not isinstance(m, dict):
            return (
                f"json: cannot unmarshal {type(m).__name__} into Go struct field "
                f"ObjectMeta.metadata.{field} of type map[string]string"
            )
        for v in m.values():
            if not isinstance(v, str):
                return (
                    f"json: cannot unmarshal {type(v).__name__} into Go struct field "
                    f"ObjectMeta.metadata.{field} of type string"
                )
    for field in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        v = meta.get(field)
        if v is not None and not isinstance(v, str):
            return (
                f"json: cannot unmarshal {type(v).__name__} into Go struct field "
                f"ObjectMeta.metadata.{field} of type string"
            )
    fins = meta.get("finalizers")
    if fins is not None and (
        not isinstance(fins, list) or not all(isinstance(f, str) for f in fins)
    ):
        return (
            "json: cannot unmarshal into Go struct field ObjectMeta.metadata.finalizers "
            "of type []string"
        )
    refs = meta.get("ownerReferences")
    if refs is not None:
        if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
            return (
                "json: cannot unmarshal into Go struct field ObjectMeta.metadata.ownerReferences "
                "of type []v1.OwnerReference"
            )
        for r in refs:
            for f in ("apiVersion", "kind", "name", "uid"):
                if not isinstance(r.get(f, ""), str):
                    return (
                        "json: cannot unmarshal into Go struct field "
                        f"OwnerReference.metadata.ownerReferences.{f} of type string"
                    )
    return None


def validate_labels(meta: dict[str, Any]) -> list[dict[str, str]]:
    """Causes for label keys/values that are not valid Kubernetes label syntax."""
    causes = []
    for k, v in (meta.get("labels") or {}).items():
        if not is_qualified_name(k):
            causes.append(
                field_cause(
                    "FieldValueInvalid",
                    "metadata.labels",
                    f"Invalid value: \"{k}\": name part must consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character",
                )
            )
        if not is_label_value(v):
            causes.append(
                field_cause(
                    "FieldValueInvalid",
                    "metadata.labels",
                    f"Invalid value: \"{v}\": a valid label must be an empty string or "
                    "consist of alphanumeric characters, '-', '_' or '.', and must start and "
                    "end with an alphanumeric character",
                )
            )
    for r in meta.get("ownerReferences") or ():
        for f in ("apiVersion", "kind", "name", "uid"):
            if not r.get(f):
                causes.append(
                    field_cause(
                        "FieldValueRequired", f"metadata.ownerReferences.{f}", "Required value"
                    )
                )
    return causes
