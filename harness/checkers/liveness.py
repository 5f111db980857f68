"""Liveness: with the harness quiescent every step settled (``terminates``), and a worker that hangs
with its heartbeat alive is flagged within the stuck bound (``stuck_detected``), counting only the
time some other worker was free to look."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any, Mapping, Sequence

from killpoint import vocab as v
from killpoint.harness.checkers._common import HANG, SLEEP, StepId, _idx, _last_store, _result, _step_of
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import HarnessAction, PointHit, Spawn, Starved, StoreEvent, TypedEvent
from killpoint.harness.history import History
from killpoint.harness.states import MANUAL, PENDING, SETTLED, WAITING_APPROVAL

# Settled states that wait for an outside event (an operator, an approval) and hold later steps.
_AWAITING_OUTSIDE = frozenset({MANUAL, WAITING_APPROVAL})
_NO_FINAL_STATE = "(no final state)"  # a workload step the final states leave out


def terminates(history: History) -> Result:
    """With the harness quiescent every step settled; a step left mid-flight is stuck forever.

    A run that hit its bound proves nothing either way, unless every step had settled anyway.
    A step in manual review or awaiting approval holds the steps after it (nothing after it runs
    until an outside event), so a pending step behind one is waiting, not stuck.
    """
    name = "terminates"
    final = list(history.final)
    if final:
        # A step of the workload with no final row at all (a target's final_states() that leaves
        # it out: never done, or lost) did not terminate either. It stands in the workload's order
        # as a step not started, so that one behind a step awaiting an outside event is held.
        named = {(row["instance"], row["step"]) for row in final}
        missing = [s for s in history.steps if (s.instance, s.step) not in named]
        if missing:
            order = {(s.instance, s.step): n for n, s in enumerate(history.steps)}
            final += [{"instance": s.instance, "step": s.step, "state": _NO_FINAL_STATE} for s in missing]
            final.sort(key=lambda row: order.get((row["instance"], row["step"]), len(order)))
    unsettled = [row for row in final if row["state"] not in SETTLED]
    if unsettled:
        held: set[StepId] = set()
        blocked: set[Any] = set()  # instances with a step awaiting an outside event
        for row in final:  # the store's order: instance, then step index
            if row["instance"] in blocked and row["state"] in (PENDING, _NO_FINAL_STATE):
                held.add((row["instance"], row["step"]))
            if row["state"] in _AWAITING_OUTSIDE:
                blocked.add(row["instance"])
        unsettled = [row for row in unsettled if (row["instance"], row["step"]) not in held]
    if history.bound_hit:
        if final and not unsettled:
            return Result(name, True, True, (), "run hit its bound, but every step had settled")
        return Result(name, None, False, (), "run hit its bound")
    if not history.quiescent or not final:
        return _result(name, False, [], "run not quiescent" if final else "no steps")
    last_store = _last_store(history)
    violations = [Violation(
        name, row["instance"], row["step"],
        f"instance {row['instance']} did not reach a terminal state: step {row['step']} " + (
            "has no final state (the target's final_states() does not name it: never done, or lost)"
            if row["state"] == _NO_FINAL_STATE else f"is {row['state']}"),
        _idx([last_store.get((row["instance"], row["step"]))]))
        for row in unsettled]
    return _result(name, True, violations, f"{len(final)} step(s)")


def stuck_detected(history: History) -> Result:
    """A worker hanging with its heartbeat alive is flagged within stuck_bound + slack.

    (Over 80 lines: the indexes its questions share -- flags, claims, deaths, lease owners,
    starvation -- are built once here, and each question is a nested function reading them.)

    The bound counts time the machine gave the run: where the harness recorded that it was
    starved itself (a ``starved`` event: its own wait overran, as on a loaded CI runner), the
    workers' monitors were held back too, and the deadline moves by that much.

    The bound also counts only time in which some other worker could have flagged the hang: one
    that was started, not yet dead, and not itself stalled by a fault (asleep in a ``sleep``,
    hung, or frozen by a ``pause``). A schedule that stalls every other worker past the bound
    leaves nobody to look; the deadline then runs from when somebody could (and a hang no worker
    was ever free to flag is not judged). A worker whose monitor never flags is caught as before:
    its deadline comes once another worker is free.

    A hang whose deadline lies beyond the end of the history, or whose worker died before the
    deadline (its heartbeat stopped with it), cannot be judged and does not count as checked.
    Neither can a hang while the store shows the worker held no lease on the step (before its
    claim, after its commit): its heartbeat renews nothing and blocks nobody, so there is nothing
    to flag.
    """
    name = "stuck_detected"
    if not history.events:
        return _result(name, False, [])
    end = history.events[-1].time
    window = int(round((history.stuck_bound_ms + history.stuck_slack_ms) * 1_000_000))
    flags: dict[StepId, list[StoreEvent]] = defaultdict(list)
    claims: dict[StepId, list[StoreEvent]] = defaultdict(list)
    deaths: dict[Any, list[HarnessAction]] = defaultdict(list)
    owners: dict[StepId, list[StoreEvent]] = defaultdict(list)  # events that set or clear the lease
    identity: dict[Any, Any] = {}  # worker incarnation (A.2) -> the identity the store saw (A)
    for h in history.typed(HarnessAction):
        if h.kind in (v.KILL, v.EXIT):
            deaths[h.worker].append(h)
        elif isinstance(h, Spawn) and h.identity is not None:
            identity[h.worker] = h.identity
    for e in history.typed(StoreEvent):
        if e.kind == v.STUCK_FLAGGED:
            flags[_step_of(e)].append(e)
        elif e.kind == v.CLAIMED:
            claims[_step_of(e)].append(e)
        if e.kind in (v.CREATED, v.CLAIMED, v.STUCK_FLAGGED) or (e.kind == v.COMMITTED and e.fence is not None):
            owners[_step_of(e)].append(e)

    # Each list is in history order, so in time order: a bisection finds the events around a hang
    # without rescanning them (a worker may die many times in a long history).
    def times(index: Mapping[Any, Sequence[TypedEvent]]) -> dict[Any, list[int]]:
        return {k: [x.time for x in evs] for k, evs in index.items()}
    flag_times, death_times, owner_times = times(flags), times(deaths), times(owners)
    claim_times = times(claims)
    starved = [(e.time, int(round(float(e.ms or 0) * 1_000_000))) for e in history.typed(Starved)]
    starved_times = [t for t, _ in starved]

    def deadline_of(hang: PointHit, start: int | None = None) -> int:
        """The hang's deadline (``start``: when the window ends, by default ``window`` after the
        hang), moved by every starvation of the harness before it."""
        deadline = hang.time + window if start is None else start
        for t, ns in starved[bisect_left(starved_times, hang.time):]:
            if t > deadline:
                break
            deadline += ns
        return deadline

    def held_no_lease(hang: PointHit, sid: StepId) -> bool:
        n = bisect_right(owner_times.get(sid, ()), hang.time)  # the owner events up to the hang
        if n == 0:
            return False  # the store says nothing: judge the hang
        last = owners[sid][n - 1]
        who = identity.get(hang.process, str(hang.process).split(".")[0])
        return not (last.kind == v.CLAIMED and last.worker == who)

    def first_from(index: dict[Any, list[int]], key: Any, t: int) -> int | None:
        """The time of the first event of ``index[key]`` at or after ``t``."""
        ts = index.get(key, ())
        i = bisect_left(ts, t)
        return ts[i] if i < len(ts) else None
    violations: list[Violation] = []
    checked = False
    free: dict[Any, list[tuple[int, int]]] | None = None  # made only for a hang flagged late
    for hit in history.typed(PointHit):
        if hit.action != HANG:
            continue
        sid = _step_of(hit)
        if None in sid or held_no_lease(hit, sid):
            continue
        deadline = deadline_of(hit)
        # A flag ends the hang's hold on its step; so does a later claim of the step (the hung
        # worker's heartbeat was not running -- it hung before its first beat -- and its lease
        # ran out): either way the step is free again, which is what the bound is about.
        ends = [t for t in (first_from(flag_times, sid, hit.time), first_from(claim_times, sid, hit.time + 1))
                if t is not None]
        flagged = min(ends) if ends else None
        if flagged is not None and flagged <= deadline:
            checked = True
            continue
        # Not flagged in time: give the window only the time some other worker was free to look
        # (known where the harness recorded who it started: a run's history always does).
        if free is None:
            free = _free_intervals(history)
        if free:
            window_end = _after_free_time(hit.time, window, [iv for w, ivs in free.items()
                                                           if w != hit.process for iv in ivs])
            if window_end is None:  # the other workers were free for less than the window in all
                checked = checked or flagged is not None  # ended within it: judged, and held
                continue  # else nobody was free long enough to flag it: nothing to judge
            deadline = deadline_of(hit, window_end)
            if flagged is not None and flagged <= deadline:
                checked = True
                continue
        died = first_from(death_times, hit.process, hit.time)
        if died is not None and died <= deadline:
            continue  # the worker died unflagged before the deadline: its heartbeat died with it
        if end <= deadline:
            continue  # the history ends before the deadline
        checked = True
        late = flags.get(sid, [])[bisect_right(flag_times.get(sid, ()), deadline):]
        ms = (deadline - hit.time) / 1_000_000
        if late:
            after = (late[0].time - hit.time) / 1_000_000
            detail = (f"worker {hit.process} hung at {hit.point} on step {sid[1]} of {sid[0]} "
                      f"and was flagged only after {after:g} ms (bound {ms:g} ms)")
        else:
            detail = (f"worker {hit.process} hung at {hit.point} on step {sid[1]} of {sid[0]} "
                      f"and was never flagged within {ms:g} ms")
        violations.append(Violation(name, sid[0], sid[1], detail, _idx([hit, *late[:1]])))
    return _result(name, checked, violations)


_FOREVER = 1 << 62


def _free_intervals(history: History) -> dict[Any, list[tuple[int, int]]]:
    """For each worker incarnation, the spans of run time (ns) in which it could act: from its
    spawn to its death, less the spans a fault stalled it -- asleep in a ``sleep`` (for the
    schedule's length of it), hung (for good), frozen by a ``pause`` (from the harness's SIGSTOP
    to its SIGCONT)."""
    sleeps: dict[int, int | None] | None = None  # fault index -> its sleep's ms, read once
    born: dict[Any, int] = {}
    dead: dict[Any, int] = {}
    stalls: dict[Any, list[list[int]]] = defaultdict(list)  # [start, end] spans, end open = FOREVER
    for t in history.typed_events:
        if isinstance(t, HarnessAction):
            w = t.worker
            if t.kind == v.SPAWN:
                born.setdefault(w, t.time)
            elif t.kind in (v.KILL, v.EXIT):
                dead.setdefault(w, t.time)
            elif t.kind == v.STOP:
                stalls[w].append([t.time, _FOREVER])
            elif t.kind == v.CONT and stalls.get(w) and stalls[w][-1][1] == _FOREVER:
                stalls[w][-1][1] = t.time
        elif isinstance(t, PointHit) and t.action == HANG:
            stalls[t.process].append([t.time, _FOREVER])
        elif isinstance(t, PointHit) and t.action == SLEEP:
            # as long as the schedule's sleep, on the run clock (the history's time); unknown: to
            # the end (not free, so never a deadline that lands on a worker that was asleep)
            if sleeps is None:
                sleeps = _sleep_lengths(history)
            ms = sleeps.get(-1 if t.fault is None else t.fault)
            stalls[t.process].append([t.time, _FOREVER if ms is None else t.time + int(ms * 1_000_000)])
    out: dict[Any, list[tuple[int, int]]] = {}
    for w, start in born.items():
        end = dead.get(w, _FOREVER)
        spans, at = [], start
        for s0, s1 in sorted(stalls.get(w, ())):
            if s0 > at:
                spans.append((at, min(s0, end)))
            at = max(at, s1)
        if at < end:
            spans.append((at, end))
        out[w] = [sp for sp in spans if sp[0] < sp[1]]
    return out


def _sleep_lengths(history: History) -> dict[int, int | None]:
    """For each fault of the history's schedule (by index), how long its ``sleep`` lasts in ms
    (None: no sleep, or a chain of two lengths, which is not known here)."""
    from killpoint import chaos
    from killpoint.chaos.points import POINTS

    names = frozenset(e.point for e in history.typed(PointHit)) | POINTS
    try:
        faults = chaos.parse(history.schedule, points=names).faults
    except chaos.InvalidSchedule:
        return {}
    out: dict[int, int | None] = {}
    for i, fault in enumerate(faults):
        lengths = {t.arg for t in fault.actions.terms if t.action == SLEEP}
        out[i] = lengths.pop() if len(lengths) == 1 else None
    return out


def _after_free_time(start: int, window: int, spans: list[tuple[int, int]]) -> int | None:
    """The time at which ``window`` ns of time covered by ``spans`` (any worker free) have passed
    since ``start``; None if they never do."""
    left = window
    at = start
    for s0, s1 in sorted(spans):
        s0 = max(s0, at)
        if s1 <= s0:
            continue
        if s1 - s0 >= left:
            return s0 + left
        left -= s1 - s0
        at = s1
    return None
