"""The repository explains itself: doc references resolve, and nothing cites files users never get.

(a) every ``docs/<file>.md`` or ``docs/<file>.md#<anchor>`` written anywhere in the scanned files
(:data:`SCANNED_DIRS`, :data:`SCANNED_FILES`) names an existing file and, if given, an existing
heading anchor (GitHub slug rules, see :func:`github_slugs`).
(b) no scanned file cites a path outside the repository, a spec or note file, a section of the
reference notes or an issue number (:data:`FORBIDDEN`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED_DIRS = ("bigfleet_trio", "tests", "scripts", "docs", "config", "proto")
SCANNED_FILES = (
    "README.md",
    "CONTRIBUTING.md",
    "BENCHMARKS.md",
    "FAULTS.md",
    "Dockerfile",
    "pyproject.toml",
)
TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".txt",
    ".toml",
    ".yaml",
    ".yml",
    ".cfg",
    ".ini",
    ".sh",
    ".proto",
    "",
}

DOC_REF = re.compile(r"docs/([A-Za-z0-9_.-]+?\.md)(?:#([A-Za-z0-9_-]+))?")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _files(*, include_generated: bool = False) -> Iterator[Path]:
    for name in SCANNED_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or "/fixtures/" in rel:
                continue
            if not include_generated and "/proto/" in rel and path.name.endswith("_pb2.py"):
                continue
            yield path
    for name in SCANNED_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name


def _slug(text: str) -> str:
    """GitHub's heading anchor: lower-case, drop punctuation except ``-``/``_``, spaces to ``-``."""
    text = re.sub(r"`|\*\*|__", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def github_slugs(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown document, with GitHub's ``-1``, ``-2`` de-duplication.

    Headings inside fenced code blocks are not headings. Explicit ``<a id="x">`` / ``<a name="x">``
    anchors count too.
    """
    seen: dict[str, int] = {}
    slugs: set[str] = set()
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in re.finditer(r"<a\s+(?:id|name)=\"([^\"]+)\"", line):
            slugs.add(m.group(1))
        h = HEADING.match(line)
        if not h:
            continue
        base = _slug(h.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        slugs.add(base if n == 0 else f"{base}-{n}")
    return slugs


def test_slug_rules() -> None:
    md = "# A `code` Title, here!\n## Roll-up (every 10 s)\n## Roll-up (every 10 s)\n"
    md += "```\n# no\n```\n"
    assert github_slugs(md) == {"a-code-title-here", "roll-up-every-10-s", "roll-up-every-10-s-1"}


def test_every_doc_reference_resolves() -> None:
    anchors: dict[str, set[str]] = {}
    broken: list[str] = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in DOC_REF.finditer(line):
                name, anchor = m.group(1), m.group(2)
                where = f"{path.relative_to(ROOT)}:{lineno}: docs/{name}"
                target = ROOT / "docs" / name
                if not target.is_file():
                    broken.append(f"{where} (no such file)")
                    continue
                if anchor is None:
                    continue
                if name not in anchors:
                    anchors[name] = github_slugs(target.read_text(encoding="utf-8"))
                if anchor not in anchors[name]:
                    broken.append(f"{where}#{anchor} (no such heading)")
    broken += _broken_relative_links(anchors)
    assert not broken, "broken doc references:\n" + "\n".join(broken)


MD_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]*?)(?:#([^)\s]+))?\)")


def _broken_relative_links(anchors: dict[str, set[str]]) -> list[str]:
    """Markdown links ``[text](file.md#anchor)`` / ``(#anchor)`` in docs/ and the root documents."""
    broken: list[str] = []
    roots = [ROOT / n for n in SCANNED_FILES if n.endswith(".md")]
    docs = sorted((ROOT / "docs").rglob("*.md")) + roots
    for path in docs:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        in_fence = False
        for lineno, line in enumerate(text.splitlines(), 1):
            if FENCE.match(line):
                in_fence = not in_fence
            if in_fence:
                continue
            for m in MD_LINK.finditer(line):
                target_name, anchor = m.group(1), m.group(2)
                target = (path.parent / target_name).resolve() if target_name else path
                where = f"{path.relative_to(ROOT)}:{lineno}: ({m.group(1)}#{anchor})"
                if not target.exists():
                    broken.append(f"{where} (no such file)")
                    continue
                if anchor is None or target.suffix != ".md":
                    continue
                key = str(target)
                if key not in anchors:
                    anchors[key] = github_slugs(target.read_text(encoding="utf-8"))
                if anchor not in anchors[key]:
                    broken.append(f"{where} (no such heading)")
    return broken


#: Citations of things users of the repository never get: paths outside it, the documents the
#: project was created from (by file name or number), the Go reference's notes and their section
#: numbers, the spec and note files kept beside the repository, and issue numbers.
FORBIDDEN = re.compile(
    # (split literals: this file must not cite what it forbids)
    r"\.\./sha" r"red|/work/sha" r"red|(?<![\w-])sha" r"red/[\w.-]"
    r"|\b\d{3}_[0-9a-f]{16}\.txt|\bseeds? 00\d"
    r"|reference-beh" r"avio|\bref(?:erence)? §|§\s?\d"
    r"|\b(?:design|peers|protocol|ecosystem|kube-testserver)\.md|kube-testserver notes"
    r"|\bissue #?\d+|\(#\d+\)",
    re.IGNORECASE,
)

#: Checked as a case of its own, so a citation there is reported under its own test id.
OPERATOR = "bigfleet_trio/operator/"


def test_forbidden_patterns() -> None:
    # Each example is written in two parts so that this file itself cites nothing.
    parts = [
        ("see ../sha", "red/notes/x"),
        ("/work/sha", "red/seeds"),
        ("sha", "red/notes/x.md"),
        ("Se", "ed 000"),
        ("se", "eds 004"),
        ("000_efb8", "2487ae4f5ee3.txt"),
        ("reference-beh", "aviour.md"),
        ("ref ", "§6"),
        ("reference ", "§2-4"),
        ("§", "18.5"),
        ("des", "ign.md"),
        ("proto", "col.md"),
        ("pe", "ers.md N1"),
        ("iss", "ue 4"),
        ("Iss", "ue #12"),
        ("fixed (", "#7)"),
        ("kube-testserver", " notes"),
    ]
    cited = [a + b for a, b in parts]
    fine = [
        "machine is shared or noisy",
        "docs/reference.md#known-bugs-we-fix",
        "ADR-0039",
        "test_18_7_missing_label",
        "reclaims_issued = 3",
        "shared_settings/x",
        "[a](#anchor)",
    ]
    assert [c for c in cited if not FORBIDDEN.search(c)] == []
    assert [c for c in fine if FORBIDDEN.search(c)] == []


def _citations(*, operator: bool) -> list[str]:
    me = Path(__file__).resolve()
    found: list[str] = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if path.resolve() == me or rel.startswith(OPERATOR) != operator:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                found.append(f"{rel}:{lineno}: {line.strip()[:100]}")
    return found


@pytest.mark.parametrize(
    "operator", [pytest.param(False, id="repository"), pytest.param(True, id="operator")]
)
def test_no_citations_outside_the_repository(operator: bool) -> None:
    found = _citations(operator=operator)
    assert not found, f"{len(found)} citations outside the repository:\n" + "\n".join(found)


def test_readme_layout_names_existing_paths() -> None:
    """Every path the README's Layout bullet names exists (the section matches the tree)."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = text.split("- Layout", 1)[1].split("\n- `docs/`", 1)[0]
    named = re.findall(r"`([\w./+-]+)`", layout)
    paths = []
    base = ""
    for name in named:
        if name.startswith(("bigfleet_trio/", "tests/", "scripts/", "config/", "proto/")):
            base = name if name.endswith("/") else name.rsplit("/", 1)[0] + "/"
            paths.append(name)
        elif name.endswith((".py", "/")) and base:
            paths.append(base + name)  # relative to the package named before it
        elif name in ("Dockerfile", "constraints.txt", "FAULTS.md", "CONTRIBUTING.md"):
            paths.append(name)
    missing = [
        p
        for p in paths
        if not (ROOT / p).exists()
        and not (ROOT / "scripts" / p).exists()
        and not (ROOT / "tests" / p).exists()
    ]
    assert len(paths) > 20 and not missing, missing


# ------------------------------------------------------------------ names docs/ gives the code

CODE_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
CLASS_REF = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)?)((?:\.\w+)*)(?:\(\))?`")
# Multi-word capitalised names docs/ uses that are not our classes: Kubernetes and protocol
# kinds, Event and status reasons, other libraries' classes (each named as such in the text).
NOT_OUR_CLASSES = {
    "CapacityRequest", "UpcomingNode", "AvailableCapacity",  # our CRD kinds (docs/crds.md)
    "Node", "Pod", "Lease", "Event",  # Kubernetes kinds (``Node.spec.providerID``)
    "CapacityRequestRejected", "ResourceVersionTooLarge", "DoesNotExist", "NotIn",
    "RetryOnConflict",  # client-go's helper
    "SandboxedEnvironment", "StrictUndefined",  # jinja2
    "MinTime",  # grpc-go's keepalive.EnforcementPolicy field
    # CapacityRequest condition types and reasons, Pod Event reasons (operator/outcomes.py)
    "CapacityOffered", "MachineComing", "InRollUp", "NoOffer", "NoHints", "MachineFits",
    "NoneFits", "NothingCame", "CapacityRequested", "CapacityRequestExcluded",
    "NoCapacityOffered", "NoMachineCame", "DisruptionBlocked",
    "EvictionBlocked",
    "DisruptionBudget",  # kube-apiserver's eviction StatusCause reason
    "InvalidDoNotDisruptAnnotation",
}


def _doc_texts() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = re.sub(r"https?://\S+", "", path.read_text(encoding="utf-8"))
        yield path.name, text


def _code_classes() -> set[str]:
    import ast

    names: set[str] = set()
    for path in (ROOT / "bigfleet_trio").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
    for proto in (ROOT / "proto").rglob("*.proto"):
        names |= set(re.findall(r"^\s*(?:message|enum|service)\s+(\w+)",
                                proto.read_text(encoding="utf-8"), re.M))
    return names


def test_every_code_path_docs_name_exists() -> None:
    """``operator/upcoming/plan.py``, ``reclaim/drain.py``, ``acknowledge.py``: a path docs/
    names is the end of a file's path in the repository (``bigfleet_trio/``, ``tests/``,
    ``scripts/``)."""
    files = ["/" + p.relative_to(ROOT).as_posix() for d in ("bigfleet_trio", "tests", "scripts")
             for p in (ROOT / d).rglob("*.py")]
    missing = [f"{name}: {ref}" for name, text in _doc_texts()
               for ref in sorted(set(CODE_PATH.findall(text)))
               if not any(f.endswith("/" + ref) for f in files)]
    assert not missing, missing


def test_every_class_docs_name_exists() -> None:
    """A class docs/ names (``PodController``, ``Operator.run``) is defined in the package or
    the .proto files; other capitalised names are listed in :data:`NOT_OUR_CLASSES`."""
    classes = _code_classes()
    missing = []
    for name, text in _doc_texts():
        for cls, attrs in sorted(set(CLASS_REF.findall(text))):
            multi_word = sum(c.isupper() for c in cls) > 1
            if not (attrs or multi_word) or cls in classes or cls in NOT_OUR_CLASSES:
                continue
            missing.append(f"{name}: {cls}{attrs}")
    assert not missing, missing


def test_the_architecture_layers_are_the_import_contract() -> None:
    """docs/architecture.md "Layers" lists the layers of pyproject.toml's ``layers`` contract,
    in order, with the same independent siblings."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    documented = []
    for line in section.splitlines():
        m = re.match(r"^\d+\. (`[a-z_]+`(?: \| `[a-z_]+`)*):", line)
        if m:
            documented.append(" | ".join(re.findall(r"`([a-z_]+)`", m.group(1))))
    assert documented == layers


def test_the_hop_lists_name_functions_that_exist() -> None:
    """docs/architecture.md "Two paths, hop by hop": every `file.py` `Name.attr` pair names an
    attribute of that module (a later name on the same hop may live in the same file)."""
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Two paths, hop by hop", 1)[1].split("\n## ", 1)[0]
    hops = re.split(r"\n(?=\d+\. )", section)
    checked, missing = 0, []
    for hop in hops:
        module = None
        for path, name in re.findall(r"(?:`([\w/]+\.py)` )?`([A-Za-z_][\w.]*)`", hop):
            if path:
                module = importlib.import_module(
                    "bigfleet_trio." + path.removesuffix(".py").replace("/", "."))
            if module is None or name.isupper():
                continue
            obj: object = module
            for part in name.split("."):
                obj = getattr(obj, part, None)
            checked += 1
            if obj is None:
                missing.append(f"{module.__name__}.{name}")
    assert checked >= 20 and not missing, missing


BENCH_CELL_MAX = 100
"""Characters a cell of BENCHMARKS.md's current-figures table may hold (a link counts as its
text): a figure, not the run's story, which belongs in its record."""


def _current_figures() -> tuple[list[str], list[list[str]]]:
    """BENCHMARKS.md's current-figures table: header cells and rows of cells."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text.split("\n## Current figures\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in table]
    assert set(table[1].replace("|", "")) <= {"-", " "}, "the second line is the separator"
    return cells[0], cells[2:]


def test_benchmarks_current_figures_one_short_row_per_scenario_and_size_latest_first() -> None:
    header, rows = _current_figures()
    assert header[:3] == ["scenario", "size", "run"], header
    assert rows, "no rows"
    assert all(len(r) == len(header) for r in rows), "a row with another number of cells"
    keys = [(r[0], r[1]) for r in rows]
    assert sorted(set(keys)) == sorted(keys), "two rows for one scenario and size"
    for row in rows:
        for cell in row:
            shown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)
            assert len(shown) <= BENCH_CELL_MAX, (row[0], row[1], shown)
    runs = []
    for row in rows:
        when = re.fullmatch(r"(\d{4}-\d\d-\d\d)(?: (\d\d:\d\d) UTC)?", row[2])
        assert when is not None, f"run {row[2]!r}: YYYY-MM-DD [HH:MM UTC]"
        runs.append((when.group(1), when.group(2)))
    for (day, at), (next_day, next_at) in zip(runs, runs[1:], strict=False):
        assert day > next_day or (day == next_day and (not at or not next_at or at >= next_at)), (
            f"not the latest first: {day} {at or ''} before {next_day} {next_at or ''}")
