"""Events in words: :func:`describe` says what any one event means (who claimed which step with which
fence, what the downstream answered, who was stopped, killed or refused), and :func:`narrate` tells
a run's story in those words. Narration (demo, replay --narrate, scenarios) and reports both describe
events with :func:`describe`, so they never tell the same event two ways."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from killpoint import vocab as v
from killpoint.errors import InvalidEvent
from killpoint.harness.events import (BoundHit, DownstreamRestart, HarnessAction, Held, LateGraceOver, PointHit,
                                      Request, Spawn, Stop, StoreEvent, StoreRestart, TerminateBackend,
                                      UnfiredGivenUp, WorkerEvent, WorkerOp)
from killpoint.harness.history import Event, History

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult


# Times in narration and reports are the run's time: CLOCK_MONOTONIC plus the run clock's offset
# then in force (harness.clock), so on the virtual clock a 30 s lease is 30 s here although it cost
# no wall time. Below LONG_NS they read in milliseconds, from it in seconds.
LONG_NS = 10_000_000_000
# Consecutive lines of a narration this far apart get a line saying how much run time passed.
GAP_TOLD_NS = 1_000_000_000


def run_time(ns: int, *, ms_places: int = 1, s_places: int = 4) -> str:
    """A time of the run (nanoseconds since its first event), in ms below 10 s, else in s."""
    return f"{ns / 1e6:.{ms_places}f} ms" if ns < LONG_NS else f"{ns / 1e9:.{s_places}f} s"


def gap(ns: int) -> str:
    """A stretch of run time, as a timeline's axis break and a narration's gap line say it: "+30.0 s"."""
    return f"+{ns / 1e6:.1f} ms" if ns < 1_000_000_000 else f"+{ns / 1e9:.1f} s"


def clock_note(virtual: bool) -> str:
    """What the times of a run are, in a few words."""
    return ("run time on the virtual clock: a wait every worker was blocked in (a lease running out, "
            "a stuck bound) is there at its full length but cost no wall time"
            if virtual else "run time with the clock off (--real-time): wall time")


def clock_legend(virtual: bool) -> str:
    """The line that says once, before a command's stories, what their times are."""
    return f"Times are {clock_note(virtual)}; \u22ee marks such a wait."


def _known(text: str, *values: Any) -> str:
    """``text`` formatted with ``values``, or "" when any of them is missing: a printed field is
    filled or left out, never "None"."""
    return "" if any(x is None for x in values) else text.format(*values)


def _ms(e: Event, t0: int) -> str:
    return f"{run_time(e.time - t0):>10}"


def focus(history: History) -> set[tuple[str, str]]:
    """The steps a run's faults fired on (what a narration should follow)."""
    return history.fired_steps()


def _pid(pid: Any, form: str = " (pid {})") -> str:
    return "" if pid is None else form.format(pid)


def _moment(moment: str) -> str:
    """A pause's resume moment, in words."""
    if moment == "lapse":
        return "its lease lapsed and another worker is about to claim its step"
    return f"another worker reaches {moment} of its step"


