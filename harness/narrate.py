"""Plain-language lines for what happened to a step in a run: who claimed it with which fence, what
the downstream answered, who was stopped, killed or refused. Used by the demo and the scenarios."""

from __future__ import annotations

from typing import Iterable

from killpoint.harness.history import Event, History


def _ms(e: Event, t0: int) -> str:
    return f"{(e.time - t0) / 1e6:7.1f} ms"


def focus(history: History) -> set[tuple[str, str]]:
    """The steps a run's faults fired on (what a narration should follow)."""
    return {(e.get("instance"), e.get("step")) for e in history.events
            if e.kind == "point" and e.get("action")}


def line(e: Event) -> str | None:
    d = e.data
    who = e.process
    if e.process == "harness":
        worker, pid = d.get("worker"), d.get("pid")
        if e.kind == "spawn":
            same = " (same identity)" if d.get("identity") != worker else ""
            return f"harness: started worker {worker} as pid {pid}{same}"
        if e.kind == "kill":
            return f"harness: SIGKILL to {worker} (pid {pid}): {d.get('reason')}"
        if e.kind == "stop":
            return f"harness: SIGSTOP to {worker} (pid {pid}), frozen with its heartbeat"
        if e.kind == "cont":
            if d.get("signal") is None:
                return f"harness: released {worker} (pid {pid}): {d.get('reason')}"
            return f"harness: SIGCONT to {worker} (pid {pid}): {d.get('reason')}"
        if e.kind == "downstream_restart":
            return (f"harness: restarted the downstream: pid {d.get('pid_before')} killed, pid "
                    f"{d.get('pid')} serves the same ledger at the same address {d.get('url')}")
        if e.kind == "store_restart":
            killed = ", ".join(d.get("killed") or ()) or "no worker"
            return (f"harness: restarted the store: every connection to it cut ({killed} killed with "
                    f"theirs), its own handle closed and reopened")
        if e.kind == "bound_hit":
            why = f"{d['seconds']:g} s" if d.get("seconds") is not None else d.get("reason")
            return f"harness: the run hit its bound ({why}); what is still running is ended"
        if e.kind == "terminate_backend":
            states = d.get("states") or {}
            ended = ", ".join(f"{p} ({states.get(str(p))})" for p in d.get("backend_pids") or ()) or "none"
            return (f"harness: pg_terminate_backend for {worker}'s database sessions at "
                    f"{d.get('step')}.{d.get('point')}: {ended}")
        if e.kind == "after_quiescent":
            return "harness: the run is quiescent; an outside actor acts before the history is judged"
        if e.kind == "exit":
            how = f"killed by {d['signal']}" if d.get("signal") else f"exit code {d.get('code')}"
            return f"harness: worker {worker} (pid {pid}) ended, {how}"
        return f"harness: {e.kind}"
    if e.process == "store":
        where = f"{d.get('instance')}:{d.get('step')}"
        if e.kind == "claimed":
            return (f"store: {d.get('worker')} claimed {where} with fence {d.get('fence')} "
                    f"(attempt {d.get('attempt')}, {d.get('from_state')} -> {d.get('to_state')})")
        if e.kind == "committed":
            fence = f" with fence {d['fence']}" if d.get("fence") is not None else ""
            why = f"; reason: {d['reason']}" if d.get("reason") else ""
            return (f"store: accepted {d.get('worker')}'s commit{fence}: {where} "
                    f"{d.get('from_state')} -> {d.get('to_state')} (state version {d.get('state_version')}"
                    f"{why})")
        if e.kind == "commit_rejected":
            return (f"store: REFUSED {d.get('worker')}'s commit with fence {d.get('fence')}: the lease "
                    f"is at fence {d.get('lease_version')}, state version {d.get('state_version')} "
                    f"(expected {d.get('expected_state_version')})")
        if e.kind == "stuck_flagged":
            return (f"store: {d.get('worker')} flagged {d.get('stuck_owner')} stuck on {where}: heartbeat "
                    f"alive, no progress for {d.get('idle_ms')} ms; lease freed")
        if e.kind == "receipt_recorded":
            return f"store: {d.get('worker')} recorded receipt {d.get('key')} = {d.get('status')}"
        if e.kind == "operator_resolved":
            return (f"store: operator {d.get('actor')} moved {where} to {d.get('to_state')} "
                    f"(evidence: {d.get('evidence')})")
        return None
    if e.process == "downstream":
        meta = d.get("meta") or {}
        key = d.get("key") or "(no key: legacy)"
        fence = f" fence {d['fence']}" if d.get("fence") is not None else ""
        return (f"downstream: {meta.get('worker')} -> {d.get('resource')} key {key}{fence}: "
                f"{d.get('status')} {d.get('outcome')}" + (" (a new effect)" if d.get("applied") else ""))
    # a worker
    if e.kind == "point" and d.get("action"):
        return f"{who}: hit {d.get('step')}.{d.get('point')} -> {d.get('action')}"
    if e.kind == "recover":
        source = f" (from the {d['source']})" if d.get("source") else ""
        return (f"{who}: recovery evidence: receipt {d.get('receipt')}{source}, retry-safe "
                f"{d.get('retry_safe')}, {d.get('attempts')}/{d.get('max_attempts')} attempts "
                f"-> {d.get('action')}")
    if e.kind == "call" and e.type == "info":
        return f"{who}: call outcome unknown ({'it died first' if d.get('indeterminate') else d.get('error')})"
    if e.kind in ("claim", "receipt", "commit") and e.get("error") and e.type in ("info", "fail"):
        how = "outcome unknown" if e.type == "info" else "certainly not done"
        return f"{who}: {e.kind} {how}: {d.get('error')}"
    if e.kind == "checkpoint":
        return f"{who}: checkpoint of {d.get('instance')} {d.get('outcome')}: {d.get('reason')}"
    if e.kind == "heartbeat_lost":
        return f"{who}: heartbeat found the lease gone (fence {d.get('fence')})"
    return None


