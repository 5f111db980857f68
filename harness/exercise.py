"""What a run's faults provoked: exercise accounting, a pure function of the history.

A fault is evidence only if it provoked what it exists for. A ``pause`` (SIGSTOP) or a ``hang``
exists to let another worker take the step over while the first is stopped, so that the stale
worker meets the new holder: the lease-takeover exercise. A pause that nobody took over tested
nothing a run without it would not have tested, and is *not exercised*. The other things a fault
can provoke are counted too: the stale worker's late write once it comes back (refused or
accepted), a retry after a call whose outcome the caller never learnt, a compensation, and a
recovery of a killed worker's step by another worker process.

:func:`exercised` derives all of it from a :class:`~killpoint.harness.history.History` and the
run's schedule, with no I/O; :class:`Exercise` is what one run provoked and :class:`Tally` the
counts over any number of runs. A target may also declare what must happen at least once across a
matrix (``killpoint.sometimes("refund retried")``): the journal's ``sometimes`` events, counted
here, say which expectations a run reached.

One module, a little over 500 lines, on purpose: the counts and the derivation that fills them are
read together (a count added to :class:`Provoked` is derived below, and totalled in :class:`Tally`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence, TypeAlias

from killpoint import vocab as v
from killpoint.harness.events import (HarnessAction, PointHit, Request, Resume, Spawn, StoreEvent, WorkerEvent,
                                     WorkerOp)
from killpoint.harness.history import History

__all__ = ["Exercise", "NOT_EXERCISED", "Provoked", "Tally", "exercised", "matrix_reasons", "sometimes_of", "total"]

# Said in every unknown reason this module gives a run, so that a caller (exploration) can tell a
# run unknown only because its faults tested nothing from one that could not be judged.
NOT_EXERCISED = "not exercised"

Action = Literal["kill", "pause", "hang", "sleep", "terminate"]
LateWrite = Literal["refused", "accepted"]
# What a takeover was seen by: another worker's claim of the step (the store's event or its
# journal), or, where the history has no claims of the step at all (a target that owns its state
# and gives no history()), its call to the downstream for the step.
Evidence = Literal["claim", "call"]
# Actions that exist to be taken over: not exercised when nobody did.
NEEDS_TAKEOVER = frozenset({"pause", "hang"})

StepId = tuple[Any, Any]


@dataclass(frozen=True)
class Provoked:
    """What one fired fault provoked."""

    fault: str  # its text in the schedule
    action: Action
    worker: str  # the incarnation it fired in (A, A.2, ...)
    instance: str | None
    step: str | None
    # pause, hang, sleep: the worker that claimed (or called for) the step while this one was
    # stopped, and what showed it; None: nobody did.
    takeover_by: str | None = None
    takeover_evidence: Evidence | None = None
    # pause, sleep: the stale worker's first commit of the step after it came back (None: it made none).
    late_write: LateWrite | None = None
    # pause, sleep: the downstream's outcome of its first call for the step after it came back.
    late_call: str | None = None
    # kill, terminate: the worker process that took the step up after this one died (None: nobody).
    recovered_by: str | None = None
    # Why this fault is not asked to provoke a takeover (a pause released at once for a restart).
    exempt: str | None = None
    # pause(until=lapse): resumed once its lease lapsed, before anybody claimed the step, and then
    # wrote or called late on a lease that had run out: the window such a pause is for.
    late_on_lapsed: bool = False

    @property
    def needs_takeover(self) -> bool:
        return self.action in NEEDS_TAKEOVER and self.exempt is None

    @property
    def exercised(self) -> bool:
        """Whether it provoked what it is for: a takeover for a pause or hang; a kill or a
        terminate always is (a crash there is what it tests), and so is a sleep (a stall)."""
        if not self.needs_takeover:
            return True
        return self.takeover_by is not None or self.late_on_lapsed

    def where(self) -> str:
        if self.step is None:
            return "its step"
        return f"{self.step} of {self.instance}" if self.instance is not None else str(self.step)

    def reason(self) -> str | None:
        """Why this fault is not evidence (None: it is): one line naming it."""
        if self.exercised:
            return None
        frozen = "frozen" if self.action == "pause" else "hung"
        return (f"{self.fault} {NOT_EXERCISED}: no other worker took {self.where()} over while "
                f"{self.worker} was {frozen}, so the {self.action} tested nothing a run without it "
                f"would not; it is not evidence for valid (other workers gave up on the held lease, "
                f"had no time to take it, or the step did not need them)")

    def to_json(self) -> dict[str, Any]:
        return {"fault": self.fault, "action": self.action, "worker": self.worker,
                "instance": self.instance, "step": self.step, "exercised": self.exercised,
                "takeover_by": self.takeover_by, "takeover_evidence": self.takeover_evidence,
                "late_write": self.late_write, "late_call": self.late_call,
                "recovered_by": self.recovered_by, "exempt": self.exempt,
                "late_on_lapsed": self.late_on_lapsed}


@dataclass(frozen=True)
class Tally:
    """Exercise counts over one run or many (``+``)."""

    runs: int = 0
    pauses: int = 0
    pauses_exercised: int = 0
    hangs: int = 0
    hangs_exercised: int = 0
    sleeps_taken_over: int = 0
    late_writes_refused: int = 0
    late_writes_accepted: int = 0
    late_calls: int = 0
    kills: int = 0
    kills_recovered: int = 0
    indeterminate_calls: int = 0
    retries_after_indeterminate: int = 0
    decided_after_indeterminate: int = 0
    compensations: int = 0
    # Expectations (killpoint.sometimes): every name declared or evaluated, and those reached.
    expected: frozenset[str] = frozenset()
    reached: frozenset[str] = frozenset()

    def __add__(self, other: "Tally") -> "Tally":
        if not isinstance(other, Tally):
            return NotImplemented
        counts = {name: getattr(self, name) + getattr(other, name) for name in _COUNTS}
        return Tally(**counts, expected=self.expected | other.expected, reached=self.reached | other.reached)

    @property
    def not_reached(self) -> tuple[str, ...]:
        return tuple(sorted(self.expected - self.reached))

    def brief(self) -> str:
        """What a closing line says: ``12 of 17 pauses exercised a takeover`` (hangs and
        expectations likewise; empty when the runs had none)."""
        parts = []
        if self.pauses:
            parts.append(f"{self.pauses_exercised} of {self.pauses} pause{_s(self.pauses)} exercised a takeover")
        if self.hangs:
            parts.append(f"{self.hangs_exercised} of {self.hangs} hang{_s(self.hangs)} exercised a takeover")
        if self.expected:
            parts.append(f"{len(self.reached & self.expected)} of {len(self.expected)} sometimes "
                         f"expectation{_s(len(self.expected))} reached")
        return ", ".join(parts)

    def line(self) -> str:
        """Every count in one line: pauses and hangs taken over, late writes, recoveries..."""
        parts = []
        if self.pauses:
            parts.append(f"{self.pauses_exercised} of {self.pauses} pause{_s(self.pauses)} exercised a takeover")
        if self.hangs:
            parts.append(f"{self.hangs_exercised} of {self.hangs} hang{_s(self.hangs)} exercised a takeover")
        if self.sleeps_taken_over:
            parts.append(f"{self.sleeps_taken_over} sleep{_s(self.sleeps_taken_over)} taken over")
        late = self.late_writes_refused + self.late_writes_accepted
        if late:
            parts.append(f"{late} late write{_s(late)} by a stale worker ({self.late_writes_refused} refused, "
                         f"{self.late_writes_accepted} accepted)")
        if self.kills:
            parts.append(f"{self.kills_recovered} of {self.kills} crash{'es' if self.kills != 1 else ''} "
                         f"recovered by another worker")
        if self.indeterminate_calls:
            parts.append(f"{self.indeterminate_calls} indeterminate call{_s(self.indeterminate_calls)} "
                         f"({self.decided_after_indeterminate} decided by a recovery, "
                         f"{self.retries_after_indeterminate} retried)")
        if self.compensations:
            parts.append(f"{self.compensations} compensation{_s(self.compensations)}")
        if self.expected:
            parts.append(f"{len(self.reached & self.expected)} of {len(self.expected)} sometimes "
                         f"expectation{_s(len(self.expected))} reached")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTS}
        out["sometimes"] = {"expected": sorted(self.expected), "reached": sorted(self.reached & self.expected),
                            "not_reached": list(self.not_reached)}
        return out


_COUNTS = ("runs", "pauses", "pauses_exercised", "hangs", "hangs_exercised", "sleeps_taken_over",
           "late_writes_refused", "late_writes_accepted", "late_calls", "kills", "kills_recovered",
           "indeterminate_calls", "retries_after_indeterminate", "decided_after_indeterminate",
           "compensations")


def _s(n: int) -> str:
    return "" if n == 1 else "s"


@dataclass(frozen=True)
class Exercise:
    """What one run's faults provoked, and what else the run went through."""

    faults: tuple[Provoked, ...] = ()
    indeterminate_calls: int = 0
    retries_after_indeterminate: int = 0
    decided_after_indeterminate: int = 0  # a recovery weighed the evidence about it (recover event)
    compensations: int = 0
    # killpoint.sometimes: names a worker evaluated (or the target declared), and those it reached.
    expected: frozenset[str] = frozenset()
    reached: frozenset[str] = frozenset()

    def reasons(self) -> tuple[str, ...]:
        """Why the run is not evidence for valid: one line per pause or hang that provoked nothing."""
        return tuple(r for r in (p.reason() for p in self.faults) if r is not None)

    def tally(self) -> Tally:
        f = self.faults
        return Tally(
            runs=1,
            pauses=sum(p.action == "pause" and p.needs_takeover for p in f),
            pauses_exercised=sum(p.action == "pause" and p.needs_takeover and p.exercised for p in f),
            hangs=sum(p.action == "hang" and p.needs_takeover for p in f),
            hangs_exercised=sum(p.action == "hang" and p.needs_takeover and p.exercised for p in f),
            sleeps_taken_over=sum(p.action == "sleep" and p.takeover_by is not None for p in f),
            late_writes_refused=sum(p.late_write == "refused" for p in f),
            late_writes_accepted=sum(p.late_write == "accepted" for p in f),
            late_calls=sum(p.late_call is not None for p in f),
            kills=sum(p.action in ("kill", "terminate") for p in f),
            kills_recovered=sum(p.recovered_by is not None for p in f),
            indeterminate_calls=self.indeterminate_calls,
            retries_after_indeterminate=self.retries_after_indeterminate,
            decided_after_indeterminate=self.decided_after_indeterminate,
            compensations=self.compensations, expected=self.expected, reached=self.reached)

    def to_json(self) -> dict[str, Any]:
        return {"faults": [p.to_json() for p in self.faults], **self.tally().to_json()}


