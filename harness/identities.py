"""Who a run starts: worker identities (A, B, ... then fresh ones for replacements) and the spawn
cap, and the schedule checks that follow from them.

A room of its own because it is pure and light: the commands and the pytest plugin refuse a
schedule that could never fire before any run, without loading the supervisor.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Iterable

from killpoint.chaos.points import DB_POINTS
from killpoint.errors import BadInput, InvalidTarget, shown

if TYPE_CHECKING:
    from killpoint import chaos


def worker_identity(n: int) -> str:
    """The ``n``-th identity a run uses (from 0): A, B, ... Z, then A1, B1, ...; the first
    ``workers`` start the run, the others are fresh identities for replacements, in order."""
    return string.ascii_uppercase[n % 26] + ("" if n < 26 else str(n // 26))


def spawn_cap(workers: int, faults: int) -> int:
    """How many worker processes a run may start before it gives up (the target keeps failing)."""
    return 4 * workers + 2 * faults + 4


def reachable_identities(workers: int, faults: int) -> tuple[str, ...]:
    """Every identity a run with ``workers`` workers and ``faults`` faults can ever start."""
    return tuple(dict.fromkeys(worker_identity(n) for n in range(spawn_cap(workers, faults))))


def check_schedule(schedule: "chaos.Schedule", *, steps: "Iterable[str]", workers: int,
                   owns_state: bool = False) -> None:
    """Refuse a schedule whose fault could never fire: a step the workload does not have, or a
    worker no run with ``workers`` workers ever starts (the first ones, then fresh identities for
    replacements up to the run's spawn cap). For a target that ``owns_state``, also a ``terminate``
    or a db point (:func:`check_owned_faults`)."""
    if owns_state:
        check_owned_faults(schedule)
    steps = tuple(steps)
    for fault in schedule.faults:
        if fault.step is not None and fault.step not in steps:
            raise BadInput(f"schedule {shown(str(schedule))}: unknown step {shown(fault.step)} in "
                           f"{shown(str(fault))}; the workload's steps are {', '.join(steps)}")
    reachable = reachable_identities(workers, len(schedule.faults))
    for fault in schedule.faults:
        if fault.worker not in reachable:
            raise BadInput(f"schedule {shown(str(schedule))}: worker {shown(fault.worker)} in "
                           f"{shown(str(fault))} is never started: with {workers} workers a run "
                           f"starts {', '.join(reachable[:workers])}, and replacements "
                           f"{reachable[workers]}..{reachable[-1]}")


def check_owned_faults(schedule: "chaos.Schedule") -> None:
    """For a target that keeps its state in a store of its own: refuse ``terminate`` and the db
    points. Both act on killpoint's store -- the sessions it ends are that store's, the points sit
    inside its COMMIT -- which such a target's workers do not write through: a terminate there
    ended a connection the target never used and still counted as fired, so a run that tested
    nothing could come out valid."""
    for fault in schedule.faults:
        what = ("terminates the worker's sessions of killpoint's store"
                if any(term.action == "terminate" for term in fault.actions.terms) else
                f"is at {fault.point}, inside killpoint's store's COMMIT" if fault.point in DB_POINTS else None)
        if what is not None:
            raise InvalidTarget(f"schedule {shown(str(schedule))}: {shown(str(fault))} {what}, and the target "
                                f"keeps its state in a store of its own, which killpoint cannot cut: kill or "
                                f"pause its workers at its own points instead")
