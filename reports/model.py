"""The data a report is made from: frozen values built from one run (or many, for the index).

The HTML is only a rendering of these values, so tests judge what a report *says* -- which lanes,
which items, which violations -- without reading HTML, as Jepsen tests its timeline's element tree.
Nothing here escapes anything: the templates do, because only they know the context. Every string
in this model may come from a run (instance ids, worker ids, payloads, exception text) and must be
treated as hostile by whoever shows it.

Times are nanoseconds of the run's time since its first event: CLOCK_MONOTONIC plus the run clock's
offset (on the virtual clock, waits the harness skipped are in them at their full length). Every item
and row names the event it comes from by its link id, ``e<index>``, which is the anchor of that
event's row in the event table.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from killpoint import vocab
from killpoint.harness.checkers.base import rank
from killpoint.errors import InvalidEvent
from killpoint.harness.events import (HarnessAction, PointHit, Request, Spawn, StoreEvent, TargetEvent, TypedEvent,
                                      WorkerEvent, WorkerOp)
from killpoint.harness.history import Event, History
from killpoint.harness.narrate import about, clock_note, run_time, span
from killpoint.harness.narrate import describe as describe_event
from killpoint.harness.redact import redact

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult

# ok: took effect; fail: certainly did not; info: unknown (indeterminate); event: a plain fact.
STATUSES = ("ok", "fail", "info", "event")
FIXED_LANES = (vocab.DOWNSTREAM, vocab.STORE, vocab.HARNESS)
DEFAULT_MAX_EVENTS = 2000
_DETAIL_CHARS = 600

_ACCEPTED = vocab.ACCEPTED_TRANSITIONS | {vocab.RECEIPT_RECORDED}
_OK_OUTCOMES = {vocab.APPLIED, vocab.REPLAY}
_WORKER_SKIPPED = {vocab.START, vocab.FINISH}  # the harness lane shows spawn and exit instead
# The failpoint actions the timeline draws apart (chaos.actions spells them so).
PAUSE = "pause"
KILL = "kill"


def link(index: int) -> str:
    """The anchor id of an event: its row in the event table."""
    return f"e{index}"


def verdict_word(valid: bool | None) -> str:
    return {True: "valid", False: "violated", None: "unknown"}[valid]


def clip(text: str, limit: int) -> str:
    """Shorten text for display; a 10 kB name must not make a report unreadable."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


# -- the run report -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Banner:
    """The first thing a reader sees: the verdict and everything needed to run it again."""

    verdict: str  # valid | violated | unknown
    run_id: str
    schedule: str
    target: str
    seed: int
    workers: int
    workload: str
    store: str
    duration_ms: float
    spawned: int
    fired: tuple[tuple[str, int], ...]  # fault text, times fired
    unfired: tuple[str, ...]
    unknown_reasons: tuple[str, ...]
    violated: tuple[str, ...]  # names of the violated invariants, in checker order
    reproduce: str
    # The timeline's times are the run's: on the virtual clock they include the waits the harness
    # skipped (a 30 s lease in a 100 ms run); ``run_time`` is their span, as "30.0734 s".
    virtual: bool = False
    run_time: str = ""
    clock: str = ""  # what the times are, in words (narrate.clock_note)
    # What the faults provoked (harness.exercise): the run's counts in a line, and one line per fault.
    exercise: str = ""
    provoked: tuple[str, ...] = ()


@dataclass(frozen=True)
class InvariantRow:
    name: str
    checked: bool  # the history had something for this invariant to judge
    valid: bool | None
    violations: int
    detail: str
    applicable: bool = True  # False: the target owns its state and gave this invariant nothing

    @property
    def status(self) -> str:
        if not self.applicable:
            return "not applicable"
        if self.valid is True and not self.checked:
            return "not checked"
        return verdict_word(self.valid)


@dataclass(frozen=True)
class EventRef:
    """A link to an event that proves a violation, with a one-line description of it."""

    index: int
    link: str
    label: str


@dataclass(frozen=True)
class ViolationView:
    invariant: str
    instance: str | None
    step: str | None
    detail: str
    events: tuple[EventRef, ...]
    schedule: str
    reproduce: str


@dataclass(frozen=True)
class Lane:
    """One swimlane: a worker incarnation (A, B, A.2 ...) or one of downstream, store, harness."""

    name: str
    kind: str  # worker | downstream | store | harness
    identity: str | None = None  # the worker id the store saw (A.2 is A again)
    pid: int | None = None
    start: int | None = None  # spawn time of a worker incarnation
    end: int | None = None  # exit time; None while it was still alive at the end of the run
    ended: str = ""  # how it ended: "exit 0", "SIGKILL" ...