# -- deriving it ----------------------------------------------------------------------------------
# Read from the typed events (killpoint.harness.events): an event that is not in the vocabulary is
# in no family, and makes the verdict unknown on its own.

_Timed: TypeAlias = "StoreEvent | Request | WorkerOp | HarnessAction"


def exercised(history: History, faults: Sequence[Any] = (), declared: Iterable[str] = ()) -> Exercise:
    """What the faults of ``history``'s run provoked. ``faults`` are the schedule's faults (their
    text is what a :class:`Provoked` names; fired ones are found by index in the journals);
    ``declared`` the expectations the target declared (``@killpoint.target(sometimes=...)``)."""
    identities = {e.worker: e.identity for e in history.typed(Spawn)}
    fired: dict[int, PointHit] = {}
    for hit in history.typed(PointHit):
        if hit.action and hit.fault is not None and hit.fault not in fired:
            fired[hit.fault] = hit
    provoked = tuple(_provoked(history, hit, str(faults[index]) if index < len(faults) else f"fault #{index}",
                               identities)
                     for index, hit in sorted(fired.items()))
    indeterminate, retried, decided = _indeterminate(history)
    expected, reached = sometimes_of(history)
    return Exercise(provoked, indeterminate, retried, decided, _compensations(history),
                    expected | frozenset(declared), reached)


