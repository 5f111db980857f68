"""What the checker modules of this package share: how a result is made, how an event names its step,
and the indexes several checkers read. Not API: the checkers are what this package exports."""

from __future__ import annotations

from typing import Any, Iterable

from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import PointHit, Request, StoreEvent, TypedEvent, WorkerOp
from killpoint.harness.history import History

DEFAULT_MAX_ATTEMPTS = 3

StepId = tuple[Any, Any]
# The failpoint actions that stall a worker (chaos.actions spells them so).
HANG = "hang"
SLEEP = "sleep"


def _result(name: str, checked: bool, violations: list[Violation], detail: str = "") -> Result:
    """Build a Result; a history with nothing to judge is valid but explicitly not checked."""
    if violations:
        return Result(name, False, True, tuple(violations),
                      detail or f"{len(violations)} violation(s)")
    if not checked:
        return Result(name, True, False, (), detail or "nothing to judge")
    return Result(name, True, True, (), detail)


def _step_of(e: StoreEvent | WorkerOp | PointHit) -> StepId:
    return (e.instance, e.step)


def _effect_step(e: Request) -> StepId:
    return (e.meta.instance, e.meta.step)


def _last_store(history: History) -> dict[StepId, StoreEvent]:
    """Each step's last store event."""
    return {sid: evs[-1] for sid, evs in history.store_by_step().items()}


def _in_order(violations: list[Violation]) -> list[Violation]:
    """Violations found step by step, put back in the order of the events that revealed them (the
    latest event of each proof), as a walk over the whole history in order would have found them."""
    return sorted(violations, key=lambda found: max(found.events, default=-1))


def _final_states(history: History) -> dict[StepId, str]:
    return {(row["instance"], row["step"]): row["state"] for row in history.final}


def _idx(events: Iterable[TypedEvent | None]) -> tuple[int, ...]:
    return tuple(sorted({e.index for e in events if e is not None}))


def _at(e: TypedEvent) -> str:
    return f"event {e.index}"