@dataclass(frozen=True)
class Item:
    """One mark on the timeline: an operation (invoke to completion), a pause, or an instant event.

    Invariant: ``start <= end``; instants have ``start == end`` and no ``end_index``; an
    indeterminate operation (``info``: the worker died, or lost the answer) ends at the end of the
    run, since its effect may land at any later time.
    """

    link: str  # e<index> of the event that starts it
    index: int
    lane: str
    kind: str  # claim, call, receipt, commit, point, claimed, request, spawn, exit, ...
    label: str
    status: str  # one of STATUSES
    start: int
    end: int
    end_index: int | None = None  # the event that ends a span: an op's completion, a pause's resume
    fence: int | None = None
    indeterminate: bool = False
    proof: bool = False  # named by a violation
    detail: str = ""

    @property
    def span(self) -> bool:
        """Drawn as a bar from start to end rather than as a dot."""
        return self.indeterminate or (self.end_index is not None and self.end_index != self.index)


@dataclass(frozen=True)
class Lease:
    """A lease held on one step, drawn as a bar in the lane of the worker incarnation holding it.

    Invariant: ``start <= held_until <= end``. From ``start`` (the store granted it) to
    ``held_until`` the holder was alive and renewing it; from ``held_until`` to ``end`` nobody
    renewed it (the holder died, was frozen or lost its heartbeat) and it ran out: ``expiry`` is
    then the latest time it could still be valid -- ``lease_ttl`` after the holder stopped, or the
    next claim, which the store grants only once the lease has expired.
    """

    link: str  # the store's ``claimed`` event
    index: int
    lane: str  # the incarnation holding it (A.2 holds what the store calls A's)
    instance: str
    step: str
    fence: int | None
    start: int
    held_until: int
    end: int
    how: str  # released | expired | taken over | freed as stuck | held at the end
    expiry: int | None = None  # when it ran out (drawn as a mark), if it did
    estimated: bool = False  # the expiry is an upper bound from the lease's time to live
    label: str = ""


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[Lane, ...]
    items: tuple[Item, ...]
    duration: int  # ns from the first to the last event of the run
    shown: int  # events of the history drawn from (after the cap)
    total: int
    leases: tuple[Lease, ...] = ()
    focus: tuple[str, ...] = ()  # the instances drawn, when the timeline follows only some

    def lane(self, name: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.name == name), None)

    def in_lane(self, name: str) -> tuple[Item, ...]:
        return tuple(i for i in self.items if i.lane == name)


@dataclass(frozen=True)
class EventRow:
    index: int
    link: str
    time_ms: float
    process: str
    kind: str
    type: str
    status: str
    instance: str
    step: str
    detail: str
    proof: bool  # named by a violation
    in_timeline: bool


@dataclass(frozen=True)
class LedgerRow:
    """One request the downstream saw: the ground truth about effects."""

    index: int
    link: str
    seq: Any
    resource: str
    key: str | None  # None: a legacy resource without keys (then ``scope`` identifies the intent)
    scope: str
    intent_hash: str
    fence: Any
    worker: str
    attempt: Any
    http_status: Any
    outcome: str
    applied: bool
    status: str


@dataclass(frozen=True)
class RunReport:
    banner: Banner
    invariants: tuple[InvariantRow, ...]
    violations: tuple[ViolationView, ...]
    timeline: Timeline
    events: tuple[EventRow, ...]
    ledger: tuple[LedgerRow, ...]
    shown: int
    total: int
    focus: tuple[str, ...] = ()  # the instances the event table keeps, when it keeps only some

    @property
    def cap_note(self) -> str:
        """"showing N of M events" when the cap (or the focus) hid some, else empty."""
        return f"showing {self.shown} of {self.total} events" if self.shown < self.total else ""

    def to_json(self) -> dict[str, Any]:
        """The verdict in machine-readable form, for tools that read a report instead of a terminal."""
        b = self.banner
        return {"valid": {"valid": True, "violated": False}.get(b.verdict), "run_id": b.run_id,
                "schedule": b.schedule, "target": b.target, "seed": b.seed, "reproduce": b.reproduce,
                "violations": [{"invariant": v.invariant, "instance": v.instance, "step": v.step,
                                "detail": v.detail, "events": [e.index for e in v.events]}
                               for v in self.violations],
                "unknown_reasons": list(b.unknown_reasons),
                "clock": "virtual" if b.virtual else "real time",
                "events": {"shown": self.shown, "total": self.total}}


