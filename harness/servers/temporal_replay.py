"""Replay recorded Temporal histories against the current workflow code.

A Temporal worker that picks up a workflow task replays the workflow's whole event history through
the workflow code it runs now; code that schedules other commands than the history recorded (an
activity reordered, added or removed) fails that task with a non-determinism error, and the
workflow is stuck until the code is fixed. ``replay(workflow)`` does the same offline with the SDK's
``temporalio.worker.Replayer`` over the histories recorded from real runs (the package's
``temporal_histories`` folder, made by :mod:`killpoint.harness.servers.record_temporal`).

Each replay becomes one ``replay`` event in a worker's journal -- ``history`` (the file's name),
``workflow`` (the class replayed), ``outcome`` (``ok``, ``nondeterministic``, or ``error`` when the
replay could not run at all) and ``detail`` -- and the ``replay_compatible`` invariant judges them.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["HISTORIES_DIR", "Replayed", "histories", "replay"]

HISTORIES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "temporal_histories")
OK = "ok"
NONDETERMINISTIC = "nondeterministic"
ERROR = "error"


@dataclass(frozen=True)
class Replayed:
    history: str
    workflow: str
    outcome: str  # ok | nondeterministic | error
    detail: str = ""

    def event(self) -> dict[str, Any]:
        return {"history": self.history, "workflow": self.workflow, "outcome": self.outcome,
                "detail": self.detail[:500]}


def histories(folder: str = HISTORIES_DIR) -> list[str]:
    """The recorded histories, sorted; an empty or missing folder is an error, never a pass."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    if not names:
        raise FileNotFoundError(f"no recorded Temporal history in {folder}: record them with "
                                f"python -m killpoint.harness.servers.record_temporal")
    return [os.path.join(folder, n) for n in names]


def replay(workflow: type, paths: list[str] | None = None) -> list[Replayed]:
    """Replay each recorded history against ``workflow`` (a ``@workflow.defn`` class)."""
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer
    from temporalio.workflow import NondeterminismError

    paths = histories() if paths is None else paths
    name = f"{workflow.__module__}.{workflow.__qualname__}"

    async def one(replayer: Any, path: str) -> Replayed:
        base = os.path.basename(path)
        try:
            with open(path) as f:
                text = f.read()
            wid = os.path.splitext(base)[0]
            result = await replayer.replay_workflow(WorkflowHistory.from_json(wid, text),
                                                    raise_on_replay_failure=False)
        except Exception as exc:  # unreadable history, SDK failure: the check could not run
            return Replayed(base, name, ERROR, f"{type(exc).__name__}: {exc}")
        failure = result.replay_failure
        if failure is None:
            return Replayed(base, name, OK)
        if isinstance(failure, NondeterminismError):
            # The SDK wraps the core's message ("[TMPRL1100] Nondeterminism error: ...") in a dump
            # of the failed activation; keep the message.
            found = re.search(r'message: "((?:[^"\\]|\\.)*)"', str(failure))
            return Replayed(base, name, NONDETERMINISTIC, found.group(1) if found else str(failure))
        return Replayed(base, name, ERROR, f"{type(failure).__name__}: {failure}")

    async def all_of() -> list[Replayed]:
        from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

        # The core logs each failed workflow task as a warning; the result says it already.
        quiet = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
            filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))
        replayer = Replayer(workflows=[workflow], runtime=quiet)
        return [await one(replayer, p) for p in paths]

    return asyncio.run(all_of())
