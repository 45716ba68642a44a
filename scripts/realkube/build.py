"""``python -m scripts.realkube build``: the pinned real control-plane binaries, built from their Go
modules with the machine's Go toolchain and module proxy, into a cache outside the repository.

Layout of the cache (``$BIGFLEET_REALKUBE_CACHE``, default ``~/.cache/bigfleet-trio/realkube``),
keyed by the Kubernetes version::

    src-v1.37.2/      wrapper module: requires k8s.io/kubernetes, pins every staging module
    etcd-v3.6.16/     wrapper module: a main calling etcdmain.Main
    bin-v1.37.2/      kube-apiserver kube-controller-manager kube-scheduler etcd kwok
                      build.json: per binary, seconds the build took and when it finished

Idempotent: a binary that exists and reports the pinned version is not rebuilt. Every build
states its pins in the wrapper module again and checks them after ``go mod tidy`` and on the
built binary, failing with the module or binary that does not hold its pin. Go's own caches
(GOMODCACHE, GOCACHE) stay where ``go env`` puts them, also outside the repository.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ETCD_VERSION", "KUBE_VERSION", "KWOK_VERSION", "BINARIES", "Binaries", "BuildError",
    "pin_mismatches", "cache_dir", "find_binaries", "build", "binary_version",
]

KUBE_VERSION = "v1.37.2"
# every k8s.io staging module is published at v0.<minor>.<patch> of the matching release
STAGING_VERSION = "v0" + KUBE_VERSION[2:]
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = (*KUBE_COMMANDS, "etcd", "kwok")
CACHE_ENV = "BIGFLEET_REALKUBE_CACHE"


class BuildError(RuntimeError):
    """A build step failed; the message names the step and its log file."""


def cache_dir() -> Path:
    """``$BIGFLEET_REALKUBE_CACHE`` or ``~/.cache/bigfleet-trio/realkube``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "bigfleet-trio" / "realkube"


@dataclass(frozen=True)
class Binaries:
    """Paths of the five binaries of one pinned version set (all present)."""

    bin_dir: Path

    def __getitem__(self, name: str) -> str:
        return str(self.bin_dir / name)

    @property
    def kwok(self) -> str | None:
        """kwok's path, or None when it could not be built (then no kubelet runs Pods)."""
        path = self.bin_dir / "kwok"
        return str(path) if path.exists() and (self.bin_dir / KWOK_CONFIG).exists() else None

    @property
    def kwok_config(self) -> str:
        """kwok's Stages (:data:`KWOK_CONFIG`)."""
        return str(self.bin_dir / KWOK_CONFIG)


def bin_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / f"bin-{KUBE_VERSION}"


def find_binaries(root: Path | None = None) -> Binaries | None:
    """The built binaries, or None unless the three Kubernetes ones and etcd exist.

    kwok is optional: without it the control plane runs the sim's kubelet stand-in."""
    d = bin_dir(root)
    if all((d / name).is_file() and os.access(d / name, os.X_OK)
           for name in (*KUBE_COMMANDS, "etcd")):
        return Binaries(d)
    return None


def binary_version(path: str | Path) -> str:
    """The first line ``BINARY --version`` prints ("" if it does not run)."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    except OSError:
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def _expected(name: str) -> str:
    """The version string a correctly built ``name`` reports."""
    if name in KUBE_COMMANDS:
        return KUBE_VERSION
    if name == "etcd":
        return ETCD_VERSION.lstrip("v")
    return ""  # kwok's --version carries no module version when built with go install


def _pin_of(name: str) -> str:
    return {"etcd": ETCD_VERSION, "kwok": KWOK_VERSION}.get(name, KUBE_VERSION)


def _current(path: Path, name: str) -> bool:
    return path.is_file() and _expected(name) in binary_version(path)


# A long step prints a line this often, so a cold build (tens of minutes) is never silent.
PROGRESS_SECONDS = 60.0


def _run(argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        start = time.monotonic()
        while True:
            try:
                returncode = proc.wait(timeout=PROGRESS_SECONDS)
                break
            except subprocess.TimeoutExpired:
                print(f"  ... {' '.join(argv[:2])} still running after "
                      f"{_fmt(time.monotonic() - start)}; log {log}", file=sys.stderr, flush=True)
    if returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        raise BuildError(f"{' '.join(argv)} failed (exit {returncode}), log {log}:\n{tail}")


def pin_mismatches(resolved: dict[str, str], pins: dict[str, str]) -> list[str]:
    """The pinned modules that ``go`` resolved to another version (or not at all), one line
    each ("MODULE: pinned V, resolved W"); empty when every pin holds."""
    return [f"{mod}: pinned {want}, resolved {resolved.get(mod) or 'nothing'}"
            for mod, want in sorted(pins.items()) if resolved.get(mod) != want]


def _resolved(src: Path, modules: list[str], env: dict[str, str]) -> dict[str, str]:
    """``go list -m`` of ``modules`` in the wrapper module ``src``: module -> version."""
    out = subprocess.run(["go", "list", "-m", "-f", "{{.Path}} {{.Version}}", *modules],
                         cwd=src, capture_output=True, text=True, check=False,
                         env={**os.environ, **env})
    pairs = (line.split() for line in out.stdout.splitlines())
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def _check_pins(what: str, src: Path, pins: dict[str, str], env: dict[str, str],
                log: Path) -> None:
    """Raise BuildError naming every pin ``go mod tidy`` did not keep: a build at another
    version would never count as current and would rebuild on every run."""
    wrong = pin_mismatches(_resolved(src, sorted(pins), env), pins)
    if wrong:
        raise BuildError(f"{what}: the wrapper module {src / 'go.mod'} does not hold its pins "
                         f"({'; '.join(wrong)}); log {log}")


def staging_modules(env: dict[str, str]) -> list[str]:
    """The k8s.io staging modules, read from the ``replace`` block of k8s.io/kubernetes's own
    go.mod at the pinned tag (``go mod download -json`` gives its path)."""
    out = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{KUBE_VERSION}"],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, **env})
    if out.returncode != 0:
        raise BuildError(f"go mod download k8s.io/kubernetes@{KUBE_VERSION}: {out.stderr.strip()}")
    gomod = Path(json.loads(out.stdout)["GoMod"]).read_text()
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", gomod, re.M)))


TOOLS_GO = """//go:build tools

