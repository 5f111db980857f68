"""Crash-testing the PostgreSQL job queue with killpoint's pytest plugin.

Run with ``pytest examples/pg_queue`` (PostgreSQL from ``KILLPOINT_PG_DSN``). The worker owns its
state, so killpoint judges its charges by the downstream ledger, its audit log (``history``) and its
final job states (``final_states``).
"""

from __future__ import annotations

import pytest

psycopg = pytest.importorskip("psycopg")

from queue_worker import DSN, POINTS  # noqa: E402


@pytest.fixture(autouse=True)
def postgres():
    try:
        psycopg.connect(DSN, connect_timeout=2).close()
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at KILLPOINT_PG_DSN ({exc})")


def test_the_queue_survives_a_crash_at_every_declared_point(killpoint):
    verdict = killpoint.matrix(target="queue_worker:worker")
    verdict.assert_valid()  # valid: no unknown run, so every scheduled fault fired
    fired = {f.point for r in verdict.results for f in r.config.schedule.faults if r.fired[str(f)]}
    assert fired == set(POINTS)


def test_a_new_key_per_attempt_is_caught_as_a_second_charge(killpoint):
    verdict = killpoint.matrix(target="queue_worker:worker_new_key_per_attempt")
    assert verdict.valid is False
    assert {v.invariant for v in verdict.violations} == {"no_duplicate_effects"}


def test_a_kill_before_the_ack_is_recovered_by_the_next_worker(killpoint):
    killpoint.run("A@before_ack:kill", target="queue_worker:worker").assert_valid()
