"""Tests that prove what they say: every test asserts something, on a clock it controls.

An AST scan of the test tree.  A ``test_*`` function must contain an ``assert``, a
``pytest.raises``/``pytest.warns`` (or any ``raises``) context or call, or a call to a
helper whose name starts with ``assert_``, ``check_`` or ``expect_``.  No test module
calls ``time.sleep``, and ``trio.sleep`` with a non-zero argument only runs where the
``autojump_clock`` fixture (or a ``MockClock``) drives time.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Tiers that drive real processes (kube-apiserver, etcd, the Go shard, fault proxies)
# wait on real time by nature: a subprocess does not run on a virtual clock.
REAL_TIME_DIRS = ("realkube", "interop", "faults", "support")

# (module relative to tests/, function): reason.  Keep it short.
NO_ASSERT_ALLOWED: dict[tuple[str, str], str] = {}

# Bounded polls on real time outside those tiers: each waits on state changed by another
# process (kubectl, helm, a child process over sockets) or a gRPC thread, which has no event
# to await and cannot run on a virtual clock.  Each loop sits under a deadline.
_SUBPROCESS = "polls state a real subprocess changes, under a deadline"
REAL_TIME_ALLOWED: dict[tuple[str, str], str] = {
    ("helm/test_install.py", "wait_for"): "polls a real helm/kubectl run (synchronous code)",
    ("test_cli.py", "test_a_binary_exits_0_after_ctrl_c"):
        "polls a real pod-controller process's /readyz over a socket until it serves",
    ("observability/test_diagnostics_auth.py", "test_events_follower_sends_the_kubeconfig_token"):
        "the follower connects over real TLS sockets; no subscribe event to await",
    ("observability/test_diagnostics_tls.py", "test_events_over_wss_with_the_ca_or_skip_verify"):
        "the follower connects over real TLS sockets; no subscribe event to await",
    ("observability/test_http.py", "_wait_subscribers"):
        "the server side of a real-socket websocket subscribes in its own task",
    ("operator/test_app.py", "test_process_over_sockets_with_leader_election_and_sigterm"):
        "a whole operator process over sockets with SIGTERM",
    ("podcontroller/test_controller_app.py", "test_process_end_to_end_and_sigterm"):
        "a whole pod-controller process over sockets with SIGTERM",
    ("podcontroller/test_kubectl_flow.py", "test_kubectl_applied_pod_becomes_cr_listed_by_kubectl"):
        _SUBPROCESS,
    ("shard/test_bootstrap_read_ahead_bound.py", "_answered_while_paused"):
        "the gRPC reader fills the lane from its own thread; a channel has no 'became full' event",
    ("shard/test_grpc.py", "test_agent_over_grpc_reconnects_after_refused"):
        "the gRPC channel runs its own loop thread; the reconnect count has no event",
    ("sim/test_apiserver_kubectl.py", "test_drain_waits_on_pdb_then_finishes"): _SUBPROCESS,
    ("sim/test_apiserver_kubectl.py", "test_chunked_get_and_wait_jsonpath"): _SUBPROCESS,
    ("sim/test_apiserver_kubectl.py", "test_delete_waits_for_finalizers"): _SUBPROCESS,
    ("sim/test_apiserver_serve.py", "test_fast_engine_raw_http"):
        "the server notices a client hang-up on a real socket; it exposes no event",
    ("sim/test_apiserver_serve.py", "test_client_hangup_unregisters_watch_on_both_engines"):
        "the server notices a client hang-up on a real socket; it exposes no event",
    ("sim/test_pieces_path.py", "until"): _SUBPROCESS,
    ("sim/test_pieces_path.py", "pieces"): _SUBPROCESS,
    ("sim/test_reclaim_events_kubectl.py", "test_kubectl_get_events_lists_the_reclaim"):
        _SUBPROCESS,
}

_ASSERT_PREFIXES = ("assert_", "check_", "expect_")


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if ".venv" not in p.parts)


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _direct_proof(fn: ast.AST, helpers: set[str]) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _call_name(node)
            bare = name.lstrip("_")
            if name in ("raises", "warns", "fail", "deprecated_call") or name in helpers:
                return True
            if bare.startswith(_ASSERT_PREFIXES):
                return True
    return False


def _proving_helpers(tree: ast.Module) -> set[str]:
    """Module-level helpers that assert (directly or through another such helper)."""
    funcs = {n.name: n for n in tree.body
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    helpers: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, fn in funcs.items():
            if name not in helpers and not name.startswith("test_") and _direct_proof(fn, helpers):
                helpers.add(name)
                changed = True
    return helpers


def _test_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("test_"):
                found.append(node)
    return found


def _is_zero(arg: ast.expr) -> bool:
    return isinstance(arg, ast.Constant) and arg.value == 0


def _uses_virtual_clock(source: str) -> bool:
    return "autojump_clock" in source or "MockClock" in source


def no_assert_offenders() -> list[str]:
    out = []
    for path in _modules():
        rel = path.relative_to(TESTS).as_posix()
        if not path.name.startswith("test_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        helpers = _proving_helpers(tree)
        for fn in _test_functions(tree):
            if (rel, fn.name) in NO_ASSERT_ALLOWED:
                continue
            if not _direct_proof(fn, helpers):
                out.append(f"{rel}:{fn.lineno} {fn.name}")
    return out


def _sleeps(fn: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if not isinstance(owner, ast.Name) or node.func.attr != "sleep":
            continue
        if owner.id == "time":
            found.append((node.lineno, "time.sleep"))
        elif owner.id == "trio" and node.args and not _is_zero(node.args[0]):
            found.append((node.lineno, "trio.sleep"))
    return found


def _takes_clock(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    return "autojump_clock" in params or "MockClock" in ast.unparse(fn)


def real_sleep_offenders() -> list[str]:
    out = []
    for path in _modules():
        rel = path.relative_to(TESTS).as_posix()
        if rel.split("/")[0] in REAL_TIME_DIRS or path.name == Path(__file__).name:
            continue
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
        module_clocked = _uses_virtual_clock(source)
        for fn in ast.walk(tree):
            # top-level functions and methods; nested ones go with their enclosing function
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if fn not in tree.body and not any(fn in c.body for c in tree.body
                                               if isinstance(c, ast.ClassDef)):
                continue
            if (rel, fn.name) in REAL_TIME_ALLOWED:
                continue
            for line, what in _sleeps(fn):
                if what == "trio.sleep":
                    clocked = _takes_clock(fn) if fn.name.startswith("test_") else module_clocked
                    if clocked:
                        continue
                out.append(f"{rel}:{line} {what} in {fn.name}")
    return out


def test_every_test_asserts_something() -> None:
    assert no_assert_offenders() == []


def test_no_real_sleeps_outside_real_process_tiers() -> None:
    assert real_sleep_offenders() == []


def test_allow_lists_name_functions_that_exist() -> None:
    """An entry outliving its test would hide the next one of that name."""
    defined = set()
    for path in _modules():
        rel = path.relative_to(TESTS).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defined.add((rel, node.name))
    assert set(REAL_TIME_ALLOWED) - defined == set()
    assert set(NO_ASSERT_ALLOWED) - defined == set()


def test_the_guards_catch_what_they_are_for() -> None:
    """The scanners themselves: a test with no check and a sleep on the real clock are found."""
    tree = ast.parse(
        "def helper():\n    assert True\n"
        "def test_silent():\n    x = 1\n"
        "def test_helped():\n    helper()\n"
        "def test_checked():\n    _assert_clean(1)\n"
        "async def test_raises():\n    with pytest.raises(ValueError):\n        pass\n")
    helpers = _proving_helpers(tree)
    verdicts = {fn.name: _direct_proof(fn, helpers) for fn in _test_functions(tree)}
    assert verdicts == {"test_silent": False, "test_helped": True, "test_checked": True,
                        "test_raises": True}
    sleepy = ast.parse("async def f():\n    await trio.sleep(0)\n    await trio.sleep(0.1)\n"
                       "    time.sleep(1)\n")
    assert sorted(_sleeps(sleepy)) == [(3, "trio.sleep"), (4, "time.sleep")]