def sometimes_of(history: History) -> tuple[frozenset[str], frozenset[str]]:
    """(every expectation a worker evaluated, those it reached) from the ``sometimes`` events."""
    seen, reached = set(), set()
    for e in history.typed(WorkerEvent):
        if e.kind == v.SOMETIMES and isinstance(e.name, str):
            seen.add(e.name)
            if e.reached is True:
                reached.add(e.name)
    return frozenset(seen), frozenset(reached)


def _identity(label: str, identities: Mapping[Any, Any]) -> str:
    return str(identities.get(label) or label.split(".")[0])


def _ops(history: History, kind: str, *, type: str | None = None, process: str | None = None) -> list[WorkerOp]:
    """The workers' operations of ``kind`` (narrowed by type and incarnation), in history order."""
    return [e for e in history.typed(WorkerOp) if e.kind == kind and (type is None or e.type == type)
            and (process is None or e.process == process)]


def _store(history: History, sid: StepId, *kinds: str) -> list[StoreEvent]:
    return [e for e in history.store_by_step().get(sid, ()) if e.kind in kinds]


def _provoked(history: History, hit: PointHit, text: str, identities: Mapping[Any, Any]) -> Provoked:
    action = str(hit.action)
    label = hit.process
    me = _identity(label, identities)
    instance, step = hit.instance, hit.step
    base = Provoked(text, action, label, instance, step)  # type: ignore[arg-type]
    start = hit.time
    if action in ("kill", "terminate"):
        return _recovery(history, base, start, label, me)
    if action not in ("pause", "hang", "sleep"):
        return base
    end, exempt = _window(history, action, label, start)
    if exempt is not None:
        return Provoked(text, action, label, instance, step, exempt=exempt)  # type: ignore[arg-type]
    held = _held(history, instance, step, me, start)
    # Resumed at its lease's lapse, with another worker held just before its claim: that claim
    # comes right after the resume, and is the takeover the pause was for.
    lapsed = end is not None and any(e.time == end and e.why == v.RESUMED_LAPSED and e.worker == label
                                     for e in history.typed(Resume))
    by, evidence = _taken_over(history, held, label, me, start, None if lapsed else end)
    late_write = late_call = None
    if (by is not None or lapsed) and action != "hang" and end is not None:
        late_write, late_call = _late(history, held, label, me, end)
    late_on_lapsed = lapsed and by is None and (late_write is not None or late_call is not None)
    return Provoked(text, action, label, instance, step, by, evidence, late_write, late_call,  # type: ignore[arg-type]
                    late_on_lapsed=late_on_lapsed)