def _harness(h: HarnessAction) -> str:
    worker, pid = h.worker, h.pid
    if isinstance(h, Spawn):
        same = " (same identity)" if h.identity not in (None, worker) else ""
        return f"started worker {worker}{_pid(pid, ' as pid {}')}{same}"
    if h.kind == v.KILL:
        return f"{h.signal or 'SIGKILL'} to {worker}{_pid(pid)}: {h.reason}"
    if isinstance(h, Stop):
        until = f", until {_moment(h.until)}" if h.until else ""
        return f"SIGSTOP to {worker}{_pid(pid)}, frozen with its heartbeat{until}"
    if isinstance(h, Held):
        return (f"held {worker}{_pid(pid)} at {h.point} of {h.instance}/{h.step}, "
                f"the moment {h.frozen}'s pause waited for, while {h.frozen} goes on")
    if h.kind == v.CONT:
        if h.signal is None:
            return f"released {worker}{_pid(pid)}: {h.reason}"
        return f"SIGCONT to {worker}{_pid(pid)}: {h.reason}"
    if isinstance(h, DownstreamRestart):
        return (f"restarted the downstream: pid {h.pid_before} killed, pid "
                f"{pid} serves the same ledger at the same address {h.address}")
    if isinstance(h, StoreRestart):
        killed = ", ".join(h.killed or ()) or "no worker"
        return (f"restarted the store: every connection to it cut ({killed} killed with "
                f"theirs), its own handle closed and reopened")
    if isinstance(h, BoundHit):
        why = f"{h.seconds:g} s" if h.seconds is not None else h.reason
        return f"the run hit its bound ({why}); what is still running is ended"
    if isinstance(h, TerminateBackend):
        states = h.states or {}
        ended = ", ".join(f"{p} ({states.get(str(p))})" for p in h.backend_pids or ()) or "none"
        return (f"pg_terminate_backend for {worker}'s database sessions at "
                f"{h.step}.{h.point}: {ended}")
    if h.kind == v.AFTER_QUIESCENT:
        return "the run is quiescent; an outside actor acts before the history is judged"
    if h.kind == v.REPLACEMENTS_STOPPED:
        return f"no more replacements: the target raised {h.error} again (in {worker})"
    if isinstance(h, UnfiredGivenUp):
        return (f"the target's done() said the work was finished for {h.seconds:g} s with "
                f"{', '.join(h.faults or ())} still unfired: the run ends")
    if isinstance(h, LateGraceOver):
        # seconds: the grace, in time the workers could run; wall_s: what it took on the clock
        # (absent from histories written before the grace left out the wait for a CPU).
        workers, wall = ", ".join(h.workers or ()), h.wall_s
        if h.capped:
            return (f"{workers} resumed late and still running {wall:.1f} s after the target's done() said "
                    f"yes, most of it waiting for a CPU (the cap on the {h.seconds:g} s grace): "
                    f"ended as workers that serve forever")
        waited = ""
        if wall is not None and h.seconds is not None and round(wall, 1) > h.seconds:
            waited = f" (in {wall:.1f} s of wall time: time spent waiting for a CPU does not count)"
        return (f"{workers} resumed late and still running {h.seconds:g} s after the target's done() "
                f"said yes{waited}: ended as workers that serve forever")
    if h.kind == v.EXIT:
        how = f"killed by {h.signal}" if h.signal else f"exit code {h.code}"
        return f"worker {worker}{_pid(pid)} ended, {how}"
    return h.kind


def _store(e: StoreEvent) -> str:
    where = f"{e.instance}:{e.step}"
    fence = f" with fence {e.fence}" if e.fence is not None else ""
    # A target's own records may not say who wrote a change (procrastinate's job events do not).
    who = e.worker or "a worker"
    moved = _known("{} -> {}", e.from_state, e.to_state)
    if e.kind == v.CLAIMED:
        told = ", ".join(x for x in (_known("attempt {}", e.attempt), moved) if x)
        return f"{who} claimed {where}{fence}" + (f" ({told})" if told else "")
    if e.kind == v.COMMITTED:
        why = f"; reason: {e.reason}" if e.reason else ""
        whose = f"{e.worker}'s commit" if e.worker else "a commit"
        told = _known("state version {}", e.state_version) + why
        return (f"accepted {whose}{fence}: {where}" + (f" {moved}" if moved else "")
                + (f" ({told.lstrip('; ')})" if told else ""))
    if e.kind == v.COMMIT_REJECTED:
        now = ", ".join(x for x in (_known("fence {}", e.lease_version),
                                    _known("state version {}", e.state_version)) if x)
        expected = _known(" (expected {})", e.expected_state_version) if now else ""
        whose = f"{e.worker}'s commit" if e.worker else "a commit"
        return (f"REFUSED {whose}{fence}: the lease is at {now}{expected}" if now else
                f"REFUSED {whose}{fence} on {where}: a stale write")
    if e.kind == v.STUCK_FLAGGED:
        owner = f" {e.stuck_owner}" if e.stuck_owner is not None else ""
        idle = _known(" for {} ms", e.idle_ms)
        return f"{who} flagged{owner} stuck on {where}: heartbeat alive, no progress{idle}; lease freed"
    if e.kind == v.RECEIPT_RECORDED:
        what = f"receipt {e.key}" if e.key is not None else f"a receipt for {where}"
        return f"{who} recorded {what}" + _known(" = {}", e.status)
    if e.kind == v.OPERATOR_RESOLVED:
        actor = f"operator {e.actor}" if e.actor is not None else "an operator"
        return f"{actor} moved {where}" + _known(" to {}", e.to_state) + _known(" (evidence: {})", e.evidence)
    if e.kind == v.CREATED:
        return f"created {where}" + _known(" ({})", e.to_state)
    if e.kind in (v.RENEWED, v.RELEASED):
        return f"{who} {e.kind} its lease on {where}{fence}"
    return f"{e.kind} {where}" + (f" by {e.worker}" if e.worker else "")