def focus_instances(history: History, violations: Iterable[Any] = ()) -> tuple[str, ...]:
    """The instances a reader of this run wants first: those a violation names (itself or by its
    events), else those a fault fired on. Empty when there is none: then everything is shown."""
    named: list[str] = []
    events = history.events
    for v in violations:
        for inst in [v.instance] + [_instance_of(events[i]) for i in v.events if 0 <= i < len(events)]:
            if inst is not None and str(inst) not in named:
                named.append(str(inst))
    if not named:
        for hit in history.typed(PointHit):
            if hit.action and hit.instance is not None and hit.instance not in named:
                named.append(hit.instance)
    return tuple(named)


def _instance_of(e: Event) -> str | None:
    inst = about(e)[0]
    return None if inst is None else str(inst)


def _in_focus(e: Event, focus: set[str]) -> bool:
    """An event about a focus instance, or one about no instance at all (the harness's own)."""
    inst = _instance_of(e)
    return inst is None or inst in focus


def build_run(result: RunResult, *, max_events: int = DEFAULT_MAX_EVENTS,
              reproduce: str | None = None, focus_table: bool = False) -> RunReport:
    """The model of one run's report, from a :class:`harness.run.RunResult`.

    At most ``max_events`` events are rendered (the first ones), plus every event a violation names
    so that each proof link resolves. The timeline follows the focus instances (see
    :func:`focus_instances`) and the harness; with ``focus_table`` the event table does too, which
    keeps a directory of many run reports small (the page says what it left out and how to get all).
    """
    if max_events < 1:
        raise ValueError(f"max_events={max_events}: a report must show at least one event")
    if reproduce is None:
        reproduce = result.config.reproduce_command()
    reproduce = redact(reproduce)
    history: History = result.history
    verdict = result.verdict
    events = history.events
    proof = {i for v in verdict.violations for i in v.events if 0 <= i < len(events)}
    focus = focus_instances(history, verdict.violations)
    wanted = set(focus)
    kept = range(len(events)) if not (focus_table and focus) else \
        (e.index for e in events if _in_focus(e, wanted))
    shown = sorted(set(list(kept)[:max_events]) | proof)
    t0 = events[0].time if events else 0

    ttl = result.config.timing.lease_ttl_ms if result.config.timing is not None else None
    drawn = shown if not focus else [i for i in shown if _in_focus(events[i], wanted) or i in proof]
    timeline = build_timeline(history, shown=drawn, proof=proof, lease_ttl_ms=ttl, focus=focus)
    in_timeline = {i.index for i in timeline.items}
    by_index = {e.index: e for e in events}
    rows = tuple(_event_row(by_index[i], t0, i in proof, i in in_timeline) for i in shown)
    requests = {r.index: r for r in history.typed(Request)}
    ledger = tuple(_ledger_row(requests[i]) for i in shown if i in requests)

    schedule = str(result.config.schedule)
    violations = tuple(
        ViolationView(v.invariant, v.instance, v.step, v.detail,
                      tuple(EventRef(i, link(i), describe(by_index[i])) for i in v.events if i in by_index),
                      v.schedule or schedule, reproduce)
        for v in verdict.violations)
    invariants = tuple(InvariantRow(r.invariant, r.checked, r.valid, len(r.violations), r.detail,
                                    r.applicable) for r in verdict.results)
    c = result.config
    banner = Banner(
        verdict=verdict_word(verdict.valid), run_id=result.run_id, schedule=schedule,
        target=c.target_name, seed=c.seed, workers=c.workers, workload=c.workload_name, store=redact(c.store),
        duration_ms=round(result.duration_s * 1000, 1), spawned=result.spawned,
        fired=tuple((str(k), int(n)) for k, n in result.fired.items()),
        unfired=tuple(str(u) for u in result.unfired),
        unknown_reasons=tuple(str(r) for r in verdict.unknown_reasons),
        violated=tuple(dict.fromkeys(r.invariant for r in verdict.results if r.valid is False)),
        reproduce=reproduce, virtual=bool(c.virtual_time), run_time=run_time(span(history)),
        clock=clock_note(bool(c.virtual_time)),
        exercise=result.exercise.tally().line() if result.exercise is not None else "",
        provoked=tuple(_provoked_line(p) for p in result.exercise.faults) if result.exercise is not None else ())
    return RunReport(banner, invariants, violations, timeline, rows, ledger, len(shown), len(events),
                     focus if (focus_table and focus) else ())


