"""The order as a Temporal workflow, and three changes to it that a deployed worker cannot replay.

``OrderWorkflow`` reserves the stock, then charges the card; when the charge is refused for good it
releases the reservation (a saga) and fails. Each step is one activity whose type is the step's name
and whose activity id is the step's name too (``reserve/compensate`` for the release), so
``workflow_id:activity_id`` names one step of one order in every attempt.

The variants keep the workflow's type name (``order``), as a deploy of new code under the old name
does, and change what it schedules: ``ReorderedOrderWorkflow`` charges before it reserves,
``AddedStepOrderWorkflow`` checks for fraud between the two, ``RemovedStepOrderWorkflow`` no longer
reserves. Replaying a history recorded from ``OrderWorkflow`` against any of them is
non-deterministic; :mod:`killpoint.harness.servers.temporal_replay` reports it as a violation of
``replay_compatible``.

This module imports only the SDK and the standard library: Temporal's workflow sandbox re-imports it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

TASK_QUEUE = "killpoint-orders"
RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=100), backoff_coefficient=1.0,
                    maximum_attempts=3)


async def _step(order: dict[str, Any], name: str, *, activity: str | None = None,
                activity_id: str | None = None) -> Any:
    # A run may shorten the activity timeout (a killed worker's attempt is retried once it expires)
    # and set the retry policy's maximum attempts; replay compares neither, so the recorded
    # histories replay either way.
    timeout = timedelta(milliseconds=order.get("start_to_close_ms", 10000))
    retry = RETRY if "max_attempts" not in order else RetryPolicy(
        initial_interval=RETRY.initial_interval, backoff_coefficient=1.0,
        maximum_attempts=order["max_attempts"])  # 0: unlimited, Temporal's default
    return await workflow.execute_activity(
        activity or name, order["steps"].get(name, {}), activity_id=activity_id or name,
        start_to_close_timeout=timeout, retry_policy=retry)


@workflow.defn(name="order")
class OrderWorkflow:
    @workflow.run
    async def run(self, order: dict[str, Any]) -> str:
        await _step(order, "reserve")
        try:
            await _step(order, "charge")
        except ActivityError:
            await _step(order, "reserve", activity="release", activity_id="reserve/compensate")
            raise
        return "done"


@workflow.defn(name="order")
class ReorderedOrderWorkflow:
    @workflow.run
    async def run(self, order: dict[str, Any]) -> str:
        await _step(order, "charge")
        await _step(order, "reserve")
        return "done"


@workflow.defn(name="order")
class AddedStepOrderWorkflow:
    @workflow.run
    async def run(self, order: dict[str, Any]) -> str:
        await _step(order, "reserve")
        await _step(order, "fraud_check")
        await _step(order, "charge")
        return "done"


@workflow.defn(name="order")
class RemovedStepOrderWorkflow:
    @workflow.run
    async def run(self, order: dict[str, Any]) -> str:
        await _step(order, "charge")
        return "done"


VARIANTS = {"unchanged": OrderWorkflow, "reordered": ReorderedOrderWorkflow,
            "added": AddedStepOrderWorkflow, "removed": RemovedStepOrderWorkflow}
