"""The differential test's machinery: run one corpus of HTTP requests against an apiserver,
normalise the answers, compare two runs and sort the differences against the allow-list.

Used by ``tests/realkube/test_sim_differential.py`` (the embedded apiserver against
kube-apiserver) and ``tests/test_kubediff.py`` (the pure parts, and the corpus against the sim).
The rules (what is ignored, how the allow-list is written) are docs/deviations.md, section
"The embedded API server against kube-apiserver".

Pure parts: :func:`normalise`, :func:`project`, :func:`compare`, :func:`parse_allowlist`,
:func:`classify`, :func:`substitute`. I/O: :class:`Runner` (one sync httpx client per
credential, requests sent in corpus order).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = [
    "ABSENT",
    "Allowed",
    "Case",
    "Difference",
    "Runner",
    "classify",
    "compare",
    "load_corpus",
    "normalise",
    "parse_allowlist",
    "project",
    "protobuf_envelope",
    "substitute",
]

ABSENT = "<absent>"
DEVIATIONS_SECTION = "The embedded API server against kube-apiserver"

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Kubernetes Time and MicroTime (and the offsets some servers write)
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_HASH = re.compile(r"([?&]hash=)[0-9A-Fa-f]+")
# keys whose values are the server's own: minted per object or per request
_SERVER_KEYS = {
    "uid": "<uid>",
    "resourceVersion": "<rv>",
    "continue": "<continue>",
    "token": "<token>",
    "message": "<message>",
}


# ---- the corpus ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One request of the corpus (tests/realkube/corpus.yaml documents the fields).

    Attributes:
        id: unique name; allow-list rows match it with globs.
        method, path: HTTP method and URL path (placeholders allowed, :func:`substitute`).
        query: query parameters.
        accept, content_type: request media types (content_type only with a body).
        body: JSON body (sent as JSON unless ``content_type`` says YAML), or None.
        credential: ``admin`` | ``none`` (no credentials) | ``bad-token`` | ``token:NAME``
            (the TokenRequest answer saved as NAME).
        save: remember the answer under this name for later placeholders.
        watch: number of watch events to read (the request is then a watch).
        projection: name of a :func:`project` projection, with ``select`` its argument.
        compare: False for set-up requests whose answer legitimately depends on the server
            (e.g. creating what one server has built in); still sent to both.
        retry_until: resend (set-up only) until this status, up to 30 s (a CRD being
            established on kube-apiserver).
        ignore: top-level keys of the normalised answer left out of the comparison, where the
            real server's own answer depends on timing (e.g. ``retry_after`` of an eviction
            while the disruption controller has not yet processed the budget).
        used_by: who sends this request in the project (documentation).
    """

    id: str
    method: str
    path: str
    query: Mapping[str, Any] = field(default_factory=dict)
    accept: str = "application/json"
    content_type: str = "application/json"
    body: Any = None
    credential: str = "admin"
    save: str | None = None
    watch: int = 0
    projection: str | None = None
    select: tuple[str, ...] = ()
    compare: bool = True
    retry_until: int | None = None
    ignore: tuple[str, ...] = ()
    used_by: str = ""


def load_corpus(path: Path, crds: Mapping[str, Any] | None = None) -> list[Case]:
    """Read the corpus YAML (a list of mappings); ``body_crd: NAME`` takes the body from
    ``crds`` (name → CRD document), ``body_base64`` is a binary body (kubectl's protobuf).

    Raises:
        ValueError: unknown field, duplicate id, or a ``body_crd`` not in ``crds``.
    """
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    known = set(Case.__dataclass_fields__) | {"body_crd", "body_base64"}
    out: list[Case] = []
    seen: set[str] = set()
    for entry in raw:
        unknown = set(entry) - known
        if unknown:
            raise ValueError(f"corpus case {entry.get('id')!r}: unknown fields {sorted(unknown)}")
        entry = dict(entry)
        if entry["id"] in seen:
            raise ValueError(f"corpus case {entry['id']!r} appears twice")
        seen.add(entry["id"])
        raw64 = entry.pop("body_base64", None)
        if raw64 is not None:
            entry["body"] = base64.b64decode(raw64)
        crd = entry.pop("body_crd", None)
        if crd is not None:
            if not crds or crd not in crds:
                raise ValueError(f"corpus case {entry['id']!r}: no CRD {crd!r}")
            entry["body"] = crds[crd]
        entry["select"] = tuple(entry.get("select") or ())
        entry["ignore"] = tuple(entry.get("ignore") or ())
        out.append(Case(**entry))
    return out


