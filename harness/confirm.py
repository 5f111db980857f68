"""Confirming a counterexample before anyone is shown it.

A search sees one run fail; a person given its replay line expects it to fail again. Runs are real
processes, so timing can make one run fail that the same schedule passes the next time. A
counterexample is therefore *confirmed*: replayed :data:`REPLAYS` times, and kept only when every
replay failed. Then each fault is dropped in turn, and a smaller schedule that still fails every
replay replaces it, down to the schedule with no fault at all (a worker that fails with no fault
needs none), so what is printed is the smallest schedule that fails every time -- never one that
failed once, and never a fault the failure did not need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from killpoint.chaos.schedule import Schedule
from killpoint.harness.run import RunConfig, RunResult

REPLAYS = 5


@dataclass(frozen=True)
class Confirmed:
    """A schedule replayed ``replays`` times; ``failed`` of them were violations."""

    config: RunConfig
    result: RunResult  # the last failing replay (its report and replay line)
    replays: int
    failed: int

    @property
    def reliable(self) -> bool:
        return self.failed == self.replays


RunMany = Callable[[Sequence[RunConfig]], Iterator[RunResult]]


def replay(run: Callable[[RunConfig], RunResult], config: RunConfig, *,
           replays: int = REPLAYS, stop_at_pass: bool = False,
           run_many: RunMany | None = None) -> tuple[int, int, RunResult | None]:
    """Run ``config`` ``replays`` times: ``(runs, failed, last failing result)``. With
    ``stop_at_pass`` it stops at the first run that is not a violation (it cannot be reliable).

    ``run_many`` (as :meth:`Session.run_many <killpoint.harness.run.Session.run_many>` with its
    jobs) makes the replays side by side; they are counted in order, exactly as one at a time,
    and those still running after a stop are ended uncounted."""
    failed, runs, last = 0, 0, None
    results = run_many([config] * replays) if run_many is not None else (run(config) for _ in range(replays))
    try:
        for result in results:
            runs += 1
            if result.valid is False:
                failed += 1
                last = result
            elif stop_at_pass:
                break
    finally:
        close = getattr(results, "close", None)  # a stop ends the replays still running
        if close is not None:
            close()
    return runs, failed, last


def without(schedule: Schedule, index: int) -> Schedule:
    return Schedule(tuple(f for i, f in enumerate(schedule.faults) if i != index))


def confirm(run: Callable[[RunConfig], RunResult], candidates: Iterable[RunConfig], *,
            replays: int = REPLAYS, run_many: RunMany | None = None) -> tuple[Confirmed | None, list[Confirmed]]:
    """The smallest schedule, among ``candidates`` (smallest first) and what dropping faults from
    them leaves, that failed all ``replays`` replays; and every candidate's tally as tried.

    A candidate that passes a replay is given up at once (it cannot fail every time); the others
    are shrunk greedily, one fault at a time, keeping a smaller schedule only when it too fails
    every replay. ``run_many`` makes each candidate's replays side by side (see :func:`replay`).
    """
    tried: list[Confirmed] = []
    best: Confirmed | None = None
    for config in sorted(candidates, key=lambda c: (len(c.schedule.faults), len(str(c.schedule)))):
        if best is not None and len(config.schedule.faults) >= len(best.config.schedule.faults):
            break
        runs, failed, last = replay(run, config, replays=replays, stop_at_pass=True, run_many=run_many)
        tally = Confirmed(config, last, runs, failed) if last is not None else None
        if tally is not None:
            tried.append(tally)
        if tally is None or not tally.reliable or runs < replays:
            continue
        shrunk = True
        while shrunk and tally.config.schedule.faults:  # down to no fault at all
            shrunk = False
            for i in range(len(tally.config.schedule.faults)):
                smaller = dataclasses.replace(tally.config, schedule=without(tally.config.schedule, i))
                runs, failed, last = replay(run, smaller, replays=replays, stop_at_pass=True, run_many=run_many)
                if last is not None and failed == replays:
                    tally = Confirmed(smaller, last, runs, failed)
                    shrunk = True
                    break
        if best is None or len(tally.config.schedule.faults) < len(best.config.schedule.faults):
            best = tally
    return best, tried


__all__ = ["REPLAYS", "Confirmed", "confirm", "replay"]
