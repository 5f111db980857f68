"""Path exploration for the matrix: the hits a run really reaches, beyond the first of each point.

The single-fault matrix crashes worker A at the first hit of each point of each step: the first
attempt of the first instance A takes up. A retry after a transient failure, a compensation after a
declined charge, a third attempt after two 503s pass the same points again, on paths of their own,
and a bug that lives there (a fresh idempotency key on a compensation's second attempt) is never
crashed there. As path-exploring failpoint tools do, the matrix first makes one fault-free run with
worker A alone (:func:`discovery`), reads which points A passed in which order (:func:`trace`), and
crashes A at each later hit that ends a path no earlier hit took
(:func:`killpoint.chaos.generator.later_hits`).

A alone, because in a matrix run every other worker is held back until A's fault fired: A's hits
up to its fault are those of the fault-free run with A alone, so a scheduled ``#hit`` lands where
it was found. A hit that a run still does not reach is a fault that never fired: unknown, never valid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from killpoint import vocab
from killpoint.chaos.generator import Hit, hits_of, later_hits, path_schedules
from killpoint.chaos.schedule import Schedule
from killpoint.harness.history import History
from killpoint.harness.run import RunConfig, RunResult

__all__ = ["Exploration", "discovery", "explore_hits", "trace"]


def discovery(config: RunConfig) -> RunConfig:
    """The fault-free run whose hits are explored: ``config`` with no faults and worker A alone."""
    return dataclasses.replace(config, schedule=Schedule(), workers=1)


def trace(history: History, worker: str = "A") -> list[tuple[Any, Any, str]]:
    """The (instance, step, point) of each hit by ``worker`` (any incarnation), in history order."""
    mine = (worker, f"{worker}.")
    return [(e.data.get("instance"), e.data.get("step"), str(e.data.get("point")))
            for e in history.worker_events(vocab.POINT)
            if e.process == worker or e.process.startswith(mine[1])]


@dataclass(frozen=True)
class Exploration:
    """What the discovery run found and what the matrix will crash of it.

    ``reached``: every hit of A in the fault-free run (on the steps and points asked for);
    ``explored``: the later hits crashed (each a schedule of ``schedules``); ``left``: later hits
    the mode would crash but the bound (``--max-hits``) left out.
    """

    mode: str
    reached: tuple[Hit, ...]
    explored: tuple[Hit, ...]
    schedules: tuple[Schedule, ...]
    left: int
    discovery_valid: bool | None

    def to_json(self, never_fired: int) -> dict[str, Any]:
        """The JSON's ``hits``; ``never_fired``: how many explored hits a matrix run did not reach."""
        return {"mode": self.mode, "reached": len(self.reached), "explored": len(self.explored),
                "left": self.left, "never_fired": never_fired}


def explore_hits(result: RunResult, steps: tuple[str, ...], points: tuple[str, ...], mode: str,
                 limit: int | None) -> Exploration:
    """The later hits of A in the discovery run's ``result`` that ``mode`` crashes, at most
    ``limit`` of them, as single-fault schedules."""
    hits = [h for h in hits_of(trace(result.history)) if h.step in steps and h.point in points]
    later = later_hits(hits, steps, points, mode)
    schedules, left = path_schedules(later, limit)
    return Exploration(mode, tuple(hits), tuple(later[:len(schedules)]), tuple(schedules), left,
                       result.valid)