def _request(r: Request) -> str:
    key = r.key or "(no key: legacy)"
    fence = f" fence {r.fence}" if r.fence is not None else ""
    who = r.meta.worker or "a client"
    answer = " ".join(str(x) for x in (r.status, r.outcome) if x is not None)
    return (f"{who} -> {r.resource} key {key}{fence}: {answer or 'no answer'}"
            + (" (a new effect)" if r.applied else ""))


def _op(e: WorkerOp) -> str:
    where = f"{e.instance}:{e.step}"
    if e.kind == v.CALL and e.type == v.INFO:
        return f"call outcome unknown ({'it died first' if e.indeterminate else e.error})"
    if e.type == v.INVOKE:
        fence = f" with fence {e.fence}" if e.fence is not None else ""
        what = f" {e.resource}" if e.kind == v.CALL and e.resource else ""
        return f"{e.kind}{what} {where}{fence}"
    how = {v.OK: "done", v.FAIL: "certainly not done", v.INFO: "outcome unknown"}[e.type]
    return f"{e.kind} {how}: {e.error}" if e.error else f"{e.kind} {where} {how}"


def _hit(e: PointHit) -> str:
    if e.action:
        return f"hit {e.step}.{e.point} -> {e.action}"
    return f"passed {e.step}.{e.point} (hit {e.hit}; nothing fired)"


def _worker(e: WorkerEvent) -> str:
    where = f"{e.instance}:{e.step}"
    if e.kind == v.RECOVER:
        source = f" (from the {e.source})" if e.source else ""
        receipt = f"receipt {e.receipt}{source}" if e.receipt is not None else "no receipt"
        safe = "retry-safe" if e.retry_safe is True else "not retry-safe" if e.retry_safe is False else ""
        attempts = _known("{}/{} attempts", e.attempts, e.max_attempts)
        told = ", ".join(x for x in (receipt, safe, attempts) if x)
        return f"recovery evidence: {told}" + _known(" -> {}", e.action)
    if e.kind == v.CHECKPOINT:
        return f"checkpoint of {e.instance} {e.outcome}: {e.reason}"
    if e.kind == v.HEARTBEAT_LOST:
        return f"heartbeat found the lease on {where} gone" + _known(" (fence {})", e.fence)
    if e.kind == v.STORE_UNAVAILABLE:
        how = "outcome unknown" if e.outcome_unknown else "rolled back"
        return f"store connection lost ({how}): {e.error}"
    if e.kind == v.START:
        return f"started{_pid(e.pid, ' as pid {}')}"
    if e.kind == v.FINISH:
        return "finished"
    if e.kind == v.RAISED:
        return f"the target raised {e.error} (a finding: its traceback is in this event)"
    if e.kind == v.SOMETIMES:
        return f"expectation {e.name!r} {'reached' if e.reached else 'evaluated, not reached'}"
    return f"{e.kind} {where}" if e.instance is not None else e.kind


def describe(e: Event) -> str:
    """What one event says, in words: the one describer of events, for narration, reports and
    scenarios. Never empty; the process is not repeated (a caller shows it as it likes)."""
    try:
        t = e.typed
    except InvalidEvent as exc:  # shown as written, with what is wrong (the verdict says it too)
        return f"{e.kind} (not in the vocabulary: {exc.field} is wrong)"
    if isinstance(t, HarnessAction):
        return _harness(t)
    if isinstance(t, StoreEvent):
        return _store(t)
    if isinstance(t, Request):
        return _request(t)
    if isinstance(t, WorkerOp):
        return _op(t)
    if isinstance(t, PointHit):
        return _hit(t)
    if isinstance(t, WorkerEvent):
        return _worker(t)
    return f"{t.kind} {t.instance}:{t.step}" if t.instance is not None else t.kind


