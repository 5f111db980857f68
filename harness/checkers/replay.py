"""``replay_compatible``: the workflow code still replays the histories recorded from earlier runs.

A durable-execution server that replays (Temporal) re-runs the workflow code over its recorded event
history whenever a worker picks a workflow up; code that now schedules other steps than the history
recorded fails with a non-determinism error, and every open workflow of that type is stuck. The
targets that replay write one ``replay`` event per recorded history (``history``, ``workflow``,
``outcome`` = ``ok`` | ``nondeterministic`` | ``error``, ``detail``); see
:mod:`killpoint.harness.servers.temporal_replay`.

Pure, like every checker: it only reads the events.
"""

from __future__ import annotations

import os

from killpoint import vocab as v
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import WorkerEvent
from killpoint.harness.history import History

NAME = "replay_compatible"


def replay_compatible(history: History) -> Result:
    """Each recorded history replays against the current workflow code without non-determinism.

    A replay that could not run at all (``error``: an unreadable history, the SDK failing) makes
    the result unknown, never valid. A history with no replay event has nothing to judge.
    """
    replays = [e for e in history.typed(WorkerEvent) if e.kind == v.REPLAYED]
    if not replays:
        return Result(NAME, True, False, (), "no recorded workflow history was replayed")
    seen: dict[tuple[str | None, str | None], list[int]] = {}
    outcome: dict[tuple[str | None, str | None], tuple[str, str]] = {}
    for e in replays:
        key = (e.history, e.workflow)
        seen.setdefault(key, []).append(e.index)
        # Any non-deterministic replay of a history counts, whichever worker ran it.
        if outcome.get(key, ("",))[0] != "nondeterministic":
            outcome[key] = (str(e.outcome), e.detail or "")
    violations = []
    errors = []
    for key, (result, detail) in outcome.items():
        hist_name, workflow = key
        if result == "nondeterministic":
            instance = os.path.splitext(str(hist_name))[0]
            violations.append(Violation(
                NAME, instance, None,
                f"the recorded history {hist_name} does not replay against {workflow}: {detail}",
                tuple(seen[key])))
        elif result != "ok":
            errors.append(f"{hist_name} against {workflow}: {detail or result}")
    if violations:
        return Result(NAME, False, True, tuple(violations), f"{len(violations)} of {len(outcome)} "
                      f"recorded histories do not replay")
    if errors:
        return Result(NAME, None, True, (), "replay could not run: " + "; ".join(errors))
    return Result(NAME, True, True, (), f"{len(outcome)} recorded histories replay")