def _provoked_line(p: Any) -> str:
    """What one fired fault provoked, in words (see :class:`killpoint.harness.exercise.Provoked`)."""
    if p.exempt:
        return f"{p.fault}: {p.exempt}"
    if p.action in ("kill", "terminate"):
        taken = f"its step taken up by {p.recovered_by}" if p.recovered_by else "its step not taken up again"
        return f"{p.fault}: {taken}"
    if p.takeover_by is None:
        return f"{p.fault}: no takeover" + (" (not exercised: not evidence for valid)" if not p.exercised else "")
    late = []
    if p.late_write:
        late.append(f"its late commit {p.late_write}")
    if p.late_call:
        late.append(f"its late call {p.late_call}")
    return (f"{p.fault}: taken over by {p.takeover_by} (its {p.takeover_evidence})"
            + (f"; {', '.join(late)}" if late else ""))


# -- the timeline ---------------------------------------------------------------------------------
def build_timeline(history: History, *, shown: Iterable[int] | None = None,
                   proof: Iterable[int] = (), lease_ttl_ms: float | None = None,
                   focus: Sequence[str] = ()) -> Timeline:
    """Lanes, items and leases of the swimlane timeline, from the events in ``shown`` (default: all).

    An operation is drawn from its invoke to its completion; one whose completion is ``info`` or
    missing is drawn to the end of the run. A pause is drawn until the harness resumed the worker.
    Failpoint hits where nothing fired, and a worker's start/finish lines, are left out: they are
    in the event table, and the timeline is for what happened. Items from an event in ``proof``
    are marked, so the events a violation names stand out. Leases are drawn from the store's
    claims (see :class:`Lease`); ``lease_ttl_ms`` bounds when an unrenewed one ran out. With a
    ``focus`` (the instances ``shown`` follows), worker lanes with nothing drawn are left out.
    """
    events = history.events
    keep = set(range(len(events))) if shown is None else set(shown)
    t0 = events[0].time if events else 0
    end = (events[-1].time - t0) if events else 0

    lanes = _lanes(history, t0)
    completion: dict[int, WorkerOp] = {}
    open_ops: dict[tuple[str, Any], WorkerOp] = {}
    for op in history.typed(WorkerOp):
        if op.type == vocab.INVOKE:
            open_ops[(op.process, op.op)] = op
        else:
            inv = open_ops.pop((op.process, op.op), None)
            if inv is not None:
                completion[inv.index] = op
    completed = {c.index for c in completion.values()}
    resumed = _resumes(history)
    proof = set(proof)

    items: list[Item] = []
    for e in events:
        if e.index not in keep:
            continue
        start = e.time - t0
        t = _typed(e)
        if isinstance(t, WorkerOp):
            if t.index in completed:
                continue  # drawn with its invoke
            done = completion.get(t.index) if t.type == vocab.INVOKE else t
            item = _op_item(t, done, start, t0, end, events)
            items.append(dataclasses.replace(item, proof=item.index in proof or item.end_index in proof))
            continue
        made = _instant(e, t)
        if made is None:
            continue
        kind, label, status, fence = made
        stop = resumed.get(e.index) if isinstance(t, PointHit) and t.action == PAUSE else None
        items.append(Item(link(e.index), e.index, e.process, kind, label, status, start,
                          start if stop is None else max(start, stop.time - t0),
                          end_index=None if stop is None else stop.index, fence=fence,
                          proof=e.index in proof, detail=_detail(e)))
    ttl = None if lease_ttl_ms is None else int(lease_ttl_ms * 1e6)
    leases = tuple(lease for lease in _leases(history, t0, end, ttl) if lease.index in keep)
    if focus:  # a worker with nothing drawn about the focus instances gets no lane
        used = {i.lane for i in items} | {lease.lane for lease in leases}
        lanes = tuple(lane for lane in lanes if lane.kind != "worker" or lane.name in used)
    return Timeline(lanes, tuple(items), end, len(keep & set(range(len(events)))), len(events),
                    leases, tuple(focus))