_PLACEHOLDER = re.compile(r"\{(uid|rv|name|token|continue):([A-Za-z0-9_-]+)\}")


def substitute(value: Any, saved: Mapping[str, Any]) -> Any:
    """Replace ``{uid:X}``, ``{rv:X}``, ``{name:X}``, ``{continue:X}``, ``{token:X}`` in
    every string of ``value`` with that field of the answer saved as X (raw, not normalised).

    Raises:
        KeyError: X was never saved, or its answer lacks the field.
    """
    if isinstance(value, str):
        def one(m: re.Match[str]) -> str:
            what, name = m.group(1), m.group(2)
            obj = saved[name]
            if what == "token":
                return str(obj["status"]["token"])
            if what == "continue":
                return str(obj["metadata"]["continue"])
            key = {"uid": "uid", "rv": "resourceVersion", "name": "name"}[what]
            return str(obj["metadata"][key])

        return _PLACEHOLDER.sub(one, value)
    if isinstance(value, Mapping):
        return {k: substitute(v, saved) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, saved) for v in value]
    return value


# ---- normalising one answer ----------------------------------------------------------------


def normalise(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The comparable form of one observed answer.

    ``answer`` holds ``status`` (int), ``content_type`` (header value or None),
    ``retry_after`` (header value or None), ``warnings`` (list of Warning header values),
    ``body`` (decoded JSON, text, or None) and, for watches, ``events`` (decoded lines).

    Kept: the status code, the media type without parameters, whether Retry-After and Warning
    headers were sent (their count, not their wording), the body's structure and values.
    Replaced by a marker: values of ``uid``, ``resourceVersion``, ``continue``, ``token`` and
    ``message`` keys; strings that are UUIDs or RFC 3339 times; ``hash=`` in URLs; generated
    names (``metadata.name`` of an object with ``generateName``: the prefix is kept). Error
    wording is the server's; the client reads ``reason`` and ``code``.

    Returns:
        ``{"status", "content_type", "retry_after", "warnings", "body"[, "events"]}``.
    """
    out: dict[str, Any] = {
        "status": answer.get("status"),
        "content_type": _media_type(answer.get("content_type")),
        "retry_after": answer.get("retry_after") is not None,
        "warnings": len(answer.get("warnings") or ()),
        "body": _norm(answer.get("body")),
    }
    if "events" in answer:
        out["events"] = [_norm(e) for e in answer["events"]]
    return out


def _media_type(value: str | None) -> str | None:
    if value is None:
        return None
    return value.split(";", 1)[0].strip().lower() or None


def _norm(value: Any) -> Any:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            marker = _SERVER_KEYS.get(k)
            if marker is not None and isinstance(v, str) and v:
                out[k] = marker
            else:
                out[k] = _norm(v)
        meta = out.get("metadata")
        if isinstance(meta, dict):
            prefix = meta.get("generateName")
            name = meta.get("name")
            if isinstance(prefix, str) and isinstance(name, str) and name.startswith(prefix):
                meta["name"] = prefix + "<generated>"
        return out
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, str):
        if _UUID.match(value):
            return "<uid>"
        if _TIME.match(value):
            return "<time>"
        return _HASH.sub(r"\1<hash>", value)
    return value


# ---- projections ---------------------------------------------------------------------------


def project(name: str | None, body: Any, select: Iterable[str]) -> Any:
    """Cut a large answer down to what the project relies on.

    Projections:
        ``None``: the body as is.
        ``paths``: ``{dotted.path: value}`` for each selected path (``<absent>`` if missing).
        ``discovery``: an aggregated discovery list (APIGroupDiscoveryList) as
            ``{"group/version/resource": {scope, kind, verbs, shortNames, categories,
            subresources}}`` for the selected ``group/version/resource`` keys.
        ``keys``: the sorted keys of the selected mapping path (``""`` = the body).
        ``table``: a meta.k8s.io Table as its column names and types and its rows' cells (Age
            cells masked as ``<age>``; select ``columns`` for the columns alone, where a
            controller of the real cluster writes what the cells show).

    Raises:
        ValueError: unknown projection name.
    """
    select = list(select)
    if name is None:
        return body
    if name == "paths":
        return {p: _at(body, p) for p in select}
    if name == "keys":
        out = {}
        for p in select or [""]:
            v = _at(body, p)
            out[p] = sorted(v) if isinstance(v, Mapping) else v
        return out
    if name == "discovery":
        found: dict[str, Any] = {}
        for group in (body or {}).get("items") or []:
            gname = (group.get("metadata") or {}).get("name") or ""
            for ver in group.get("versions") or []:
                for res in ver.get("resources") or []:
                    key = f"{gname}/{ver.get('version')}/{res.get('resource')}"
                    found[key] = {
                        "scope": res.get("scope"),
                        "kind": (res.get("responseKind") or {}).get("kind"),
                        "verbs": sorted(res.get("verbs") or []),
                        "shortNames": sorted(res.get("shortNames") or []),
                        "categories": sorted(res.get("categories") or []),
                        "subresources": {
                            s.get("subresource"): sorted(s.get("verbs") or [])
                            for s in res.get("subresources") or []
                        },
                    }
        return {k: found.get(k, ABSENT) for k in select}
    if name == "table":
        body = body or {}
        cols = body.get("columnDefinitions") or []
        # an Age cell is a duration the server computes when it answers ("0s", "1s")
        ages = {i for i, c in enumerate(cols) if c.get("name") == "Age" or c.get("type") == "date"}
        table: dict[str, Any] = {
            "kind": body.get("kind"),
            "columns": [(c.get("name"), c.get("type"), c.get("format") or "") for c in cols],
        }
        if "columns" not in select:
            table["rows"] = [[("<age>" if i in ages else v)
                              for i, v in enumerate(r.get("cells") or [])]
                             for r in body.get("rows") or []]
        return table
    raise ValueError(f"unknown projection {name!r}")


def _at(body: Any, path: str) -> Any:
    cur = body
    for part in [p for p in path.split(".") if p]:
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return ABSENT
    return cur


# ---- comparing two runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One place where the two answers to a case differ.

    ``where`` is a dotted path into the normalised answer (``status``, ``body.spec.x``,
    ``events.0.object.metadata.labels``; list indices are numbers); ``sim`` and ``real`` are
    the values there (``<absent>`` when one side has nothing at that path).
    """

    case: str
    where: str
    sim: Any
    real: Any

    def __str__(self) -> str:
        return (f"{self.case}: {self.where}: sim={_short(self.sim)} "
                f"kube-apiserver={_short(self.real)}")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def compare(case: str, sim: Any, real: Any, where: str = "") -> list[Difference]:
    """Differences between two normalised answers, at the shallowest path that differs.

    A key or list element present on one side only is one difference at its path; equal
    subtrees give none.
    """
    if isinstance(sim, Mapping) and isinstance(real, Mapping):
        out: list[Difference] = []
        for k in list(sim) + [k for k in real if k not in sim]:
            sub = f"{where}.{k}" if where else str(k)
            out += compare(case, sim.get(k, ABSENT), real.get(k, ABSENT), sub)
        return out
    if isinstance(sim, list) and isinstance(real, list):
        out = []
        for i in range(max(len(sim), len(real))):
            a = sim[i] if i < len(sim) else ABSENT
            b = real[i] if i < len(real) else ABSENT
            out += compare(case, a, b, f"{where}.{i}" if where else str(i))
        return out
    if sim == real:
        return []
    return [Difference(case, where, sim, real)]


