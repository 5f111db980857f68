"""killpoint: crash-injection testing and verification for durable-execution workers.

The public surface. Everything else (``chaos``, ``harness``, ``reports``) is free to change inside.

    from killpoint import point, Session, RunConfig, parse_schedule

    with Session() as session:
        result = session.run(RunConfig(schedule=parse_schedule("A@charge.after_call:kill")))
        assert result.valid

Names are imported on first use: the pytest plugin loads this package in every session, and a
session that never runs a crash must not pay for the harness (multiprocess, HTTP, SQLite). At load
time this module imports only :mod:`killpoint.errors` (which imports nothing); every other name,
``chaos`` ones included, is looked up on first access. A name whose module is missing is an
ImportError naming it, never a silent ``None``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The errors a library caller can meet; the CLI's BadInput stays in killpoint.errors.
from killpoint.errors import (InfrastructureError as InfrastructureError, InvalidAction as InvalidAction,
                              InvalidConfig as InvalidConfig, InvalidPoint as InvalidPoint,
                              InvalidEvent as InvalidEvent, InvalidSchedule as InvalidSchedule,
                              InvalidStore as InvalidStore,
                              InvalidTarget as InvalidTarget, InvalidWorkload as InvalidWorkload,
                              KillpointError as KillpointError, KillpointUnavailable as KillpointUnavailable,
                              KillpointWarning as KillpointWarning,
                              LostResponse as LostResponse, OutcomeUnknown as OutcomeUnknown,
                              StoreError as StoreError, StoreUnavailable as StoreUnavailable,
                              StoreUnreachable as StoreUnreachable, UnknownScenario as UnknownScenario)

__version__ = "0.1.0"

_LAZY = {
    "at": ("killpoint.chaos.points", "at"),
    "point": ("killpoint.chaos.points", "point"),
    "sometimes": ("killpoint.chaos.points", "sometimes"),
    "Fault": ("killpoint.chaos.schedule", "Fault"),
    "Schedule": ("killpoint.chaos.schedule", "Schedule"),
    "parse_schedule": ("killpoint.chaos.schedule", "parse"),
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
    "CrashVerdict": ("killpoint.plugin", "CrashVerdict"),
    "target": ("killpoint.harness.declaration", "target"),
    "Target": ("killpoint.harness.declaration", "Target"),
    "TargetRun": ("killpoint.harness.declaration", "TargetRun"),
    "Workload": ("killpoint.harness.workload", "Workload"),
    "InstanceSpec": ("killpoint.harness.workload", "InstanceSpec"),
    "StepSpec": ("killpoint.harness.workload", "StepSpec"),
    "DownstreamClient": ("killpoint.harness.downstream", "DownstreamClient"),
}

if TYPE_CHECKING:  # what a type checker and an editor see: the same names, imported eagerly
    from killpoint.chaos.points import at as at, point as point, sometimes as sometimes
    from killpoint.chaos.schedule import Fault as Fault, Schedule as Schedule, parse as parse_schedule
    from killpoint.harness.checkers import ALL as INVARIANTS, check_all as check_all
    from killpoint.harness.checkers.base import Result as Result, Verdict as Verdict, Violation as Violation
    from killpoint.harness.declaration import Target as Target, TargetRun as TargetRun, target as target
    from killpoint.harness.downstream import DownstreamClient as DownstreamClient
    from killpoint.harness.history import Event as Event, History as History
    from killpoint.harness.recovery import Evidence as Evidence, recover as recover
    from killpoint.harness.run import RunConfig as RunConfig, RunResult as RunResult, Session as Session
    from killpoint.harness.store.base import Claim as Claim
    from killpoint.harness.worker import (ReferenceWorker as ReferenceWorker, Timing as Timing,
                                          WorkerContext as WorkerContext)
    from killpoint.harness.workload import (InstanceSpec as InstanceSpec, StepSpec as StepSpec,
                                            Workload as Workload)
    from killpoint.plugin import CrashVerdict as CrashVerdict


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


# A literal list, so that type checkers know what is exported (tests/test_api.py keeps it whole).
__all__ = ["Claim", "CrashVerdict", "DownstreamClient", "Event", "Evidence", "Fault", "History",
           "INVARIANTS", "InfrastructureError", "InstanceSpec", "InvalidAction", "InvalidConfig", "InvalidEvent",
           "InvalidPoint", "InvalidSchedule", "InvalidStore", "InvalidTarget", "InvalidWorkload", "KillpointError",
           "KillpointUnavailable", "KillpointWarning", "LostResponse", "OutcomeUnknown", "ReferenceWorker", "Result",
           "RunConfig", "RunResult", "Schedule",
           "Session", "StepSpec", "StoreError", "StoreUnavailable", "StoreUnreachable", "Target", "TargetRun",
           "Timing", "UnknownScenario", "Verdict", "Violation", "WorkerContext", "Workload", "at",
           "check_all", "parse_schedule", "point", "recover", "sometimes", "target"]