def _leases(history: History, t0: int, run_end: int, ttl: int | None) -> list[Lease]:
    """Every lease the store granted, with when its holder stopped renewing it and how it ended
    (one pass over the claims; over 80 lines because each lease's end, holder and expiry are read
    from the events around its claim, in one place).

    The holder is the incarnation whose ``claim`` came back ``ok`` with that fence (the store only
    knows the worker id). It stops renewing when it exits or is killed, is frozen (SIGSTOP, unless
    resumed before the lease could run out), or its heartbeat stops or finds the lease gone.
    """
    holder: dict[tuple[Any, Any, Any], str] = {}
    ceases: dict[str, list[tuple[int, int | None]]] = {}  # lane -> (stopped at, resumed at)
    stopped: dict[str, int] = {}
    for e in history.typed_events:
        if isinstance(e, WorkerOp):
            if e.kind == vocab.CLAIM and e.type == vocab.OK:
                holder.setdefault((e.instance, e.step, e.fence), e.process)
        elif isinstance(e, WorkerEvent):
            if e.kind == vocab.HEARTBEAT_LOST:
                ceases.setdefault(e.process, []).append((e.time - t0, None))
        elif isinstance(e, HarnessAction) and e.worker is not None:
            w = e.worker
            if e.kind == vocab.EXIT:
                ceases.setdefault(w, []).append((e.time - t0, None))
            elif e.kind == vocab.STOP:
                stopped[w] = e.time - t0
            elif e.kind == vocab.CONT and w in stopped:
                ceases.setdefault(w, []).append((stopped.pop(w), e.time - t0))
    for w, at in stopped.items():
        ceases.setdefault(w, []).append((at, None))

    out: list[Lease] = []
    store = history.typed(StoreEvent)
    for n, c in enumerate(store):
        if c.kind != vocab.CLAIMED:
            continue
        inst, step, fence = c.instance, c.step, c.fence
        start = c.time - t0
        lane = holder.get((inst, step, c.fence)) or str(c.worker)
        ends, how = run_end, "held at the end"
        for later in store[n + 1:]:
            if (later.instance, later.step) != (inst, step):
                continue
            if later.kind == vocab.CLAIMED:
                ends, how = later.time - t0, "taken over"
                break
            if later.kind == vocab.COMMITTED and later.fence == c.fence:
                ends, how = later.time - t0, "released"
                break
            if later.kind == vocab.STUCK_FLAGGED and later.lease_version == c.fence:
                ends, how = later.time - t0, "freed as stuck"
                break
        held, expiry, estimated, renewed = ends, None, False, False
        for at, resumed in sorted(ceases.get(lane, ())):
            if not start <= at < ends:
                continue
            if resumed is not None and ttl is not None and resumed < at + ttl and resumed < ends:
                continue  # thawed before the lease could run out: its heartbeat went on renewing it
            held = at
            if how == "released":
                break  # a stale worker's commit that the store took: drawn as held, never as expired
            # The store recorded each renewal: the lease ran out its time to live after the last one
            # before the holder stopped (or after the claim). Without renewals in the history (a
            # target that keeps its own leases may not give them), the bound is the stop itself.
            renewals = [r.time - t0 for r in store if r.kind == vocab.RENEWED and start <= r.time - t0 <= at
                        and (r.instance, r.step) == (inst, step)
                        and (r.fence if r.lease_version is None else r.lease_version) == c.fence]
            since = max(renewals) if renewals else at
            if ttl is not None and since + ttl < ends:
                expiry, estimated, renewed = since + ttl, not renewals, bool(renewals)
            else:
                expiry = ends if how in ("taken over", "freed as stuck") else None
            how = "expired" if how != "freed as stuck" else how
            if expiry is not None:
                ends = expiry
            break
        who = f"{lane}" + (f" ({c.worker})" if str(c.worker) != lane.split(".")[0] else "")
        label = f"lease {inst}/{step} fence {fence} held by {who}, {how}"
        if expiry is not None:
            if renewed and ttl is not None:
                label += f" {ttl / 1e6:g} ms after its last renewal, by +{expiry / 1e6:.3f} ms"
            elif estimated and ttl is not None:
                label += f" at most {ttl / 1e6:g} ms after its holder stopped renewing it, by +{expiry / 1e6:.3f} ms"
            else:
                label += f" by +{expiry / 1e6:.3f} ms"
        out.append(Lease(link(c.index), c.index, lane, str(inst), str(step), fence, start,
                         min(held, ends), max(ends, start), how, expiry, estimated, label))
    return out


