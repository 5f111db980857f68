"""Crash-testing the shop's Celery tasks, the app as it is, with killpoint's pytest plugin.

Run from this folder, with a Redis on localhost (or KILLPOINT_REDIS_URL naming one): ``pytest``.
"""

import pytest

AS_WRITTEN = "celery:shop.tasks:order_flow"  # a new request id on every delivery of a task
FIXED = "celery:shop.tasks_fixed:order_flow"  # the order's key, the same on every delivery


@pytest.mark.killpoint(target=FIXED)  # one item per crash point: [received], [prerun], ..., [prerun-pause]
def test_every_crash_of_a_worker_is_recovered_without_a_second_charge(killpoint):
    # The crash has run before this body; the item fails if its verdict is not valid.
    assert killpoint.verdict.runs == 1


def test_a_task_delivered_again_after_its_result_was_stored_charges_the_card_twice(killpoint):
    # Worker A dies after Celery stored charge_card's result and before it acknowledged the message:
    # the message is delivered again, and the task, run again, sends a new request id.
    verdict = killpoint.run("A@charge_card.stored:kill", target=AS_WRITTEN)
    assert verdict.valid is False
    assert {v.invariant for v in verdict.violations} == {"no_duplicate_effects"}