def _window(history: History, action: str, label: str, start: int) -> tuple[int | None, str | None]:
    """When the stopped worker came back (None: never; it was killed or the run ended first),
    and why the fault is exempt from needing a takeover (None: it is not)."""
    if action == "pause":
        stopped = False
        for e in history.typed(HarnessAction):
            if e.worker != label or e.time < start:
                continue
            if e.kind == v.STOP:
                stopped = True
            elif e.kind == v.CONT:
                if not stopped and e.signal is None:
                    return e.time, "released at once: it only waited for a restart"
                return e.time, None
            elif e.kind in (v.EXIT, v.KILL):
                return None, None
        return None, None
    if action == "sleep":
        later = [e for e in history.of(label) if e.time > start]
        return (later[0].time if later else None), None
    return None, None  # a hang lasts until the worker is ended


def _held(history: History, instance: Any, step: Any, me: str, start: int) -> set[StepId]:
    """The steps the stopped worker was on: the one its point named, else those whose last claim
    before it stopped was its own."""
    if step is not None:
        if instance is not None:
            return {(instance, step)}
        return {sid for sid in history.store_by_step() if sid[1] == step} | \
            {(e.instance, step) for e in _ops(history, v.CLAIM) if e.step == step} | \
            {(e.meta.instance, step) for e in history.typed(Request) if e.meta.step == step}
    last: dict[StepId, Any] = {}
    for e in history.typed(StoreEvent):
        if e.kind == v.CLAIMED and e.time < start:
            last[(e.instance, e.step)] = e.worker
    return {sid for sid, who in last.items() if who == me}