def _resumes(history: History) -> dict[int, TypedEvent]:
    """For each fired ``pause`` point, the event that ended the pause.

    That is the harness's ``cont`` (or ``exit``: killed while paused) of the worker -- or the
    worker's own next event if that comes first: a stopped process writes nothing, and the harness
    notes ``cont`` only after it has sent the signal.
    """
    waiting: dict[str, int] = {}
    ends: dict[int, TypedEvent] = {}
    for e in history.typed_events:
        if e.process not in FIXED_LANES and e.process in waiting:
            ends[waiting.pop(e.process)] = e
        if isinstance(e, PointHit) and e.action == PAUSE:
            waiting[e.process] = e.index
        elif isinstance(e, HarnessAction) and e.kind in (vocab.CONT, vocab.EXIT) and e.worker in waiting:
            ends[waiting.pop(e.worker)] = e
    return ends


def _lanes(history: History, t0: int) -> tuple[Lane, ...]:
    spawns: dict[str, Spawn] = {}
    exits: dict[str, HarnessAction] = {}
    for e in history.typed(HarnessAction):
        if isinstance(e, Spawn) and e.worker is not None:
            spawns.setdefault(e.worker, e)
        elif e.kind == vocab.EXIT and e.worker is not None:
            exits[e.worker] = e
    names = list(spawns)
    for raw in history.events:  # workers of a hand-written history may have no spawn event
        if raw.process not in FIXED_LANES and raw.process not in names:
            names.append(raw.process)
    lanes: list[Lane] = []
    for name in names:
        s, x = spawns.get(name), exits.get(name)
        ended = ""
        if x is not None:
            ended = str(x.signal) if x.signal else f"exit {x.code}"
        lanes.append(Lane(name, "worker",
                          identity=str(name if s.identity is None else s.identity) if s else name.split(".")[0],
                          pid=s.pid if s else None,
                          start=s.time - t0 if s else None,
                          end=x.time - t0 if x else None, ended=ended))
    lanes += [Lane(n, n) for n in FIXED_LANES]
    return tuple(lanes)


def _where(e: WorkerOp | None, fallback: WorkerOp | None = None) -> str:
    for src in (e, fallback):
        if src is not None and (src.instance is not None or src.step is not None):
            return f"{src.instance}/{src.step}"
    return "?"


def _op_item(first: WorkerOp, done: WorkerOp | None, start: int, t0: int, run_end: int,
             events: Sequence[Event]) -> Item:
    """An operation from its invoke (``first``) to its completion ``done`` (None: never completed);
    ``events`` are the history's, whose data the item's detail shows as written."""
    # Any info completion is unknown (Jepsen's :info): the effect may land at any later time, so the
    # op is drawn to the end of the run -- whether the worker died (``indeterminate``) or lost the answer.
    indeterminate = done is None or done.type == vocab.INFO
    status = "info" if done is None else done.type
    end = run_end if indeterminate else (done.time - t0 if done is not None else start)
    fence = done.fence if done is not None and done.fence is not None else first.fence
    kind = first.kind
    where = _where(done, first)
    if kind == vocab.CLAIM:
        label = f"claim {where} fence {fence}" if status == "ok" else f"claim {where} refused"
    elif kind == vocab.CALL:
        resource = first.resource or (done.resource if done else None)
        answer = "?" if done is None or done.type == vocab.INFO else done.status
        label = f"call {resource} {where} fence {fence} \u2192 {answer}"
    elif kind == vocab.RECEIPT:
        label = f"receipt {where} {first.status or ''}".rstrip()
    else:  # commit
        to = first.to_state or (done.to_state if done else None)
        label = f"commit {where} fence {fence} \u2192 {to}" + (" refused" if status == "fail" else "")
    if indeterminate:
        label += " (indeterminate)"
    detail = _detail(events[first.index]) if done is None or done is first else \
        _detail(events[first.index]) + "\n" + _detail(events[done.index])
    return Item(link(first.index), first.index, first.process, kind, label, status, start,
                max(start, end), end_index=done.index if done is not None else None, fence=fence,
                indeterminate=indeterminate, detail=clip(detail, _DETAIL_CHARS))


