"""The verdicts of killpoint's own runs, pinned: a change made for speed (or any change that does not
mean to) leaves every schedule, verdict, fired fault, worker count and violation as it was.

Each file in ``tests/verdicts/`` holds what ``benchmarks/fingerprint.py --only LABEL`` printed for
one command: one line a run (schedule, verdict, each fault's fire count, the unfired faults, how
many workers it started, which worker fired which action where) and one a violation. Nothing that
moves with the machine's speed is in them (durations, how often a point was merely passed). A
change that means to change verdicts regenerates the file it changes and says why.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED = os.path.join(ROOT, "tests", "verdicts")


def _fingerprint_module():
    spec = importlib.util.spec_from_file_location("killpoint_fingerprint",
                                                  os.path.join(ROOT, "benchmarks", "fingerprint.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FP = _fingerprint_module()


def _run(label: str, pg: str) -> list[str]:
    argv, example = FP.commands(pg)[label]
    assert example is None
    done = subprocess.run([sys.executable, "-c", "import sys; from killpoint._main import main; sys.exit(main())",
                           *argv, "--json", "-q", "--report", "never"], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return FP.fingerprint(label, json.loads(done.stdout))


@pytest.mark.parametrize("label", ["single", "orders", "mutant", "depth2-small"])
def test_the_verdicts_of_a_matrix_are_the_pinned_ones(label):
    """The single-step and default matrices of the reference, a mutant's matrix (its violations
    too) and a slice of ``--depth 2``, on SQLite: run by run as pinned."""
    _check(label, _run(label, ""))


def test_the_verdicts_on_postgresql_with_terminate_are_the_pinned_ones(pg_dsn):
    """The single-step matrix on PostgreSQL with kill, pause and terminate: run by run as pinned."""
    _check("pg-single", _run("pg-single", pg_dsn))


def _check(label: str, got: list[str]) -> None:
    with open(os.path.join(PINNED, f"{label}.txt")) as fh:
        pinned = fh.read().splitlines()
    diff = "\n".join(difflib.unified_diff(pinned, got, "pinned", "now", lineterm="", n=0))
    assert got == pinned, f"the verdicts of {label} changed:\n{diff}"
