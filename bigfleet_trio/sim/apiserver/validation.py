"""Object validation: names (DNS-1123), CRD ``openAPIV3Schema`` (jsonschema Draft 4 after
rewriting the Kubernetes extensions), pruning of unknown fields and defaulting
(kube-testserver notes §2 "CRDs"; the apiserver's structural-schema rules).

Pure functions; nothing here mutates its inputs.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from .errors import field_cause

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

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


def validate_name(name: Any, *, label: bool = False, field: str = "metadata.name") -> list[dict[str, str]]:
    """Validate an object name.

    Args:
        name: the proposed name.
        label: True for kinds whose names must be DNS-1123 labels (namespaces), else subdomain.

    Returns:
        A list of StatusCause dicts; empty when valid.
    """
    if not isinstance(name, str) or not name:
        return [field_cause("FieldValueRequired", field, "Required value: name or generateName is required")]
    if label:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            msg = LABEL_MSG if len(name) <= 63 else "must be no more than 63 characters"
            return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": {msg}')]
        return []
    if len(name) > 253:
        return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": must be no more than 253 characters')]
    if not _DNS1123_SUBDOMAIN.match(name):
        return [field_cause("FieldValueInvalid", field, f'Invalid value: "{name}": {SUBDOMAIN_MSG}')]
    return []


def to_jsonschema(schema: Any) -> Any:
    """Rewrite a Kubernetes structural schema into plain JSON Schema (Draft 4).

    ``nullable: true`` adds ``null`` to the type; ``x-kubernetes-int-or-string`` becomes an
    ``anyOf`` of integer/string when no ``anyOf`` is given; vendor extensions are dropped.
    """
    if isinstance(schema, list):
        return [to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "default", "format", "example", "externalDocs"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: to_jsonschema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = to_jsonschema(value)
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    if schema.get("nullable") and "type" in out:
        t = out["type"]
        out["type"] = [*t, "null"] if isinstance(t, list) else [t, "null"]
    return out


def _path_str(path: list[Any]) -> str:
    s = ""
    for p in path:
        if isinstance(p, int):
            s += f"[{p}]"
        else:
            s += ("." if s else "") + str(p)
    return s


def _fmt_value(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return '"object"' if isinstance(v, dict) else '"array"'
    return str(v)


class SchemaValidator:
    """Validates, prunes and defaults objects against a CRD's ``openAPIV3Schema``.

    Args:
        schema: the ``openAPIV3Schema`` dict (structural schema).
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        js = to_jsonschema(schema)
        # metadata, apiVersion and kind are validated by the server itself.
        if isinstance(js, dict) and "properties" in js:
            js = dict(js)
            js["properties"] = {
                k: v for k, v in js["properties"].items() if k not in ("metadata", "apiVersion", "kind")
            }
        self._validator = jsonschema.Draft4Validator(js)

    def validate(self, obj: dict[str, Any]) -> list[dict[str, str]]:
        """Return StatusCauses for every schema violation (empty when valid)."""
        causes: list[dict[str, str]] = []
        seen: set[tuple[str, str]] = set()
        body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
        for err in sorted(self._validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path))):
            path = _path_str(list(err.absolute_path))
            if err.validator == "required":
                for prop in err.validator_value:
                    if isinstance(err.instance, dict) and prop not in err.instance:
                        field = f"{path}.{prop}" if path else prop
                        if ("req", field) not in seen:
                            seen.add(("req", field))
                            causes.append(field_cause("FieldValueRequired", field, "Required value"))
                continue
            if ("x", path) in seen:
                continue
            seen.add(("x", path))
            val = _fmt_value(err.instance)
            if err.validator == "enum":
                allowed = ", ".join(_fmt_value(v) for v in err.validator_value)
                causes.append(field_cause("FieldValueNotSupported", path, f"Unsupported value: {val}: supported values: {allowed}"))
            elif err.validator == "type":
                want = err.validator_value
                want = want[0] if isinstance(want, list) else want
                causes.append(field_cause("FieldValueTypeInvalid", path, f"Invalid value: {val}: {path} in body must be of type {want}: {val}"))
            elif err.validator == "pattern":
                causes.append(field_cause("FieldValueInvalid", path, f"Invalid value: {val}: {path} in body should match '{err.validator_value}'"))
            elif err.validator == "anyOf":
                causes.append(field_cause("FieldValueTypeInvalid", path, f"Invalid value: {val}: {path} in body must be of type integer or string: {val}"))
            else:
                causes.append(field_cause("FieldValueInvalid", path, f"Invalid value: {val}: {err.message}"))
        return causes

    def prune(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Drop fields unknown to the schema and apply defaults.

        Returns:
            ``(new_object, unknown_field_paths)``; ``metadata``/``apiVersion``/``kind`` are kept.
        """
        unknown: list[str] = []
        props = self.schema.get("properties") or {}
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if key in ("metadata", "apiVersion", "kind"):
                out[key] = value
            elif key in props:
                out[key] = _prune(value, props[key], key, unknown)
            elif self.schema.get("x-kubernetes-preserve-unknown-fields"):
                out[key] = value
            else:
                unknown.append(key)
        for key, sub in props.items():
            if key not in out and isinstance(sub, dict) and "default" in sub:
                out[key] = sub["default"]
        return out, unknown


def _prune(value: Any, schema: Any, path: str, unknown: list[str]) -> Any:
    if not isinstance(schema, dict):
        return value
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        if props is None and addl is None:
            if schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
                for key in value:
                    unknown.append(f"{path}.{key}")
                return {}
            return value
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if props is not None and key in props:
                out[key] = _prune(sub, props[key], f"{path}.{key}", unknown)
            elif isinstance(addl, dict):
                out[key] = _prune(sub, addl, f"{path}.{key}", unknown)
            elif addl is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                out[key] = sub
            else:
                unknown.append(f"{path}.{key}")
        for key, sub in (props or {}).items():
            if key not in out and isinstance(sub, dict) and "default" in sub:
                out[key] = sub["default"]
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [_prune(v, items, f"{path}[{i}]", unknown) for i, v in enumerate(value)]
        return value
    return value
