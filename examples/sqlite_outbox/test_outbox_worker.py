"""Crash-testing the SQLite outbox relay with killpoint's pytest plugin: ``pytest examples/sqlite_outbox``."""

from __future__ import annotations

import pytest
from outbox_worker import POINTS


def test_the_outbox_survives_a_crash_at_every_declared_point(killpoint):
    verdict = killpoint.matrix(target="outbox_worker:worker")
    verdict.assert_valid()
    fired = {f.point for r in verdict.results for f in r.config.schedule.faults if r.fired[str(f)]}
    assert fired == set(POINTS)


def test_a_new_key_per_delivery_is_caught_as_a_second_charge(killpoint):
    verdict = killpoint.matrix(target="outbox_worker:worker_new_key_per_delivery")
    assert verdict.valid is False
    assert {v.invariant for v in verdict.violations} == {"no_duplicate_effects"}


def test_a_kill_between_delivery_and_mark_redelivers_under_the_same_key(killpoint):
    killpoint.run("A@charge.before_mark:kill", target="outbox_worker:worker").assert_valid()


@pytest.mark.killpoint(target="outbox_worker:worker")  # one item per declared point: [before_deliver] ...
def test_each_declared_point_is_its_own_test_item(killpoint):
    assert killpoint.verdict.runs == 1  # the item fails by itself if the crash was not recovered