def _between(e: _Timed, start: int, end: int | None) -> bool:
    return e.time > start and (end is None or e.time < end)


def _taken_over(history: History, held: set[StepId], label: str, me: str, start: int,
                end: int | None) -> tuple[str | None, Evidence | None]:
    """Who claimed one of ``held`` while ``label`` was stopped (from ``start`` to ``end``)."""
    if not held:
        return None, None
    claims_seen = False
    for op in _ops(history, v.CLAIM, type=v.OK):
        if (op.instance, op.step) in held:
            claims_seen = True
            if op.process != label and _between(op, start, end):
                return op.process, "claim"
    for sid in held:
        for e in _store(history, sid, v.CLAIMED):
            claims_seen = True
            if e.worker != me and _between(e, start, end):
                return str(e.worker), "claim"
    if claims_seen:
        return None, None
    # No claim of the step anywhere (its target gives no history): a call for it by another worker.
    for r in history.typed(Request):
        meta = r.meta
        if (meta.instance, meta.step) in held and meta.worker not in (None, me) and _between(r, start, end):
            return str(meta.worker), "call"
    return None, None


def _late(history: History, held: set[StepId], label: str, me: str, back: int) -> tuple[LateWrite | None, str | None]:
    """The stale worker's first commit and first call for a step it held, once it came back at
    ``back`` and before it claimed that step again."""
    again = min((op.time for op in _ops(history, v.CLAIM, process=label)
                 if op.time > back and (op.instance, op.step) in held), default=None)

    def in_time(e: _Timed) -> bool:
        return e.time > back and (again is None or e.time < again)

    write: LateWrite | None = None
    for sid in held:
        for e in _store(history, sid, v.COMMITTED, v.COMMIT_REJECTED):
            if e.worker == me and in_time(e):
                write = "refused" if e.kind == v.COMMIT_REJECTED else "accepted"
                break
        if write is not None:
            break
    if write is None:  # no store event for it (a target without history()): its journal's commit
        for op in _ops(history, v.COMMIT, process=label):
            if op.type in (v.OK, v.FAIL) and (op.instance, op.step) in held and in_time(op):
                write = "accepted" if op.type == v.OK else "refused"
                break
    call = None
    for r in history.typed(Request):
        meta = r.meta
        if meta.worker == me and (meta.instance, meta.step) in held and in_time(r):
            call = str(r.outcome)
            break
    return write, call


def _recovery(history: History, base: Provoked, died: int, label: str, me: str) -> Provoked:
    """A killed worker's step taken up by another worker process after its death: a claim of it, or
    a call for it, made after the death (the dead process makes none; a replacement may carry its
    identity, so any worker's counts)."""
    if base.step is None:
        return base

    def by(who: Any) -> Provoked:
        return Provoked(base.fault, base.action, base.worker, base.instance, base.step, recovered_by=str(who))

    held = _held(history, base.instance, base.step, me, died)
    # What it was doing to the step (running it, or compensating it): a later compensation of a step
    # it finished is no recovery of its work.
    claims = [e for sid in held for e in _store(history, sid, v.CLAIMED)]
    doing = max((e for e in claims if e.time <= died and e.worker == me), key=lambda e: e.time, default=None)
    calls = [r for r in history.typed(Request) if (r.meta.instance, r.meta.step) in held]
    direction = max((r for r in calls if r.time <= died and r.meta.worker == me), key=lambda r: r.time, default=None)
    for op in _ops(history, v.CLAIM, type=v.OK):
        if (op.instance, op.step) in held and op.process != label and op.time > died:
            return by(op.process)
    for e in sorted(claims, key=lambda e: e.time):
        if e.time > died and (doing is None or e.to_state == doing.to_state):
            return by(e.worker)
    for r in calls:
        if r.time > died and (direction is None or r.meta.direction == direction.meta.direction):
            return by(r.meta.worker)
    return base