package tools

import (
{imports}
)
"""

ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def _ldflags() -> str:
    # What upstream's build injects (hack/lib/version.sh); without it the binaries report
    # v0.0.0-master and so does the apiserver's /version.
    major, minor = KUBE_VERSION[1:].split(".")[:2]
    pkg = "k8s.io/component-base/version"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return " ".join([
        f"-X {pkg}.gitVersion={KUBE_VERSION}", f"-X {pkg}.gitMajor={major}",
        f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean",
        f"-X {pkg}.buildDate={stamp}", "-s", "-w",
    ])


def _build_kube(root: Path, out: Path, env: dict[str, str]) -> None:
    src = root / f"src-{KUBE_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    log = src / "build.log"
    if not (src / "go.mod").exists():
        _run(["go", "mod", "init", "bigfleet-trio/realkube"], src, log, env)
    # Every run states the pins again (a go.mod left by an earlier run or version is corrected,
    # never trusted), then checks that resolution kept them.
    _run(["go", "mod", "edit", f"-require=k8s.io/kubernetes@{KUBE_VERSION}"], src, log, env)
    staging = staging_modules(env)
    for mod in staging:
        _run(["go", "mod", "edit", f"-replace={mod}={mod}@{STAGING_VERSION}"], src, log, env)
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"' for c in KUBE_COMMANDS)
    (src / "tools.go").write_text(TOOLS_GO.format(imports=imports))
    _run(["go", "mod", "tidy"], src, log, env)
    _check_pins("kube-*", src, {"k8s.io/kubernetes": KUBE_VERSION}, env, log)
    _run(["go", "build", "-mod=readonly", "-ldflags", _ldflags(), "-o", f"{out}/",
          *(f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS)], src, log, env)


# The etcd modules whose versions the binary is made of and reports (``etcd --version`` reads
# go.etcd.io/etcd/api/v3/version).
ETCD_MODULES = ("go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/api/v3",
                "go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/client/pkg/v3",
                "go.etcd.io/etcd/pkg/v3")


def _build_etcd(root: Path, out: Path, env: dict[str, str]) -> None:
    src = root / f"etcd-{ETCD_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    log = src / "build.log"
    (src / "main.go").write_text(ETCD_MAIN)
    if not (src / "go.mod").exists():
        _run(["go", "mod", "init", "bigfleet-trio/etcd"], src, log, env)
    # Each etcd module pinned explicitly: a bare `go mod tidy` resolves a missing requirement
    # to the newest release, not to the pin.
    for mod in ETCD_MODULES:
        _run(["go", "mod", "edit", f"-require={mod}@{ETCD_VERSION}"], src, log, env)
    _run(["go", "mod", "tidy"], src, log, env)
    _check_pins("etcd", src, dict.fromkeys(ETCD_MODULES, ETCD_VERSION), env, log)
    _run(["go", "build", "-mod=readonly", "-o", str(out / "etcd"), "."], src, log, env)


# kwok on its own (without kwokctl) has no behaviour until given Stages: the ones kwokctl
# configures by default, read from the module's kustomize/stage tree.
KWOK_STAGES = ("node/fast/node-initialize.yaml",
               "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
KWOK_CONFIG = "kwok-stages.yaml"


def _kwok_stages(root: Path, out: Path, env: dict[str, str]) -> None:
    dl = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{KWOK_VERSION}"],
                        capture_output=True, text=True, check=False, cwd=root,
                        env={**os.environ, **env})
    if dl.returncode != 0:
        raise BuildError(f"go mod download sigs.k8s.io/kwok@{KWOK_VERSION}: {dl.stderr.strip()}")
    stage_dir = Path(json.loads(dl.stdout)["Dir"]) / "kustomize" / "stage"
    docs = [(stage_dir / rel).read_text().strip() for rel in KWOK_STAGES]
    (out / KWOK_CONFIG).write_text(
        f"# kwok {KWOK_VERSION}'s default Stages (kustomize/stage/...), as kwokctl sets them\n"
        + "\n---\n".join(docs) + "\n")


def _build_kwok(root: Path, out: Path, env: dict[str, str]) -> None:
    log = root / "kwok-build.log"
    if not _current(out / "kwok", "kwok"):
        _run(["go", "install", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"], root, log,
             {**env, "GOBIN": str(out)})
    _kwok_stages(root, out, env)


def _log_seconds(log: Path) -> float | None:
    """The ``real`` time a shell's ``time`` wrote at the end of ``log`` (None if absent)."""
    if not log.exists():
        return None
    m = re.findall(r"^real\s+(\d+)m([\d.]+)s", log.read_text(errors="replace"), re.M)
    return int(m[-1][0]) * 60 + float(m[-1][1]) if m else None


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "build time unknown"
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


