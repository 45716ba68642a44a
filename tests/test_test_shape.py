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
        if not isinstance(owner, ast.Name):
            continue
        if owner.id == "time" and node.func.attr == "sleep":
            found.append((node.lineno, "time.sleep"))
        elif owner.id == "trio" and node.func.attr == "sleep_until":
            found.append((node.lineno, "trio.sleep"))
        elif (owner.id == "trio" and node.func.attr == "sleep" and node.args
              and not _is_zero(node.args[0])):
            found.append((node.lineno, "trio.sleep"))
    return found


def _takes_clock(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    return "autojump_clock" in params or "MockClock" in ast.unparse(fn)


def _names_used(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names a function refers to: called or passed helpers, and its parameters (fixtures)."""
    used = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return used


def module_sleep_offenders(rel: str, tree: ast.Module) -> list[str]:
    """Real sleeps in one test module (``rel``, relative to tests/).

    A ``time.sleep`` anywhere is one. A ``trio.sleep`` in a test is one unless the test runs
    on a virtual clock; in a helper or fixture (any other top-level function or method), unless
    the module uses a virtual clock and every test that reaches the helper, through its calls,
    other helpers or its fixtures, runs on one (a clocked module's helper called by a test on
    the real clock sleeps for real). Functions in :data:`REAL_TIME_ALLOWED` are skipped.
    """
    module_clocked = _uses_virtual_clock(ast.unparse(tree))
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in members:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                funcs.setdefault(fn.name, fn)
    allowed = {name for name in funcs if (rel, name) in REAL_TIME_ALLOWED}
    out = []
    sleepy: set[str] = set()
    for name, fn in funcs.items():
        if name in allowed:
            continue
        is_test = name.startswith("test_")
        for line, what in _sleeps(fn):
            if what == "trio.sleep":
                if not is_test:
                    sleepy.add(name)
                if _takes_clock(fn) if is_test else module_clocked:
                    continue
            out.append(f"{rel}:{line} {what} in {name}")
    helpers = {name: fn for name, fn in funcs.items()
               if not name.startswith("test_") and name not in allowed}
    grew = True
    while grew:  # a helper reaching a sleepy helper sleeps too
        grew = False
        for name, fn in helpers.items():
            if name not in sleepy and _names_used(fn) & (sleepy - {name}):
                sleepy.add(name)
                grew = True
    for name, fn in funcs.items():
        if not name.startswith("test_") or name in allowed or _takes_clock(fn):
            continue
        for helper in sorted(_names_used(fn) & sleepy):
            out.append(f"{rel}:{fn.lineno} trio.sleep in {helper}, reached by {name} on the "
                       "real clock")
    return out


def real_sleep_offenders() -> list[str]:
    out = []
    for path in _modules():
        rel = path.relative_to(TESTS).as_posix()
        if rel.split("/")[0] in REAL_TIME_DIRS or path.name == Path(__file__).name:
            continue
        out += module_sleep_offenders(rel, ast.parse(path.read_text(), filename=str(path)))
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
    assert _sleeps(ast.parse("async def f():\n    await trio.sleep_until(5)\n")) == [
        (2, "trio.sleep")]


def test_a_clocked_modules_helper_is_judged_by_the_tests_that_reach_it() -> None:
    """A helper's trio.sleep in a module that uses autojump_clock somewhere still sleeps for
    real when a test on the real clock calls it, directly, through another helper or as a
    fixture."""
    tree = ast.parse(
        "async def poll():\n    await trio.sleep(0.05)\n"
        "async def twice():\n    await poll()\n    await poll()\n"
        "async def test_clocked(autojump_clock):\n    await poll()\n"
        "async def test_real():\n    await twice()\n"
        "async def test_fixture(poll):\n    assert poll\n"
        "async def test_none():\n    await trio.sleep(0)\n")
    assert module_sleep_offenders("m.py", tree) == [
        "m.py:8 trio.sleep in twice, reached by test_real on the real clock",
        "m.py:10 trio.sleep in poll, reached by test_fixture on the real clock",
    ]
    unclocked = ast.parse("async def poll():\n    await trio.sleep(0.05)\n")
    assert module_sleep_offenders("m.py", unclocked) == ["m.py:2 trio.sleep in poll"]
