"""Events in words: :func:`describe` says what any one event means (who claimed which step with which
fence, what the downstream answered, who was stopped, killed or refused), and :func:`narrate` tells
a run's story in those words. Narration (demo, replay --narrate, scenarios) and reports both describe
events with :func:`describe`, so they never tell the same event two ways."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from killpoint import vocab as v
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


def _harness(e: Event) -> str:
    d = e.data
    worker, pid = d.get("worker"), d.get("pid")
    if e.kind == v.SPAWN:
        same = " (same identity)" if d.get("identity") not in (None, worker) else ""
        return f"started worker {worker}{_pid(pid, ' as pid {}')}{same}"
    if e.kind == v.KILL:
        return f"{d.get('signal') or 'SIGKILL'} to {worker}{_pid(pid)}: {d.get('reason')}"
    if e.kind == v.STOP:
        return f"SIGSTOP to {worker}{_pid(pid)}, frozen with its heartbeat"
    if e.kind == v.CONT:
        if d.get("signal") is None:
            return f"released {worker}{_pid(pid)}: {d.get('reason')}"
        return f"SIGCONT to {worker}{_pid(pid)}: {d.get('reason')}"
    if e.kind == v.DOWNSTREAM_RESTART:
        return (f"restarted the downstream: pid {d.get('pid_before')} killed, pid "
                f"{d.get('pid')} serves the same ledger at the same address {d.get('address')}")
    if e.kind == v.STORE_RESTART:
        killed = ", ".join(d.get("killed") or ()) or "no worker"
        return (f"restarted the store: every connection to it cut ({killed} killed with "
                f"theirs), its own handle closed and reopened")
    if e.kind == v.BOUND_HIT:
        why = f"{d['seconds']:g} s" if d.get("seconds") is not None else d.get("reason")
        return f"the run hit its bound ({why}); what is still running is ended"
    if e.kind == v.TERMINATE_BACKEND:
        states = d.get("states") or {}
        ended = ", ".join(f"{p} ({states.get(str(p))})" for p in d.get("backend_pids") or ()) or "none"
        return (f"pg_terminate_backend for {worker}'s database sessions at "
                f"{d.get('step')}.{d.get('point')}: {ended}")
    if e.kind == v.AFTER_QUIESCENT:
        return "the run is quiescent; an outside actor acts before the history is judged"
    if e.kind == v.REPLACEMENTS_STOPPED:
        return f"no more replacements: the target raised {d.get('error')} again (in {worker})"
    if e.kind == v.LATE_GRACE_OVER:
        # seconds: the grace, in time the workers could run; wall_s: what it took on the clock
        # (absent from histories written before the grace left out the wait for a CPU).
        workers, wall = ", ".join(d.get("workers") or ()), d.get("wall_s")
        if d.get("capped"):
            return (f"{workers} resumed late and still running {wall:.1f} s after the target's done() said "
                    f"yes, most of it waiting for a CPU (the cap on the {d.get('seconds'):g} s grace): "
                    f"ended as workers that serve forever")
        waited = ""
        if wall is not None and round(wall, 1) > d.get("seconds"):
            waited = f" (in {wall:.1f} s of wall time: time spent waiting for a CPU does not count)"
        return (f"{workers} resumed late and still running {d.get('seconds'):g} s after the target's done() "
                f"said yes{waited}: ended as workers that serve forever")
    if e.kind == v.EXIT:
        how = f"killed by {d['signal']}" if d.get("signal") else f"exit code {d.get('code')}"
        return f"worker {worker}{_pid(pid)} ended, {how}"
    return e.kind


def _store(e: Event) -> str:
    d = e.data
    where = f"{d.get('instance')}:{d.get('step')}"
    fence = f" with fence {d['fence']}" if d.get("fence") is not None else ""
    # A target's own records may not say who wrote a change (procrastinate's job events do not).
    who = d.get("worker") or "a worker"
    moved = _known("{} -> {}", d.get("from_state"), d.get("to_state"))
    if e.kind == v.CLAIMED:
        told = ", ".join(x for x in (_known("attempt {}", d.get("attempt")), moved) if x)
        return f"{who} claimed {where}{fence}" + (f" ({told})" if told else "")
    if e.kind == v.COMMITTED:
        why = f"; reason: {d['reason']}" if d.get("reason") else ""
        whose = f"{d['worker']}'s commit" if d.get("worker") else "a commit"
        told = _known("state version {}", d.get("state_version")) + why
        return (f"accepted {whose}{fence}: {where}" + (f" {moved}" if moved else "")
                + (f" ({told.lstrip('; ')})" if told else ""))
    if e.kind == v.COMMIT_REJECTED:
        now = ", ".join(x for x in (_known("fence {}", d.get("lease_version")),
                                    _known("state version {}", d.get("state_version"))) if x)
        expected = _known(" (expected {})", d.get("expected_state_version")) if now else ""
        whose = f"{d['worker']}'s commit" if d.get("worker") else "a commit"
        return (f"REFUSED {whose}{fence}: the lease is at {now}{expected}" if now else
                f"REFUSED {whose}{fence} on {where}: a stale write")
    if e.kind == v.STUCK_FLAGGED:
        owner = f" {d['stuck_owner']}" if d.get("stuck_owner") is not None else ""
        idle = _known(" for {} ms", d.get("idle_ms"))
        return f"{who} flagged{owner} stuck on {where}: heartbeat alive, no progress{idle}; lease freed"
    if e.kind == v.RECEIPT_RECORDED:
        what = f"receipt {d['key']}" if d.get("key") is not None else f"a receipt for {where}"
        return f"{who} recorded {what}" + _known(" = {}", d.get("status"))
    if e.kind == v.OPERATOR_RESOLVED:
        actor = f"operator {d['actor']}" if d.get("actor") is not None else "an operator"
        return (f"{actor} moved {where}" + _known(" to {}", d.get("to_state"))
                + _known(" (evidence: {})", d.get("evidence")))
    if e.kind == v.CREATED:
        return f"created {where}" + _known(" ({})", d.get("to_state"))
    if e.kind in (v.RENEWED, v.RELEASED):
        return f"{who} {e.kind} its lease on {where}{fence}"
    return f"{e.kind} {where}" + (f" by {d['worker']}" if d.get("worker") else "")


def _request(e: Event) -> str:
    d = e.data
    key = d.get("key") or "(no key: legacy)"
    fence = f" fence {d['fence']}" if d.get("fence") is not None else ""
    who = e.meta.get("worker") or "a client"
    answer = " ".join(str(x) for x in (d.get("status"), d.get("outcome")) if x is not None)
    return (f"{who} -> {d.get('resource')} key {key}{fence}: {answer or 'no answer'}"
            + (" (a new effect)" if d.get("applied") else ""))


def _worker(e: Event) -> str:
    d = e.data
    where = f"{d.get('instance')}:{d.get('step')}"
    if e.kind == v.POINT:
        if d.get("action"):
            return f"hit {d.get('step')}.{d.get('point')} -> {d.get('action')}"
        return f"passed {d.get('step')}.{d.get('point')} (hit {d.get('hit')}; nothing fired)"
    if e.kind == v.RECOVER:
        source = f" (from the {d['source']})" if d.get("source") else ""
        receipt = f"receipt {d['receipt']}{source}" if d.get("receipt") is not None else "no receipt"
        safe = "retry-safe" if d.get("retry_safe") is True else "not retry-safe" if d.get("retry_safe") is False else ""
        attempts = _known("{}/{} attempts", d.get("attempts"), d.get("max_attempts"))
        told = ", ".join(x for x in (receipt, safe, attempts) if x)
        return f"recovery evidence: {told}" + _known(" -> {}", d.get("action"))
    if e.kind == v.CALL and e.type == v.INFO:
        return f"call outcome unknown ({'it died first' if d.get('indeterminate') else d.get('error')})"
    if e.kind in v.OP_KINDS:
        if e.type == v.INVOKE:
            fence = f" with fence {d['fence']}" if d.get("fence") is not None else ""
            what = f" {d['resource']}" if e.kind == v.CALL and d.get("resource") else ""
            return f"{e.kind}{what} {where}{fence}"
        how = {v.OK: "done", v.FAIL: "certainly not done", v.INFO: "outcome unknown"}.get(e.type, e.type)
        return f"{e.kind} {how}: {d['error']}" if d.get("error") else f"{e.kind} {where} {how}"
    if e.kind == v.CHECKPOINT:
        return f"checkpoint of {d.get('instance')} {d.get('outcome')}: {d.get('reason')}"
    if e.kind == v.HEARTBEAT_LOST:
        return f"heartbeat found the lease on {where} gone" + _known(" (fence {})", d.get("fence"))
    if e.kind == v.STORE_UNAVAILABLE:
        how = "outcome unknown" if d.get("outcome_unknown") else "rolled back"
        return f"store connection lost ({how}): {d.get('error')}"
    if e.kind == v.START:
        return f"started{_pid(d.get('pid'), ' as pid {}')}"
    if e.kind == v.FINISH:
        return "finished"
    if e.kind == v.RAISED:
        return f"the target raised {d.get('error')} (a finding: its traceback is in this event)"
    return f"{e.kind} {where}" if d.get("instance") is not None else e.kind


def describe(e: Event) -> str:
    """What one event says, in words: the one describer of events, for narration, reports and
    scenarios. Never empty; the process is not repeated (a caller shows it as it likes)."""
    if e.process == v.HARNESS:
        return _harness(e)
    if e.process == v.STORE:
        return _store(e)
    if e.process == v.DOWNSTREAM:
        return _request(e)
    return _worker(e)


# What a narration tells: everything the harness and the downstream did, the store's decisions, and
# what a worker found out (a fault firing, recovery, an unknown or failed operation, a checkpoint, a
# lost lease). The rest (claims invoked, leases renewed...) is in the report's event table.
_TOLD_STORE = frozenset({v.CLAIMED, v.COMMITTED, v.COMMIT_REJECTED, v.STUCK_FLAGGED, v.RECEIPT_RECORDED,
                         v.OPERATOR_RESOLVED})
_TOLD_WORKER = frozenset({v.RECOVER, v.CHECKPOINT, v.HEARTBEAT_LOST, v.RAISED})


def tells(e: Event) -> bool:
    """Whether a narration tells this event."""
    if e.process in (v.HARNESS, v.DOWNSTREAM):
        return True
    if e.process == v.STORE:
        return e.kind in _TOLD_STORE
    if e.kind == v.POINT:
        return bool(e.data.get("action"))
    if e.kind == v.CALL and e.type == v.INFO:
        return True
    if e.kind in v.OP_KINDS:
        return bool(e.data.get("error")) and e.type in (v.INFO, v.FAIL)
    return e.kind in _TOLD_WORKER


def line(e: Event) -> str | None:
    """The narration line of an event (its process, then :func:`describe`), or None when a
    narration does not tell it."""
    return f"{e.process}: {describe(e)}" if tells(e) else None


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
        where = (e.meta.get("instance"), e.meta.get("step")) if e.process == v.DOWNSTREAM else \
            (e.get("instance"), e.get("step"))
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
