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

from killpoint.chaos import at, point
from killpoint.chaos.schedule import Fault, Schedule
from killpoint.chaos.schedule import parse as parse_schedule
from killpoint.errors import (InvalidAction, InvalidPoint, InvalidSchedule, InvalidStore, InvalidTarget,
                              InvalidWorkload, KillpointError, OutcomeUnknown, StoreError, StoreUnavailable,
                              UnknownScenario)

# The errors a library caller can meet; the CLI's BadInput stays in killpoint.errors.
_ERRORS = ["InvalidAction", "InvalidPoint", "InvalidSchedule", "InvalidStore", "InvalidTarget",
           "InvalidWorkload", "KillpointError",
           "OutcomeUnknown", "StoreError", "StoreUnavailable", "UnknownScenario"]

__version__ = "0.1.0"

_LAZY = {
    "INVARIANTS": ("killpoint.harness.checkers", "ALL"),
    "check_all": ("killpoint.harness.checkers", "check_all"),
    "Result": ("killpoint.harness.checkers.base", "Result"),
    "Verdict": ("killpoint.harness.checkers.base", "Verdict"),
    "Violation": ("killpoint.harness.checkers.base", "Violation"),
    "Event": ("killpoint.harness.history", "Event"),
    "History": ("killpoint.harness.history", "History"),
    "Evidence": ("killpoint.harness.recovery", "Evidence"),
    "recover": ("killpoint.harness.recovery", "recover"),
    "RunConfig": ("killpoint.harness.run", "RunConfig"),
    "RunResult": ("killpoint.harness.run", "RunResult"),
    "Session": ("killpoint.harness.run", "Session"),
    "ReferenceWorker": ("killpoint.harness.worker", "ReferenceWorker"),
    "Timing": ("killpoint.harness.worker", "Timing"),
    "WorkerContext": ("killpoint.harness.worker", "WorkerContext"),
    "Claim": ("killpoint.harness.store.base", "Claim"),
    "LostResponse": ("killpoint.harness.downstream", "LostResponse"),
    "CrashVerdict": ("killpoint.plugin", "CrashVerdict"),
    "target": ("killpoint.harness.declaration", "target"),
    "Target": ("killpoint.harness.declaration", "Target"),
    "TargetRun": ("killpoint.harness.declaration", "TargetRun"),
    "Workload": ("killpoint.harness.workload", "Workload"),
    "InstanceSpec": ("killpoint.harness.workload", "InstanceSpec"),
    "StepSpec": ("killpoint.harness.workload", "StepSpec"),
    "DownstreamClient": ("killpoint.harness.downstream", "DownstreamClient"),
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


__all__ = sorted(["Fault", "Schedule", "at", "parse_schedule", "point", *_ERRORS, *_LAZY])