def narrate(history: History, steps: Iterable[tuple[str, str]] | None = None) -> list[str]:
    """Timestamped lines for the given steps (default: the steps a fault fired on) and the harness."""
    wanted = set(steps) if steps is not None else focus(history)
    instances = {instance for instance, _ in wanted}
    if not history.events:
        return []
    t0 = history.events[0].time
    out = []
    for e in history.events:
        meta = e.get("meta") or {}
        where = (meta.get("instance"), meta.get("step")) if e.process == "downstream" else \
            (e.get("instance"), e.get("step"))
        if e.process != "harness" and where not in wanted and \
                not (where[1] is None and where[0] in instances):  # an event about a whole instance
            continue
        text = line(e)
        if text:
            out.append(f"{_ms(e, t0)}  {text}")
    return out


def story(result) -> list[str]:
    """The demo's story of one run (a :class:`harness.run.RunResult`): the narration of the steps
    its faults fired on (of every step a violation names, when no fault fired there), what each of
    those steps ended as with the effects the downstream applied, and the verdict."""
    history: History = result.history
    steps = focus(history) | {(v.instance, v.step) for v in result.verdict.violations
                              if v.instance is not None and v.step is not None}
    out = list(narrate(history, steps))
    for instance, step in sorted(steps, key=lambda s: (str(s[0]), str(s[1]))):
        effects = [e for e in history.events if e.process == "downstream" and e.get("applied")
                   and (e.get("meta") or {}).get("instance") == instance
                   and (e.get("meta") or {}).get("step") == step]
        out.append(f"=> {instance}:{step} ended {history.final_state(instance, step)} with "
                   f"{len(effects)} applied effect(s) in the downstream ledger")
    judged = [r for r in result.verdict.results if r.checked]
    word = {True: "valid", False: "VIOLATED", None: "unknown"}[result.valid]
    out.append(f"verdict: {word} ({len(judged)} of {len(result.verdict.results)} invariants had "
               f"something to judge; {result.duration_s * 1000:.0f} ms)")
    return out
