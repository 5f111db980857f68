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

With ``--recovery-paths`` it goes one level deeper: each kill is run again with A alone, restarted
under its own identity (:func:`recovery_probe`), and A is killed a second time at each hit of its
recovery that ends a path not seen before (:func:`explore_recovery`): the retry after the crash,
the recovery of the recovery.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from killpoint import vocab
from killpoint.chaos.generator import Hit, Planned, hits_of, later_hits, path_schedules
from killpoint.chaos.schedule import Schedule
from killpoint.harness.events import PointHit
from killpoint.harness.history import History
from killpoint.harness.run import RunConfig, RunResult

__all__ = ["Exploration", "discovery", "explore_hits", "explore_recovery", "kills", "once_per_worker",
           "points_only", "recovery_probe", "stepless_points", "trace"]


def discovery(config: RunConfig) -> RunConfig:
    """The fault-free run whose hits are explored: ``config`` with no faults and worker A alone."""
    return dataclasses.replace(config, schedule=Schedule(), workers=1)


def trace(history: History, worker: str = "A") -> list[tuple[Any, Any, str]]:
    """The (instance, step, point) of each hit by ``worker`` (any incarnation), in history order."""
    return [(e.instance, e.step, e.point) for e in history.typed(PointHit)
            if e.process == worker or e.process.startswith(f"{worker}.")]


@dataclass(frozen=True)
class Exploration:
    """What the discovery runs found and what the matrix crashes of it.

    ``reached``: every hit of A in the fault-free run (on the steps and points asked for);
    ``explored``: the later hits crashed, each with its schedule in ``plans`` (a kill at a later
    hit of the fault-free run; with ``--recovery-paths`` also a first kill and then a second one
    at a hit of A's recovery under its own identity); ``left``: hits the mode would crash but the
    bound (``--max-hits``) left out; ``probes``: the recovery probes run.
    """

    mode: str
    reached: tuple[Hit, ...]
    explored: tuple[Hit, ...]
    plans: tuple[Planned, ...]
    left: int
    probes: int = 0
    recovery: int = 0  # of ``explored``: hits on a recovery path
    discovery: bool | None = True  # the fault-free run's verdict (when not True, it is a result)

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        return tuple(p.schedule for p in self.plans)

    def to_json(self, never_fired: int) -> dict[str, Any]:
        """The JSON's ``hits``; ``never_fired``: how many explored hits a matrix run did not reach."""
        return {"mode": self.mode, "reached": len(self.reached), "explored": len(self.explored),
                "recovery": self.recovery, "left": self.left, "probes": self.probes,
                "never_fired": never_fired, "discovery_valid": self.discovery}


def _seen(hits: Iterable[Hit]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(h.step, h.point, h.path) for h in hits}


def explore_hits(result: RunResult, steps: tuple[str, ...], points: tuple[str, ...], mode: str,
                 limit: int | None) -> Exploration:
    """The later hits of A in the discovery run's ``result`` that ``mode`` crashes, at most
    ``limit`` of them, as single-fault schedules."""
    hits = [h for h in hits_of(trace(result.history)) if h.step in steps and h.point in points]
    later = later_hits(hits, steps, points, mode)
    schedules, left = path_schedules(later, limit)
    return Exploration(mode, tuple(hits), tuple(later[:len(schedules)]),
                       tuple(Planned(s) for s in schedules), left)


def kills(schedules: Iterable[Schedule]) -> list[Schedule]:
    """The single-fault schedules whose fault is a kill of A: those a recovery follows."""
    return [s for s in schedules if len(s.faults) == 1 and s.faults[0].worker == "A"
            and str(s.faults[0].actions) == "kill"]


def points_only(result: RunResult) -> RunResult:
    """``result`` with only its point hits kept: what :func:`explore_recovery` reads of a probe."""
    events = tuple(e for e in result.history.events if e.kind == vocab.POINT)
    return dataclasses.replace(result, history=dataclasses.replace(result.history, events=events))


def recovery_probe(config: RunConfig) -> RunConfig:
    """The run that shows what a kill reveals: ``config``'s one kill with A alone, restarted under
    its own identity, so that its recovery's hits are counted as a second fault of A counts them
    (in a matrix run of both faults every other worker waits until the second one fired)."""
    return dataclasses.replace(config, workers=1, same_identity=1.0)


def explore_recovery(found: Exploration, probes: Sequence[RunResult], steps: tuple[str, ...],
                     points: tuple[str, ...], limit: int | None) -> Exploration:
    """``found`` with, for each probe (a kill, then A's recovery alone), a second kill at each hit
    after the first fault that ends a path no earlier hit took (the fault-free run's, an earlier
    probe's), at most ``limit`` later hits in all."""
    seen = _seen(found.reached) | _seen(found.explored)
    room = None if limit is None else max(limit - len(found.explored), 0)
    added: list[tuple[Hit, Planned]] = []
    wanted = 0
    for probe in probes:
        first = probe.config.schedule.faults[0]
        hits = hits_of(trace(probe.history))
        fired = next((i for i, h in enumerate(hits) if (h.step, h.point, h.hit) ==
                      (first.step, first.point, first.hit)), None)
        if fired is None or probe.fired.get(str(first), 0) == 0:
            continue  # the kill never fired: that run says so (unknown), and reveals nothing
        for h in hits[fired + 1:]:
            key = (h.step, h.point, h.path)
            if key in seen or h.step not in steps or h.point not in points:
                continue
            seen.add(key)
            wanted += 1
            if room is None or len(added) < room:
                added.append((h, Planned(Schedule((first, h.fault())), same_identity=1.0)))
    return dataclasses.replace(found, explored=found.explored + tuple(h for h, _ in added),
                               plans=found.plans + tuple(p for _, p in added),
                               left=found.left + wanted - len(added), probes=len(probes),
                               recovery=len(added))


def stepless_points(result: RunResult, points: Iterable[str]) -> tuple[str, ...]:
    """The points of ``points`` that worker A passed in the fault-free run only outside any step (a
    queue's claim loop before it knows the job: no ``ctx.at``): a fault at such a point *of a step*
    would never fire."""
    at_step: dict[str, bool] = {}
    for _, step, point in trace(result.history):
        at_step[point] = at_step.get(point, False) or step is not None
    return tuple(p for p in points if at_step.get(p) is False)


def once_per_worker(configs: Sequence[RunConfig], stepless: Iterable[str]) -> list[RunConfig]:
    """``configs`` with each single fault at a step-less point moved out of its step (``A@before_claim``,
    not ``A@charge.before_claim``, which never fires), once: the per-step copies of one fault become
    one run."""
    lone = frozenset(stepless)
    out: list[RunConfig] = []
    seen: set[str] = set()
    for config in configs:
        faults = config.schedule.faults
        if len(faults) == 1 and faults[0].point in lone and faults[0].step is not None:
            config = dataclasses.replace(config, schedule=Schedule((dataclasses.replace(faults[0], step=None),)))
        text = str(config.schedule)
        if text not in seen:
            seen.add(text)
            out.append(config)
    return out
