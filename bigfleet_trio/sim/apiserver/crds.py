"""CustomResourceDefinitions in the embedded apiserver: accepting a CRD (the resource type it
declares and the status the apiextensions server writes) and reading CRD manifests.

Pure apart from :func:`default_crd_text` (reads the packaged manifest); :mod:`.state` registers
and unregisters the resulting types.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import yaml

from . import errors as E
from .objects import now_rfc3339
from .resources import ResourceType, resource_from_crd

CRD_GROUP = "apiextensions.k8s.io"


@functools.lru_cache(maxsize=16)
def parse_yaml_docs(text: str) -> list[Any]:
    """Parse multi-document YAML once (C loader when available); callers deep-copy."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return list(yaml.load_all(text, Loader=loader))


@functools.lru_cache(maxsize=1)
def default_crd_text() -> str:
    """The project's CRDs as multi-document YAML (JSON documents), read once per process
    through :func:`bigfleet_trio.install.load_crds`, so ``install-crds`` and the sim install
    the same files wherever they live."""
    from bigfleet_trio.install import load_crds

    return "\n---\n".join(json.dumps(doc) for doc in load_crds())


def _invalid(name: str, field: str, reason: str, message: str) -> E.ApiError:
    return E.invalid(
        "CustomResourceDefinition", CRD_GROUP, name, [E.field_cause(reason, field, message)]
    )


def accept_crd(crd: dict[str, Any]) -> tuple[dict[str, Any], ResourceType]:
    """Validate a CRD and return (the CRD with NamesAccepted/Established status, its type).

    A CRD is established at once: there is no asynchronous naming controller here.

    Raises:
        ApiError: 422 when names/group/versions are missing, the schema does not compile or
            ``metadata.name`` is not ``<plural>.<group>``.
    """
    name = crd["metadata"].get("name", "")
    try:
        res = resource_from_crd(crd)
    except ValueError as exc:
        raise _invalid(name, "spec", "FieldValueRequired", f"Required value: {exc}") from None
    except Exception as exc:  # bad schema
        raise _invalid(
            name,
            "spec.versions[0].schema.openAPIV3Schema",
            "FieldValueInvalid",
            f"Invalid value: {exc}",
        ) from None
    if name != f"{res.plural}.{res.group}":
        raise _invalid(
            name,
            "metadata.name",
            "FieldValueInvalid",
            f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
        )
    t = now_rfc3339()
    names = dict(crd["spec"]["names"])
    names.setdefault("singular", res.singular)
    names.setdefault("listKind", res.list_kind)
    crd = dict(crd)
    crd["status"] = {
        "acceptedNames": names,
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": t,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": t,
            },
        ],
        "storedVersions": [res.version],
    }
    return crd, res