def _instant(e: Event, t: TypedEvent | None) -> tuple[str, str, str, int | None] | None:
    """(kind, label, status, fence) of an instant event (``t``: its typed form, None when it is not
    in the vocabulary), or None when it is left off the timeline.

    The label is the event in words (:func:`killpoint.harness.narrate.describe`, as narration says
    it); the status says how it went: ok, fail, info (unknown, or a worker frozen) or event."""
    fence: int | None = None
    if isinstance(t, StoreEvent):
        fence = t.fence
        if t.kind == vocab.COMMIT_REJECTED:
            status = "fail"
        elif t.kind == vocab.STUCK_FLAGGED:
            status = "info"
        elif t.kind == vocab.CREATED:
            status, fence = "event", None
        else:
            status = vocab.OK if t.kind in _ACCEPTED else vocab.EVENT
    elif isinstance(t, Request):
        fence = t.fence
        status = "ok" if t.outcome in _OK_OUTCOMES else "info" if t.outcome == vocab.DROPPED else "fail"
    elif isinstance(t, HarnessAction):
        if t.kind == vocab.EXIT:
            status = "fail" if t.signal or t.code != 0 else "ok"
        elif t.kind in (vocab.KILL, vocab.BOUND_HIT, vocab.TERMINATE_BACKEND):
            status = "fail"
        elif t.kind == vocab.STOP:
            status = "info"
        else:
            status = "event"
    elif isinstance(t, PointHit):
        if t.action is None:
            return None
        status = "fail" if t.action == KILL else "info"
    elif isinstance(t, WorkerEvent):
        if t.kind in _WORKER_SKIPPED:
            return None
        status = "info" if t.kind == vocab.HEARTBEAT_LOST else "event"
        fence = None if t.kind == vocab.HEARTBEAT_LOST else t.fence
    elif isinstance(t, TargetEvent):
        status, fence = "event", _int(t.fence)
    else:  # not in the vocabulary (an operation is drawn from its invoke, never here)
        status = "event"
    return e.kind, describe_event(e), status, fence


def describe(e: Event) -> str:
    """A one-line description of any event, for proof links and tooltips: its link id, its process,
    then the event in words."""
    return f"e{e.index} {e.process} {describe_event(e)}"


# -- tables ---------------------------------------------------------------------------------------
def _event_row(e: Event, t0: int, proof: bool, in_timeline: bool) -> EventRow:
    t = _typed(e)
    status: str
    if isinstance(t, WorkerOp):
        status = t.type if t.type in STATUSES else "event"
    else:
        made = _instant(e, t)
        status = made[2] if made else "event"
    # The table's columns: a request names its step in its meta, which its fields show.
    inst, step = (None, None) if isinstance(t, Request) else about(e)
    return EventRow(e.index, link(e.index), round((e.time - t0) / 1e6, 3), e.process, e.kind, e.type,
                    status, "" if inst is None else str(inst), "" if step is None else str(step),
                    _fields(e), proof, in_timeline)


def _fields(e: Event) -> str:
    """The data of an event as ``key=value`` pairs, without the instance and step (they have
    columns of their own); a value that is not a plain word is written as JSON."""
    parts = []
    for key, value in e.data.items():
        if key in ("instance", "step"):
            continue
        if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
            text = value
        else:
            try:
                text = json.dumps(value, default=str, ensure_ascii=False)
            except (TypeError, ValueError):
                text = repr(value)
        parts.append(f"{key}={text}")
    return clip(" ".join(parts), _DETAIL_CHARS)


def _ledger_row(r: Request) -> LedgerRow:
    status = "ok" if r.outcome in _OK_OUTCOMES else "info" if r.outcome == vocab.DROPPED else "fail"
    return LedgerRow(r.index, link(r.index), r.seq, str(r.resource), r.key, str(r.scope or ""),
                     str(r.intent_hash or ""), r.fence, str(r.meta.worker or ""), r.meta.attempt, r.status,
                     r.outcome, r.applied, status)


def _typed(e: Event) -> TypedEvent | None:
    """The event's typed form; None for one not in the vocabulary (the report shows it as written)."""
    try:
        return e.typed
    except InvalidEvent:
        return None