def _indeterminate(history: History) -> tuple[int, int, int]:
    """(calls whose outcome their caller never learnt, those of them a later call retried, those a
    recovery then decided about): a call its worker died in (``info``), or one the downstream
    applied and never answered (``dropped``)."""
    requests = history.typed(Request)
    lost: list[tuple[int, Any, StepId, Any]] = []  # (time, key, step, direction)
    for op in _ops(history, v.CALL, type=v.INFO):
        lost.append((op.time, op.key, (op.instance, op.step), op.direction))
    for r in requests:
        if r.outcome == v.DROPPED:
            lost.append((r.time, r.key, (r.meta.instance, r.meta.step), r.meta.direction))
    # One call seen twice (its worker died in it, and the downstream dropped its answer) counts once.
    first: dict[Any, tuple[int, Any, StepId, Any]] = {}
    for t, key, sid, direction in sorted(lost, key=lambda x: x[0]):
        first.setdefault(key if key is not None else (sid, direction), (t, key, sid, direction))
    lost = list(first.values())
    if not lost:
        return 0, 0, 0
    # The last time each key, each step and direction, and each step's recovery decision was seen:
    # a later one than the lost call's is its retry (or decision). Linear in the history.
    last_key: dict[Any, int] = {}
    last_step: dict[tuple[StepId, Any], int] = {}
    for r in requests:
        if r.key is not None:
            last_key[r.key] = max(last_key.get(r.key, r.time), r.time)
        where = ((r.meta.instance, r.meta.step), r.meta.direction)
        last_step[where] = max(last_step.get(where, r.time), r.time)
    last_decision: dict[StepId, int] = {}
    for e in history.typed(WorkerEvent):
        if e.kind == v.RECOVER:
            sid = (e.instance, e.step)
            last_decision[sid] = max(last_decision.get(sid, e.time), e.time)
    retried = decided = 0
    for t, key, sid, direction in lost:
        later = last_key.get(key) if key is not None else last_step.get((sid, direction))
        retried += later is not None and later > t
        decided += last_decision.get(sid, t) > t
    return len(lost), retried, decided



def _compensations(history: History) -> int:
    """Steps whose compensation was called, or claimed to be compensated."""
    steps: set[StepId] = set()
    for r in history.typed(Request):
        if r.meta.direction == "compensation":
            steps.add((r.meta.instance, r.meta.step))
    for e in history.typed(StoreEvent):
        if e.kind == v.CLAIMED and e.to_state == "compensating":
            steps.add((e.instance, e.step))
    return len(steps)


def matrix_reasons(tally: Tally) -> tuple[str, ...]:
    """What makes a set of runs unknown as a whole, whatever each run's verdict: pauses (or hangs)
    of which none exercised a takeover, and a declared expectation no run reached."""
    out = []
    # Of one run, its own reasons say it already (each pause that provoked nothing).
    if tally.pauses and not tally.pauses_exercised and tally.runs > 1:
        out.append(f"none of the {tally.pauses} pause{_s(tally.pauses)} exercised a takeover: no other "
                   f"worker took a step over while its worker was frozen, so the runs never tested a "
                   f"stale worker ({NOT_EXERCISED})")
    if tally.hangs and not tally.hangs_exercised and tally.runs > 1:
        out.append(f"none of the {tally.hangs} hang{_s(tally.hangs)} exercised a takeover ({NOT_EXERCISED})")
    for name in tally.not_reached:
        out.append(f"expectation {name!r} was never reached in {tally.runs} run{_s(tally.runs)}: "
                   f"killpoint.sometimes({name!r}) never held, so what it names was never tested")
    return tuple(out)


def total(exercises: Iterable[Exercise | None]) -> Tally:
    """The counts over many runs (a run with no exercise record, an infrastructure failure, adds
    nothing but itself)."""
    out = Tally()
    for e in exercises:
        out = out + (e.tally() if e is not None else Tally(runs=1))
    return out

