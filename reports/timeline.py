"""The swimlane timeline of a run: its lanes, the marks on them and the leases held, as data.

Times are nanoseconds of the run's time since its first event: CLOCK_MONOTONIC plus the run clock's
offset (on the virtual clock, waits the harness skipped are in them at their full length). Every item
names the event it comes from by its link id, ``e<index>``, which is the anchor of that event's row
in the event table. The drawing itself is :mod:`killpoint.reports.layout`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from killpoint import vocab
from killpoint.harness.events import (HarnessAction, PointHit, Request, Spawn, StoreEvent, TargetEvent, TypedEvent,
                                      WorkerEvent, WorkerOp)
from killpoint.harness.history import Event, History
from killpoint.harness.narrate import describe as describe_event
from killpoint.reports.base import ACCEPTED, FIXED_LANES, KILL, OK_OUTCOMES, PAUSE, WORKER_SKIPPED, as_int, link, typed


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
        t = typed(e)
        if isinstance(t, WorkerOp):
            if t.index in completed:
                continue  # drawn with its invoke
            done = completion.get(t.index) if t.type == vocab.INVOKE else t
            items.append(_op_item(t, done, start, t0, end, proof))
            continue
        made = instant(e, t)
        if made is None:
            continue
        kind, label, status, fence = made
        stop = resumed.get(e.index) if isinstance(t, PointHit) and t.action == PAUSE else None
        items.append(Item(link(e.index), e.index, e.process, kind, label, status, start,
                          start if stop is None else max(start, stop.time - t0),
                          end_index=None if stop is None else stop.index, fence=fence,
                          proof=e.index in proof))
    ttl = None if lease_ttl_ms is None else int(lease_ttl_ms * 1e6)
    leases = tuple(_leases(history, t0, end, ttl, keep))
    if focus:  # a worker with nothing drawn about the focus instances gets no lane
        used = {i.lane for i in items} | {lease.lane for lease in leases}
        lanes = tuple(lane for lane in lanes if lane.kind != "worker" or lane.name in used)
    return Timeline(lanes, tuple(items), end, len(keep & set(range(len(events)))), len(events),
                    leases, tuple(focus))


def _leases(history: History, t0: int, run_end: int, ttl: int | None, keep: set[int]) -> list[Lease]:
    """Every lease the store granted by a claim in ``keep``, with when its holder stopped renewing it and how it ended
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
        if c.kind != vocab.CLAIMED or c.index not in keep:
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


def _op_item(first: WorkerOp, done: WorkerOp | None, start: int, t0: int, run_end: int, proof: set[int]) -> Item:
    """An operation from its invoke (``first``) to its completion ``done`` (None: never completed),
    marked when a violation names either end (``proof``)."""
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
    end_index = done.index if done is not None else None
    return Item(link(first.index), first.index, first.process, kind, label, status, start,
                max(start, end), end_index=end_index, fence=fence, indeterminate=indeterminate,
                proof=first.index in proof or end_index in proof)


def instant(e: Event, t: TypedEvent | None) -> tuple[str, str, str, int | None] | None:
    """(kind, label, status, fence) of an instant event (``t``: its typed form, None when it is not
    in the vocabulary), or None when it is left off the timeline.

    The label is the event in words (:func:`killpoint.harness.narrate.describe`, as narration says
    it); the status and fence are :func:`marking`'s."""
    made = marking(t)
    if made is None:
        return None
    return e.kind, describe_event(e), made[0], made[1]


def marking(t: TypedEvent | None) -> tuple[str, int | None] | None:
    """(status, fence) of an instant event, or None when it is left off the timeline (a failpoint
    passed where nothing fired, a worker's start or finish). The status says how it went: ok, fail,
    info (unknown, or a worker frozen) or event."""
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
            status = vocab.OK if t.kind in ACCEPTED else vocab.EVENT
    elif isinstance(t, Request):
        fence = t.fence
        status = "ok" if t.outcome in OK_OUTCOMES else "info" if t.outcome == vocab.DROPPED else "fail"
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
        if t.kind in WORKER_SKIPPED:
            return None
        status = "info" if t.kind == vocab.HEARTBEAT_LOST else "event"
        fence = None if t.kind == vocab.HEARTBEAT_LOST else t.fence
    elif isinstance(t, TargetEvent):
        status, fence = "event", as_int(t.fence)
    else:  # not in the vocabulary (an operation is drawn from its invoke, never here)
        status = "event"
    return status, fence
