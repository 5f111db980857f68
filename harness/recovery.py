"""Recovery as a pure decision table: the same evidence always gives the same action."""

from __future__ import annotations

from dataclasses import dataclass

WAIT = "wait"
RECORD_COMPLETION = "record_completion"
RECORD_FAILURE = "record_failure"
MANUAL_REVIEW = "manual_review"
EXHAUSTED = "exhausted"
RETRY_SAME_ACTIVITY = "retry_same_activity"

ACTIONS = (WAIT, RECORD_COMPLETION, RECORD_FAILURE, MANUAL_REVIEW, EXHAUSTED, RETRY_SAME_ACTIVITY)


@dataclass(frozen=True)
class Evidence:
    lease_expired: bool
    receipt: str | None  # None, "succeeded" or "failed_permanent"
    retry_safe: bool
    attempts: int  # attempts already made before this decision
    max_attempts: int


def recover(e: Evidence) -> str:
    """Decide what a recovering worker does with a step whose outcome it must establish.

    The order matters: a live lease is never taken; a known outcome is recorded, never redone; an
    unsafe activity with an unknown outcome goes to manual review, never to a retry.
    """
    if not e.lease_expired:
        return WAIT
    if e.receipt == "succeeded":
        return RECORD_COMPLETION
    if e.receipt == "failed_permanent":
        return RECORD_FAILURE
    if not e.retry_safe:
        return MANUAL_REVIEW
    if e.attempts >= e.max_attempts:
        return EXHAUSTED
    return RETRY_SAME_ACTIVITY