# ---- the allow-list (a table in docs/deviations.md) ----------------------------------------


@dataclass(frozen=True)
class Allowed:
    """One row of the allow-list: case globs × path globs, with the reason.

    A difference is listed when its case matches one of ``cases`` and its path matches one of
    ``paths`` (``fnmatch`` globs: ``*`` also crosses dots).
    """

    row: int
    cases: tuple[str, ...]
    paths: tuple[str, ...]
    reason: str

    def matches(self, d: Difference) -> bool:
        return (any(fnmatch.fnmatchcase(d.case, c) for c in self.cases)
                and any(fnmatch.fnmatchcase(d.where, p) for p in self.paths))


def parse_allowlist(markdown: str, section: str = DEVIATIONS_SECTION) -> list[Allowed]:
    """The allow-list rows of the table in the ``## … {section}`` part of ``markdown``.

    The table's first two columns hold backticked globs (cases, then paths, several per cell
    allowed), the last column the reason. Header and separator rows are skipped.

    Raises:
        ValueError: no such section, no table in it, or a row without globs or reason.
    """
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("## ") and section in line), None)
    if start is None:
        raise ValueError(f"no section {section!r}")
    rows: list[Allowed] = []
    for n, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: ") or cells[0].lower() == "cases":
            continue
        cases = tuple(re.findall(r"`([^`]+)`", cells[0]))
        paths = tuple(re.findall(r"`([^`]+)`", cells[1])) if len(cells) > 1 else ()
        reason = cells[-1] if len(cells) > 2 else ""
        if not cases or not paths or not reason:
            raise ValueError(f"line {n}: an allow-list row needs case globs, path globs and "
                             f"a reason: {line!r}")
        rows.append(Allowed(n, cases, paths, reason))
    if not rows:
        raise ValueError(f"section {section!r} has no allow-list table")
    return rows


