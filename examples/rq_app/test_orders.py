"""Crash-testing the shop's RQ jobs, as they are, with killpoint's pytest plugin.

Run from this folder, with a Redis on localhost (or KILLPOINT_REDIS_URL naming one): ``pytest``.
"""

import pytest

AS_WRITTEN = "rq:orders.jobs:place_order"  # a new request id every time a job runs
FIXED = "rq:orders.jobs_fixed:place_order"  # the order's key, the same every time


@pytest.mark.killpoint(target=FIXED)  # one item per crash point: [started], [after_call], ..., [after_call-pause]
def test_every_crash_of_a_worker_is_recovered_without_a_second_charge(killpoint):
    assert killpoint.verdict.runs == 1


def test_a_job_run_again_after_its_worker_died_charges_the_card_twice(killpoint):
    # Worker A dies right after the payment service charged the card (the job's own crash point):
    # RQ fails the job as abandoned once its heartbeat expired and, with retries left, runs it again.
    verdict = killpoint.run("A@charge_card.after_call:kill", target=AS_WRITTEN)
    assert verdict.valid is False
    assert {v.invariant for v in verdict.violations} == {"no_duplicate_effects"}