# What a narration tells: everything the harness and the downstream did, the store's decisions, and
# what a worker found out (a fault firing, recovery, an unknown or failed operation, a checkpoint, a
# lost lease). The rest (claims invoked, leases renewed...) is in the report's event table.
_TOLD_STORE = frozenset({v.CLAIMED, v.COMMITTED, v.COMMIT_REJECTED, v.STUCK_FLAGGED, v.RECEIPT_RECORDED,
                         v.OPERATOR_RESOLVED})
_TOLD_WORKER = frozenset({v.RECOVER, v.CHECKPOINT, v.HEARTBEAT_LOST, v.RAISED})


def tells(e: Event) -> bool:
    """Whether a narration tells this event."""
    try:
        t = e.typed
    except InvalidEvent:
        return True  # told as written: a narration that hid it would hide why the run is unknown
    if isinstance(t, (HarnessAction, Request)):
        return True
    if isinstance(t, StoreEvent):
        return t.kind in _TOLD_STORE
    if isinstance(t, PointHit):
        return bool(t.action)
    if isinstance(t, WorkerOp):
        return (t.kind == v.CALL and t.type == v.INFO) or (bool(t.error) and t.type in (v.INFO, v.FAIL))
    return t.kind in _TOLD_WORKER


def line(e: Event) -> str | None:
    """The narration line of an event (its process, then :func:`describe`), or None when a
    narration does not tell it."""
    return f"{e.process}: {describe(e)}" if tells(e) else None


def about(e: Event) -> tuple[Any, Any]:
    """The (instance, step) an event is about; (None, None) for one about no step."""
    try:
        t = e.typed
    except InvalidEvent:
        return (None, None)
    if isinstance(t, Request):
        return (t.meta.instance, t.meta.step)
    return (t.instance, t.step)


def narrate(history: History, steps: Iterable[tuple[str, str]] | None = None) -> list[str]:
    """Timestamped lines for the given steps (default: the steps a fault fired on) and the harness."""
    wanted = set(steps) if steps is not None else focus(history)
    instances = {instance for instance, _ in wanted}
    if not history.events:
        return []
    t0 = history.events[0].time
    out = []
    last: int | None = None
    for e in history.events:
        where = about(e)
        if e.process != v.HARNESS and where not in wanted and \
                not (where[1] is None and where[0] in instances):  # an event about a whole instance
            continue
        text = line(e)
        if text:
            if last is not None and e.time - last >= GAP_TOLD_NS:
                out.append(f"{'':>10}  \u22ee {gap(e.time - last)} of run time")
            out.append(f"{_ms(e, t0)}  {text}")
            last = e.time
    return out


def story(result: RunResult) -> list[str]:
    """The demo's story of one run (a :class:`harness.run.RunResult`): the narration of the steps
    its faults fired on (of every step a violation names, when no fault fired there), what each of
    those steps ended as with the effects the downstream applied, and the verdict."""
    history: History = result.history
    steps = focus(history) | {(x.instance, x.step) for x in result.verdict.violations
                              if x.instance is not None and x.step is not None}
    out = list(narrate(history, steps))
    for instance, step in sorted(steps, key=lambda s: (str(s[0]), str(s[1]))):
        effects = history.applied(instance=instance, step=step)
        out.append(f"=> {instance}:{step} ended {history.final_state(instance, step)} with "
                   f"{len(effects)} applied effect(s) in the downstream ledger")
    out.append(verdict_line(result))
    return out


def verdict_line(result: RunResult) -> str:
    """A run's verdict, as a story ends: the word, how many invariants judged it, its times. What the
    times are is said once per command (:func:`clock_legend`), not under every run."""
    judged = sum(1 for r in result.verdict.results if r.checked)
    word = v.VERDICT_WORDS[result.valid]
    return (f"verdict: {word} ({judged} of {len(result.verdict.results)} invariants judged; "
            f"{run_time(span(result.history))} of run time in {result.duration_s * 1000:.0f} ms)")


def span(history: History) -> int:
    """The run time from the first event of a history to its last, in nanoseconds."""
    return history.events[-1].time - history.events[0].time if history.events else 0
