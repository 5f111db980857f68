"""killpoint: crash-injection testing and verification for durable-execution workers.

The public surface. Everything else (``chaos``, ``harness``, ``reports``) is free to change inside.

    from killpoint import point, Session, RunConfig, parse_schedule

    with Session() as session:
        result = session.run(RunConfig(schedule=parse_schedule("A@charge.after_call:kill")))
        assert result.valid
"""

from __future__ import annotations

from chaos import InvalidAction, InvalidSchedule, at, point
from chaos.schedule import Fault, Schedule
from chaos.schedule import parse as parse_schedule
from harness.checkers import ALL as INVARIANTS
from harness.checkers import check_all
from harness.checkers.base import Result, Verdict, Violation
from harness.history import Event, History
from harness.recovery import Evidence, recover
from harness.run import RunConfig, RunResult, Session
from harness.worker import ReferenceWorker, Timing, WorkerContext

__version__ = "0.1.0"

__all__ = [
    "Event", "Evidence", "Fault", "History", "INVARIANTS", "InvalidAction", "InvalidSchedule",
    "ReferenceWorker", "Result", "RunConfig", "RunResult", "Schedule", "Session", "Timing", "Verdict",
    "Violation", "WorkerContext", "at", "check_all", "parse_schedule", "point", "recover",
]
