"""killpoint: crash-injection testing and verification for durable-execution workers.

The public surface. Everything else (``chaos``, ``harness``, ``reports``) is free to change inside.

    from killpoint import point, Session, RunConfig, parse_schedule

    with Session() as session:
        result = session.run(RunConfig(schedule=parse_schedule("A@charge.after_call:kill")))
        assert result.valid

Names are imported on first use: the pytest plugin loads this package in every session, and a
session that never runs a crash must not pay for the harness (multiprocess, HTTP, SQLite).
"""

from __future__ import annotations

import importlib
from typing import Any

from chaos import InvalidAction, InvalidSchedule, at, point
from chaos.schedule import Fault, Schedule
from chaos.schedule import parse as parse_schedule

__version__ = "0.1.0"

_LAZY = {
    "INVARIANTS": ("harness.checkers", "ALL"),
    "check_all": ("harness.checkers", "check_all"),
    "Result": ("harness.checkers.base", "Result"),
    "Verdict": ("harness.checkers.base", "Verdict"),
    "Violation": ("harness.checkers.base", "Violation"),
    "Event": ("harness.history", "Event"),
    "History": ("harness.history", "History"),
    "Evidence": ("harness.recovery", "Evidence"),
    "recover": ("harness.recovery", "recover"),
    "RunConfig": ("harness.run", "RunConfig"),
    "RunResult": ("harness.run", "RunResult"),
    "Session": ("harness.run", "Session"),
    "ReferenceWorker": ("harness.worker", "ReferenceWorker"),
    "Timing": ("harness.worker", "Timing"),
    "WorkerContext": ("harness.worker", "WorkerContext"),
    "Claim": ("harness.store.base", "Claim"),
    "LostResponse": ("harness.downstream", "LostResponse"),
    "CrashVerdict": ("killpoint.plugin", "CrashVerdict"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'killpoint' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(["Fault", "InvalidAction", "InvalidSchedule", "Schedule", "at", "parse_schedule",
                  "point", *_LAZY])