def classify(
    diffs: Iterable[Difference], allowed: Iterable[Allowed]
) -> tuple[list[Difference], list[Difference], list[Allowed]]:
    """Split ``diffs`` into (listed, unlisted) and name the allow-list rows nothing matched."""
    allowed = list(allowed)
    used: set[int] = set()
    listed: list[Difference] = []
    unlisted: list[Difference] = []
    for d in diffs:
        row = next((a for a in allowed if a.matches(d)), None)
        if row is None:
            unlisted.append(d)
        else:
            used.add(row.row)
            listed.append(d)
    return listed, unlisted, [a for a in allowed if a.row not in used]


# ---- running the corpus against one server -------------------------------------------------


@dataclass
class Target:
    """One apiserver: base URL and two TLS set-ups, the admin's (CA plus, when the admin is a
    client certificate, that certificate; ``admin_headers`` carries its bearer token when the
    admin is one) and an anonymous one (CA only) for requests with other credentials."""

    name: str
    url: str
    admin_verify: Any
    plain_verify: Any
    admin_headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_kubeconfig(cls, name: str, path: str) -> Target:
        """The target a kubeconfig describes (its current context).

        Raises:
            bigfleet_trio.kube.errors.KubeConfigError: unreadable kubeconfig or TLS material.
        """
        import dataclasses

        from bigfleet_trio.kube.config import load_kubeconfig

        cfg = load_kubeconfig(path)
        headers = {}
        token = cfg.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        https = cfg.server.startswith("https://")
        plain = dataclasses.replace(cfg, client_cert_file=None, client_cert_data=None,
                                    client_key_file=None, client_key_data=None, _ssl=None)
        return cls(name, cfg.server, cfg.ssl_context() if https else False,
                   plain.ssl_context() if https else False, headers)