def _detail(e: Event) -> str:
    try:
        text = json.dumps(dict(e.data), default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(dict(e.data))
    return clip(text, _DETAIL_CHARS)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the index ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexRow:
    position: int  # 1-based, the order the runs were made in
    run_id: str
    verdict: str
    schedule: str
    target: str
    seed: int
    href: str | None  # relative link to the run report; None: no page was written for it (the index only)
    violated: tuple[str, ...]  # invariant names
    slots: tuple[int, ...]  # filter slots of those invariants
    violations: tuple[ViolationView, ...]
    unknown_reasons: tuple[str, ...]
    duration_ms: float
    reproduce: str
    test: str | None = None  # the pytest node id of the test that made the run


@dataclass(frozen=True)
class Filter:
    """A filter of the index by violated invariant; ``slot`` is a small number used as its CSS id,
    so no run-controlled text ever lands in a selector."""

    invariant: str
    slot: int
    runs: int


@dataclass(frozen=True)
class IndexReport:
    title: str
    verdict: str
    rows: tuple[IndexRow, ...]  # violated first, then unknown, then valid
    filters: tuple[Filter, ...]
    invariants: tuple[tuple[str, int, int, int], ...]  # name, runs checked, violated, not applicable
    counts: tuple[tuple[str, int], ...]  # verdict word, runs
    exercise: str = ""  # what the runs' faults provoked, in a line (harness.exercise)
    # Why the runs together are unknown whatever each one's verdict (no pause exercised a takeover...)
    whole_reasons: tuple[str, ...] = ()

    @property
    def has_tests(self) -> bool:
        return any(r.test for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "valid": {"valid": True, "violated": False}.get(self.verdict),
                "exercise": self.exercise, "unknown_reasons": list(self.whole_reasons),
                "runs": [{"run_id": r.run_id, "verdict": r.verdict, "schedule": r.schedule,
                          "href": r.href, "violated": list(r.violated), "reproduce": r.reproduce,
                          "test": r.test}
                         for r in self.rows]}


_ORDER = {"violated": 0, "unknown": 1, "valid": 2}


def build_index(results: Sequence[RunResult], hrefs: Sequence[str | None], *, title: str,
                reproduce: Sequence[str] | None = None,
                tests: Sequence[str | None] | None = None) -> IndexReport:
    """The model of the index over many runs; ``hrefs[i]`` links to the report of ``results[i]``
    (None: no page was written for it), ``tests[i]`` (optional) names the test that made it."""
    if len(hrefs) != len(results):
        raise ValueError(f"{len(results)} results but {len(hrefs)} links: give one link per run")
    if tests is not None and len(tests) != len(results):
        raise ValueError(f"{len(results)} results but {len(tests)} test names: give one per run")
    names_of = list(tests) if tests is not None else [None] * len(results)
    if reproduce is None:
        reproduce = [r.config.reproduce_command() for r in results]
    reproduce = [redact(cmd) for cmd in reproduce]
    names: list[str] = []
    checked: dict[str, int] = {}
    violated_runs: dict[str, int] = {}
    na_runs: dict[str, int] = {}
    for r in results:
        for res in r.verdict.results:
            if res.invariant not in checked:
                names.append(res.invariant)
                checked[res.invariant] = violated_runs[res.invariant] = na_runs[res.invariant] = 0
            checked[res.invariant] += bool(res.checked) and res.applicable
            violated_runs[res.invariant] += res.valid is False
            na_runs[res.invariant] += not res.applicable
    filters = tuple(Filter(n, slot, violated_runs[n])
                    for slot, n in enumerate([n for n in names if violated_runs[n]], start=1))
    slot_of = {f.invariant: f.slot for f in filters}
    rows = []
    for pos, (r, href, cmd, test) in enumerate(zip(results, hrefs, reproduce, names_of), start=1):
        bad = tuple(dict.fromkeys(res.invariant for res in r.verdict.results if res.valid is False))
        schedule = str(r.config.schedule)
        views = tuple(ViolationView(v.invariant, v.instance, v.step, v.detail,
                                    tuple(EventRef(i, link(i), f"e{i}") for i in v.events),
                                    v.schedule or schedule, cmd) for v in r.verdict.violations)
        rows.append(IndexRow(pos, r.run_id, verdict_word(r.verdict.valid), schedule, r.config.target_name,
                             r.config.seed, href, bad, tuple(slot_of[b] for b in bad if b in slot_of),
                             views, tuple(str(u) for u in r.verdict.unknown_reasons),
                             round(r.duration_s * 1000, 1), cmd, test))
    rows.sort(key=lambda row: (_ORDER[row.verdict], row.position))
    counts = tuple((w, sum(1 for row in rows if row.verdict == w)) for w in ("violated", "unknown", "valid"))
    from killpoint.harness.exercise import matrix_reasons, total

    tally = total(r.exercise for r in results)
    whole = matrix_reasons(tally)
    valid = rank(r.verdict.valid for r in results) if results else None
    overall = verdict_word(None if valid is True and whole else valid)
    return IndexReport(title, overall, tuple(rows), filters,
                       tuple((n, checked[n], violated_runs[n], na_runs[n]) for n in names), counts,
                       tally.line(), whole)
