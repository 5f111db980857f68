"""Crash-testing the shop worker with killpoint's pytest plugin.

Run with ``pytest examples/user_worker`` (add ``-n 2`` to spread the items over two processes).
"""

from __future__ import annotations

import pytest

# The shop charges one order: its target declares the "single" workload (one order, one charge step).
SHOP = {"target": "shop_worker:run"}


@pytest.mark.killpoint(**SHOP)  # no points=: one item per declared crash point, [before_claim] ...
def test_every_crash_point_is_recovered_without_a_second_charge(killpoint):
    # The crash has run before this body; the test fails if its verdict is not valid.
    assert killpoint.verdict.runs == 1


def test_a_worker_frozen_past_its_lease_cannot_commit_over_its_successor(killpoint):
    # A is frozen (SIGSTOP) right after the payment call, long enough for B to take the step over
    # with a newer fence; when A wakes up, its commit must be refused.
    killpoint.run("A@charge.after_call:1*pause", **SHOP).assert_valid()


@pytest.mark.killpoint(points=["after_call"], action="1*pause", check=False,
                       target="shop_worker:run_without_fencing")
def test_killpoint_catches_a_commit_without_fencing(killpoint):
    # check=False: this test judges the verdict itself, because this worker must be caught.
    assert killpoint.verdict.valid is False
    assert "stale_writes_rejected" in {v.invariant for v in killpoint.verdict.violations}