class Runner:
    """Sends a corpus to one :class:`Target` in order and records the raw and normalised
    answers (``raw[case_id]`` decoded JSON, ``seen[case_id]`` :func:`normalise`\\ d and
    projected)."""

    def __init__(self, target: Target, *, timeout: float = 30.0) -> None:
        self.target = target
        self.timeout = timeout
        self.saved: dict[str, Any] = {}
        self.seen: dict[str, dict[str, Any]] = {}

    def run(self, cases: Iterable[Case]) -> dict[str, dict[str, Any]]:
        t = self.target
        admin = httpx.Client(base_url=t.url, verify=t.admin_verify, headers=t.admin_headers,
                             timeout=self.timeout, trust_env=False)
        # no client certificate: the apiserver takes a certificate before a bearer token
        plain = httpx.Client(base_url=t.url, verify=t.plain_verify, timeout=self.timeout,
                             trust_env=False)
        try:
            for case in cases:
                answer = self._send(admin, plain, case)
                if case.save:
                    self.saved[case.save] = answer.get("body")
                norm = normalise(answer)
                norm["body"] = project(case.projection, norm["body"], case.select)
                for key in case.ignore:
                    norm.pop(key, None)
                self.seen[case.id] = norm
        finally:
            admin.close()
            plain.close()
        return self.seen

    def _send(self, admin: httpx.Client, plain: httpx.Client, case: Case) -> dict[str, Any]:
        path = substitute(case.path, self.saved)
        query = substitute(dict(case.query), self.saved)
        body = substitute(case.body, self.saved)
        headers = {"Accept": case.accept}
        client = admin
        cred = substitute(case.credential, self.saved)
        if cred != "admin":
            client = plain
            if cred == "bad-token":
                headers["Authorization"] = "Bearer not-a-valid-token"
            elif cred.startswith("token:"):
                headers["Authorization"] = "Bearer " + cred.removeprefix("token:")
            elif cred != "none":
                raise ValueError(f"{case.id}: unknown credential {case.credential!r}")
        content: bytes | None = None
        if body is not None:
            headers["Content-Type"] = case.content_type
            if isinstance(body, bytes):
                content = body
            elif isinstance(body, str):
                content = body.encode()
            elif "yaml" in case.content_type:
                content = yaml.safe_dump(body).encode()
            else:
                content = json.dumps(body).encode()
        if case.watch:
            return self._watch(client, path, query, headers, case.watch)
        deadline = time.monotonic() + 30
        while True:
            r = client.request(case.method, path, params=query, headers=headers,
                               content=content)
            if (case.retry_until is None or r.status_code == case.retry_until
                    or time.monotonic() > deadline):
                break
            time.sleep(0.2)
        return _answer(r, r.content)

    def _watch(self, client: httpx.Client, path: str, query: Mapping[str, Any],
               headers: Mapping[str, str], n: int) -> dict[str, Any]:
        events: list[Any] = []
        with client.stream("GET", path, params=query, headers=headers,
                           timeout=httpx.Timeout(self.timeout, read=5.0)) as r:
            if r.status_code >= 300:
                return _answer(r, r.read())
            try:
                for line in r.iter_lines():
                    if line.strip():
                        events.append(json.loads(line))
                    if len(events) >= n:
                        break
            except httpx.ReadTimeout:
                pass  # fewer events than asked: the comparison shows it
            out = _answer(r, b"")
        out["events"] = events
        return out


def protobuf_envelope(data: bytes) -> dict[str, Any]:
    """``{"apiVersion", "kind"}`` of a Kubernetes protobuf answer (``k8s\\x00`` + Unknown),
    ``{"protobuf": "undecodable"}`` when it is not one."""
    from bigfleet_trio.sim.apiserver.protobuf import MAGIC, ProtobufError, fields

    try:
        if not data.startswith(MAGIC):
            raise ProtobufError("no magic")
        unknown = {n: v for n, _, v in fields(data[len(MAGIC):])}
        type_meta = {n: v for n, _, v in fields(unknown.get(1, b""))}
        return {"apiVersion": type_meta.get(1, b"").decode(),
                "kind": type_meta.get(2, b"").decode()}
    except (ProtobufError, UnicodeDecodeError, AttributeError):
        return {"protobuf": "undecodable"}


def _answer(r: httpx.Response, data: bytes) -> dict[str, Any]:
    body: Any = None
    if data and r.headers.get("content-type", "").startswith(
            "application/vnd.kubernetes.protobuf"):
        body = protobuf_envelope(data)
    elif data:
        try:
            body = json.loads(data)
        except ValueError:
            ctype = r.headers.get("content-type", "")
            body = (data.decode("utf-8", "replace") if ctype.startswith("text/")
                    else "<non-JSON body>")
    return {
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "retry_after": r.headers.get("retry-after"),
        "warnings": r.headers.get_list("warning"),
        "body": body,
    }