@contextlib.contextmanager
def build_lock(root: Path, *, echo: bool = True) -> Iterator[None]:
    """Hold the cache's build lock (``root/.build.lock``, an exclusive flock) for the block.

    Two builds at once (a CI run and a developer's test run, or two worktrees sharing the cache)
    would each compile the whole of Kubernetes, write the same output files and, on 2 cores, take
    four times as long; the second one waits here instead, then finds the first one's binaries
    current and builds nothing. The lock is released when the process exits, however it exits.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if echo:
                print(f"waiting for another build of {root} to finish (lock {f.name})",
                      file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(root: Path | None = None, *, echo: bool = True) -> Binaries:
    """Build whatever is missing or not at the pinned version; print one line per binary.

    One build at a time per cache (:func:`build_lock`). Returns the binaries. Raises BuildError
    if go is missing or a Kubernetes/etcd step fails; a kwok failure is reported and leaves kwok
    absent (the control plane then uses the sim's kubelet stand-in).
    """
    root = root or cache_dir()
    if shutil.which("go") is None:
        raise BuildError("no go toolchain on PATH (https://go.dev/doc/install)")
    with build_lock(root, echo=echo):
        return _build_locked(root, echo=echo)


def _build_locked(root: Path, *, echo: bool) -> Binaries:
    out = bin_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "build.json"
    record: dict[str, dict[str, object]] = (
        json.loads(record_path.read_text()) if record_path.exists() else {}
    )
    env = {"CGO_ENABLED": "0"}  # how upstream builds these binaries: static, no libc
    steps = [
        (KUBE_COMMANDS, _build_kube, root / f"src-{KUBE_VERSION}" / "build.log"),
        (("etcd",), _build_etcd, root / f"etcd-{ETCD_VERSION}" / "build.log"),
        (("kwok",), _build_kwok, root / "kwok-build.log"),
    ]
    rebuilt: set[str] = set()
    for names, step, log in steps:
        if all(_current(out / n, n) for n in names) and (
                names != ("kwok",) or (out / KWOK_CONFIG).exists()):
            for n in names:
                if n not in record:  # built before this script kept a record (a shell's `time`)
                    record[n] = {"seconds": _log_seconds(log), "cached": True}
            continue
        start = time.monotonic()
        if echo:
            print(f"building {', '.join(names)} (pinned {_pin_of(names[0])}); log {log}",
                  file=sys.stderr, flush=True)
        try:
            step(root, out, env)
            stale = [f"{n} reports {binary_version(out / n)!r}, pinned {_pin_of(n)}"
                     for n in names if not _current(out / n, n)]
            if stale:
                raise BuildError(f"built at the wrong version: {'; '.join(stale)}; log {log}")
        except BuildError as exc:
            if names != ("kwok",):
                raise
            print(f"kwok: not built ({exc}); the sim's kubelet stand-in will be used",
                  file=sys.stderr)
            continue
        took = time.monotonic() - start
        rebuilt.update(names)
        for n in names:
            record[n] = {"seconds": round(took, 1),
                         "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        if echo:
            print(f"built {', '.join(names)} in {_fmt(took)}", file=sys.stderr)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    for n in BINARIES:
        path = out / n
        if not path.exists():
            if echo:
                print(f"{n:<24} missing")
            continue
        if echo:
            shared = " (one go build for the three kube-*)" if n in KUBE_COMMANDS else ""
            state = "now" if n in rebuilt else "cached"
            took_s = record.get(n, {}).get("seconds")
            print(f"{n:<24} {binary_version(path):<44} {state}, built in "
                  f"{_fmt(took_s)}{shared}  {path}")  # type: ignore[arg-type]
    found = find_binaries(root)
    if found is None:
        raise BuildError(f"binaries missing in {out} after the build")
    return found
