"""The worked examples in examples/: each correct worker valid on its whole crash matrix with every
declared point fired, each buggy one caught by no_duplicate_effects -- through the CLI (exit codes,
as a CI job sees them) and through each example's own pytest suite, run as its users run it.

The examples own their state (a PostgreSQL queue table, a SQLite outbox), so these also protect the
open-target contract end to end: declared points, hooks, Killpoint-* headers from plain HTTP clients.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hang import HANG_S

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def matrix(folder: str, target: str, env: dict[str, str] | None = None, *more: str) -> tuple[int, dict]:
    """``killpoint matrix --target TARGET --json`` in the example's folder, as a user would run it."""
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--target", target, "--json",
                           *more],
                          cwd=os.path.join(EXAMPLES, folder), capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, **(env or {})})
    assert done.stdout, done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def declared_points(folder: str, module: str) -> set[str]:
    found = subprocess.run([sys.executable, "-c", f"import {module}; print(','.join({module}.POINTS))"],
                           cwd=os.path.join(EXAMPLES, folder), capture_output=True, text=True, timeout=HANG_S)
    return set(found.stdout.strip().split(","))


def assert_valid_everywhere(code: int, out: dict, points: set[str]) -> None:
    assert (code, out["valid"], out["unknown"]) == (0, True, []), out["unknown"]
    fired = {fault.split(":")[0].split("@")[1].split(".")[-1]
             for r in out["results"] for fault, n in r["fired"].items() if n}
    assert fired == points  # every declared point fired, and no other was scheduled
    assert all(not r["unfired"] for r in out["results"])
    assert out["invariants"]["checkpoints_honoured"]["not_applicable"] == out["runs"]


def assert_duplicate_caught(code: int, out: dict) -> None:
    assert (code, out["valid"]) == (1, False)
    assert {v["invariant"] for v in out["violations"]} == {"no_duplicate_effects"}


def test_pg_queue_correct_worker_is_valid_at_every_declared_point_and_the_new_key_bug_exits_1(pg_dsn):
    env = {"KILLPOINT_PG_DSN": pg_dsn}
    code, out = matrix("pg_queue", "queue_worker:worker", env)
    assert_valid_everywhere(code, out, declared_points("pg_queue", "queue_worker"))
    assert {"before_ack", "after_ack"} <= declared_points("pg_queue", "queue_worker")
    # its audit log (history()) and job states (final_states()) let the store invariants judge
    for name in ("version_chain", "legal_transitions", "effects_accounted", "terminates"):
        assert out["invariants"][name]["checked"] == out["runs"], name
    assert_duplicate_caught(*matrix("pg_queue", "queue_worker:worker_new_key_per_attempt", env))


def test_sqlite_outbox_correct_relay_is_valid_at_every_declared_point_and_the_new_key_bug_exits_1():
    code, out = matrix("sqlite_outbox", "outbox_worker:worker")
    assert_valid_everywhere(code, out, declared_points("sqlite_outbox", "outbox_worker"))
    # no history() hook: the store-event invariants say not applicable, never a silent pass
    assert out["invariants"]["version_chain"]["not_applicable"] == out["runs"]
    assert out["invariants"]["effects_accounted"]["checked"] == out["runs"]
    assert_duplicate_caught(*matrix("sqlite_outbox", "outbox_worker:worker_new_key_per_delivery"))


def test_sqlite_outbox_crash_pairs_run_with_every_second_fault_where_the_declared_order_puts_it():
    # --depth 2 on a target with points of its own ended before its first run (an infrastructure
    # failure, exit 3): its points were looked up in the built-in hit order.
    code, out = matrix("sqlite_outbox", "outbox_worker:worker", None, "--depth", "2")
    assert (code, out["valid"], out["unknown"]) == (0, True, []), out["unknown"]
    assert all(not r["unfired"] for r in out["results"])
    order = ("before_accept", "after_accept", "before_deliver", "after_deliver", "before_mark", "after_mark")
    assert order == tuple(sorted(declared_points("sqlite_outbox", "outbox_worker"), key=order.index))
    for r in out["results"]:
        first, second = r["schedule"].split(",")
        if second.startswith("A@"):  # the hits form: A again, on a later hit when it comes first
            p1, p2 = first.split(".")[1].split(":")[0], second.split(".")[1].split(":")[0].split("#")[0]
            assert ("#2" in second) == (order.index(p2) <= order.index(p1)), r["schedule"]


def run_example_suite(pytester: pytest.Pytester, folder: str) -> pytest.RunResult:
    for name in os.listdir(os.path.join(EXAMPLES, folder)):
        if name.endswith(".py"):
            shutil.copy(os.path.join(EXAMPLES, folder, name), pytester.path / name)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-v",
                                         timeout=HANG_S)


def test_pg_queue_example_suite_passes_through_the_pytest_fixture(pytester, pg_dsn, monkeypatch):
    monkeypatch.setenv("KILLPOINT_PG_DSN", pg_dsn)
    result = run_example_suite(pytester, "pg_queue")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_a_new_key_per_attempt_is_caught_as_a_second_charge PASSED*"])


def test_sqlite_outbox_example_suite_passes_through_the_pytest_fixture(pytester):
    result = run_example_suite(pytester, "sqlite_outbox")
    result.assert_outcomes(passed=3 + 6)  # three tests, and the marked one's item per declared point
    result.stdout.fnmatch_lines(["*test_a_kill_between_delivery_and_mark_redelivers_under_the_same_key PASSED*",
                                 "*test_each_declared_point_is_its_own_test_item?before_mark? PASSED*"])
