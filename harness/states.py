"""The step states and the one table of allowed transitions.

The store refuses a write whose transition is not here, and the ``legal_transitions`` checker judges
histories against the same table, so the two can never disagree.
"""

from __future__ import annotations

PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
WAITING_APPROVAL = "waiting_approval"
RETRY_SCHEDULED = "retry_scheduled"
UNKNOWN = "unknown"
FAILED = "failed"
COMPENSATING = "compensating"
COMPENSATED = "compensated"
CANCELLED = "cancelled"
MANUAL = "manual_intervention"

STATES = (PENDING, RUNNING, SUCCEEDED, WAITING_APPROVAL, RETRY_SCHEDULED, UNKNOWN, FAILED,
          COMPENSATING, COMPENSATED, CANCELLED, MANUAL)

# Invariant: a state missing from the keys is terminal. running -> running and
# compensating -> compensating are lease takeovers (a new fence, the same state).
TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({RUNNING, WAITING_APPROVAL, CANCELLED}),
    WAITING_APPROVAL: frozenset({PENDING, CANCELLED}),
    RUNNING: frozenset({RUNNING, SUCCEEDED, FAILED, RETRY_SCHEDULED, UNKNOWN, MANUAL, WAITING_APPROVAL}),
    RETRY_SCHEDULED: frozenset({RUNNING, CANCELLED}),
    UNKNOWN: frozenset({RUNNING, SUCCEEDED, FAILED, MANUAL}),
    SUCCEEDED: frozenset({COMPENSATING}),
    COMPENSATING: frozenset({COMPENSATING, COMPENSATED, MANUAL}),
    # Only an operator event moves a step out of manual review (the manual_stable invariant).
    MANUAL: frozenset({SUCCEEDED, FAILED, CANCELLED, RETRY_SCHEDULED, COMPENSATED}),
}

# States a worker may claim from (the lease decides whether it may claim now).
CLAIMABLE = frozenset({PENDING, RETRY_SCHEDULED, UNKNOWN, RUNNING, COMPENSATING})
# States in which nothing more happens without an outside event.
SETTLED = frozenset({SUCCEEDED, FAILED, COMPENSATED, CANCELLED, MANUAL, WAITING_APPROVAL})


def allowed(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())
