"""The invariants of DESIGN section 7 (its ten, then checkpoints_honoured, lease_fenced, fence_rises and
receipt_first for the bug classes it names beyond them), each a pure function ``History -> Result``.

No checker does I/O or reads a clock: they only walk the events of one history, so each one is
tested on small hand-written histories. Every violation names the events that prove it, so a report
can point at them. ``checked`` says whether the history had anything for the invariant to judge: a
run with no reused key says nothing about ``intent_conflict`` and must not count as evidence for it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.history import ACCEPTED_TRANSITIONS, Event, History
from killpoint.harness.states import (COMPENSATED, COMPENSATING, MANUAL, PENDING, RETRY_SCHEDULED, RUNNING,
                            SETTLED, SUCCEEDED, UNKNOWN, WAITING_APPROVAL, allowed)

# Processes that are not worker incarnations; every other process name is a worker.
NON_WORKERS = frozenset({"store", "downstream", "harness"})
DEFAULT_MAX_ATTEMPTS = 3
FORWARD = "forward"
COMPENSATION = "compensation"

StepId = tuple[Any, Any]


# ---------------------------------------------------------------------------------------------
# small helpers shared by the checkers


def _result(name: str, checked: bool, violations: list[Violation], detail: str = "") -> Result:
    """Build a Result; a history with nothing to judge is valid but explicitly not checked."""
    if violations:
        return Result(name, False, True, tuple(violations),
                      detail or f"{len(violations)} violation(s)")
    if not checked:
        return Result(name, True, False, (), detail or "nothing to judge")
    return Result(name, True, True, (), detail)


def _is_worker(e: Event) -> bool:
    return e.process not in NON_WORKERS


def _store(history: History) -> list[Event]:
    return [e for e in history.events if e.process == "store"]


def _is_accepted(e: Event) -> bool:
    """Accepted transitions are the store events that changed a step (commit_rejected did not)."""
    return e.process == "store" and e.kind in ACCEPTED_TRANSITIONS


def _requests(history: History) -> list[Event]:
    return [e for e in history.events if e.process == "downstream" and e.kind == "request"]


def _meta(e: Event) -> Mapping[str, Any]:
    meta = e.get("meta")
    return meta if isinstance(meta, Mapping) else {}


def _applied(history: History) -> list[Event]:
    """Downstream rows where a new effect really happened (``dropped`` included: applied, no answer)."""
    return [e for e in _requests(history) if e.get("applied") is True]


def _step_of(e: Event) -> StepId:
    return (e.get("instance"), e.get("step"))


def _effect_step(e: Event) -> StepId:
    meta = _meta(e)
    return (meta.get("instance"), meta.get("step"))


def _direction(e: Event) -> str:
    return _meta(e).get("direction") or FORWARD


def _final_states(history: History) -> dict[StepId, str]:
    return {(row["instance"], row["step"]): row["state"] for row in history.final}


def _idx(events: Iterable[Event | None]) -> tuple[int, ...]:
    return tuple(sorted({e.index for e in events if e is not None}))


def _at(e: Event) -> str:
    return f"event {e.index}"


# ---------------------------------------------------------------------------------------------
# 1. no_duplicate_effects


def _logical_key(history: History, e: Event) -> Any:
    """The idempotency key a keyed request should have carried: the step's own, when known.

    The key a worker sent is the worker's claim about which intent it means; a worker that mints a
    new key per retry would make every duplicate look like a new intent. So an effect whose step is
    configured is grouped under that step's stable key, and only otherwise under the key it sent.
    """
    inst, step = _effect_step(e)
    cfg = history.step_config(inst, step) if inst is not None and step is not None else None
    if cfg is not None:
        expected = cfg.compensation_key if _direction(e) == COMPENSATION else cfg.key
        if expected is not None:
            return expected
    return e.get("key")


def no_duplicate_effects(history: History) -> Result:
    """At most one applied effect per logical intent.

    Keyed requests are grouped by the step's stable idempotency key (see :func:`_logical_key`);
    legacy ones (no key) by instance, step, resource and direction, because a legacy downstream
    cannot tell a retry from a new request.
    """
    name = "no_duplicate_effects"
    effects = _applied(history)
    groups: dict[tuple[Any, ...], list[Event]] = defaultdict(list)
    for e in effects:
        if e.get("key") is not None:
            groups[("key", _logical_key(history, e))].append(e)
        else:
            inst, step = _effect_step(e)
            groups[("legacy", inst, step, e.get("resource"), _direction(e))].append(e)
    violations = []
    for group, evs in groups.items():
        if len(evs) < 2:
            continue
        inst, step = _effect_step(evs[0])
        sent = list(dict.fromkeys(x.get("key") for x in evs))
        what = (f"legacy resource {group[3]!r} ({group[4]})" if group[0] == "legacy"
                else f"key {group[1]!r}" if sent == [group[1]]
                else f"intent {group[1]!r} (sent under keys {', '.join(map(repr, sent))})")
        violations.append(Violation(
            name, inst, step,
            f"{what} was applied {len(evs)} times (events {', '.join(str(x.index) for x in evs)}): "
            f"a duplicate side effect",
            _idx(evs)))
    return _result(name, bool(effects), violations,
                   f"{len(effects)} applied effect(s) in {len(groups)} intent(s)")


# ---------------------------------------------------------------------------------------------
# 2. effects_accounted

# Final states that account for an effect: the step did its work, or someone must still look at it.
_ACCOUNTING_STATES = frozenset({SUCCEEDED, COMPENSATING, COMPENSATED, MANUAL, UNKNOWN})
# Extra states that account for one while the run is not quiescent (the effect is in flight).
_IN_FLIGHT_STATES = frozenset({RUNNING, RETRY_SCHEDULED, PENDING})


def effects_accounted(history: History) -> Result:
    """Every succeeded step has its effect and every effect has a step that owns it.

    A succeeded step without an effect lost its work; an effect on a failed or cancelled step is
    a side effect nobody will ever reconcile. Duplicates are left to ``no_duplicate_effects``.
    """
    name = "effects_accounted"
    final = _final_states(history)
    effects = _applied(history)
    by_step: dict[tuple[Any, Any, str], list[Event]] = defaultdict(list)
    for e in effects:
        by_step[(*_effect_step(e), _direction(e))].append(e)
    last_store: dict[StepId, Event] = {}
    for e in _store(history):
        last_store[_step_of(e)] = e

    violations: list[Violation] = []
    checked = bool(effects)
    for cfg in history.steps:
        if cfg.resource is None:
            continue  # a pure step: no effect expected
        state = final.get((cfg.instance, cfg.step))
        if state is None:
            continue
        if state in SETTLED:
            checked = True
        proof = _idx([last_store.get((cfg.instance, cfg.step))])
        if state == SUCCEEDED and not by_step.get((cfg.instance, cfg.step, FORWARD)):
            violations.append(Violation(
                name, cfg.instance, cfg.step,
                f"step {cfg.step} of {cfg.instance} succeeded without an effect on "
                f"{cfg.resource!r}: lost", proof))
        if state == COMPENSATED and not by_step.get((cfg.instance, cfg.step, COMPENSATION)):
            violations.append(Violation(
                name, cfg.instance, cfg.step,
                f"step {cfg.step} of {cfg.instance} was compensated without a compensation "
                f"effect: lost", proof))

    if final:  # without final states nothing can be attributed
        ok = _ACCOUNTING_STATES if history.quiescent else _ACCOUNTING_STATES | _IN_FLIGHT_STATES
        for (inst, step, direction), evs in by_step.items():
            state = final.get((inst, step))
            proof = _idx([*evs, last_store.get((inst, step))])
            if state is None:
                violations.append(Violation(
                    name, inst, step,
                    f"{len(evs)} {direction} effect(s) for step {step} of {inst}, which the store "
                    f"does not know: an effect nobody accounts for", proof))
            elif state not in ok:
                violations.append(Violation(
                    name, inst, step,
                    f"{len(evs)} {direction} effect(s) for step {step} of {inst}, which ended "
                    f"{state}: an effect nobody accounts for", proof))
            elif direction == COMPENSATION and state == SUCCEEDED:
                violations.append(Violation(
                    name, inst, step,
                    f"compensation effect for step {step} of {inst}, which ended succeeded: the "
                    f"undo happened but the store never recorded it", proof))
    return _result(name, checked, violations, f"{len(effects)} applied effect(s)")


# ---------------------------------------------------------------------------------------------
# 3. stale_writes_rejected


def stale_writes_rejected(history: History) -> Result:
    """No write from a worker whose fence was no longer current was accepted.

    In the store: an accepted ``committed`` must carry the current lease version and come from the
    current owner. A ``committed`` without a fence is a lease-free planning transition (``settle``,
    e.g. cancelling a pending step), which no lease guards, so it is not judged here. At the
    downstream: an applied request must not carry a fence lower than one already seen in its
    scope, or a woken stale worker overwrote its successor.
    """
    name = "stale_writes_rejected"
    violations: list[Violation] = []
    fence: dict[StepId, Any] = {}
    owner: dict[StepId, Any] = {}
    fence_src: dict[StepId, Event] = {}
    claim_of: dict[tuple[Any, Any, Any, Any], Event] = {}  # (inst, step, worker, fence) -> claimed
    claims: dict[StepId, int] = defaultdict(int)
    takeover = False

    for e in _store(history):
        sid = _step_of(e)
        if e.kind == "commit_rejected":
            takeover = True
        if e.kind == "committed" and sid in fence and e.get("fence") is not None:
            held, worker = e.get("fence"), e.get("worker")
            stale_fence = held is not None and held != fence[sid]
            stale_owner = (worker is not None and owner.get(sid) is not None
                           and worker != owner[sid])
            if stale_fence or stale_owner:
                why = (f"fence {held} while the current lease version was {fence[sid]}"
                       if stale_fence else
                       f"worker {worker} while the lease belonged to {owner[sid]}")
                proof = [e, fence_src.get(sid), claim_of.get((*sid, worker, held))]
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"commit of step {sid[1]} of {sid[0]} by {worker} accepted with {why}: "
                    f"a stale write", _idx(proof)))
        if e.kind == "claimed":
            claims[sid] += 1
            if claims[sid] > 1:
                takeover = True
            owner[sid] = e.get("worker")
            claim_of[(*sid, e.get("worker"), e.get("lease_version"))] = e
        if e.get("lease_version") is not None and e.get("lease_version") != fence.get(sid):
            fence[sid] = e.get("lease_version")
            fence_src[sid] = e

    highest: dict[tuple[Any, Any], Event] = {}
    for e in _requests(history):
        if e.get("outcome") == "stale_fence":
            takeover = True
        f = e.get("fence")
        if f is None or e.get("key") is None:
            continue  # a legacy resource takes no key and enforces no fence: manual review covers it
        scope = (e.get("resource"), e.get("scope"))
        top = highest.get(scope)
        if e.get("applied") is True and top is not None and f < top.get("fence"):
            inst, step = _effect_step(e)
            violations.append(Violation(
                name, inst, step,
                f"{e.get('resource')} applied a request with fence {f} after it had seen fence "
                f"{top.get('fence')} ({_at(top)}) in scope {e.get('scope')!r}: a stale write",
                _idx([top, e])))
        if top is None or f > top.get("fence"):
            highest[scope] = e
    return _result(name, takeover, violations)


# ---------------------------------------------------------------------------------------------
# 4. version_chain


def version_chain(history: History) -> Result:
    """Each step's accepted transitions form one chain, ``state_version`` +1 each.

    Two accepted events with the same version are a fork (two writers both won a compare-and-set);
    a gap or a step back means a write bypassed the compare-and-set.
    """
    name = "version_chain"
    violations: list[Violation] = []
    prev: dict[StepId, Event] = {}
    seen: dict[StepId, dict[Any, Event]] = defaultdict(dict)
    checked = False
    for e in _store(history):
        if e.kind != "created" and not _is_accepted(e):
            continue
        sv = e.get("state_version")
        if sv is None:
            continue
        sid = _step_of(e)
        if e.kind == "created":
            if sid not in prev:
                prev[sid] = e
                seen[sid][sv] = e
            continue
        before = prev.get(sid)
        if before is not None:
            checked = True
            expected = before.get("state_version") + 1
            if sv in seen[sid]:
                twin = seen[sid][sv]
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"step {sid[1]} of {sid[0]}: {e.kind} and {twin.kind} ({_at(twin)}) both "
                    f"accepted at state_version {sv}: a fork", _idx([twin, e])))
            elif sv != expected:
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"step {sid[1]} of {sid[0]}: {e.kind} accepted at state_version {sv} right "
                    f"after version {expected - 1} ({_at(before)}); expected {expected}",
                    _idx([before, e])))
        seen[sid][sv] = e
        prev[sid] = e
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 5. legal_transitions


def legal_transitions(history: History) -> Result:
    """Every accepted transition is in the one table the store also enforces."""
    name = "legal_transitions"
    violations: list[Violation] = []
    checked = False
    for e in _store(history):
        if not _is_accepted(e):
            continue
        src, dst = e.get("from_state"), e.get("to_state")
        if src is None or dst is None:
            continue  # cannot be judged
        checked = True
        if not allowed(src, dst):
            inst, step = _step_of(e)
            violations.append(Violation(
                name, inst, step,
                f"step {step} of {inst}: {e.kind} moved it {src} -> {dst}, which the transition "
                f"table does not allow", (e.index,)))
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 6. manual_stable


def manual_stable(history: History) -> Result:
    """A step in manual review leaves it only through an operator event with actor and evidence.

    No background loop may retry or claim such a step: only a human knows whether the unsafe effect
    happened.
    """
    name = "manual_stable"
    violations: list[Violation] = []
    entered: dict[StepId, Event] = {}  # steps now in manual review -> the event that put them there
    checked = False
    for e in _store(history):
        if not _is_accepted(e):
            continue
        sid = _step_of(e)
        src, dst = e.get("from_state"), e.get("to_state")
        in_manual = sid in entered or src == MANUAL
        if in_manual:
            entry = entered.get(sid)
            operator = e.kind == "operator_resolved"
            if not operator or not e.get("actor") or not e.get("evidence"):
                why = ("without actor and evidence" if operator
                       else f"through {e.kind} by {e.get('worker') or 'an unnamed writer'}, "
                            f"not an operator event")
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"step {sid[1]} of {sid[0]} in manual_intervention"
                    f"{f' since {_at(entry)}' if entry else ''} was moved to {dst} {why}",
                    _idx([entry, e])))
        if dst == MANUAL:
            checked = True
            entered.setdefault(sid, e)
        else:
            entered.pop(sid, None)
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 7. intent_conflict

_FINISHED = frozenset({"applied", "declined", "dropped"})
_SUCCESSES = frozenset({"applied", "declined", "dropped", "replay"})


def intent_conflict(history: History) -> Result:
    """A key reused with another intent gets 422, never the old result or a new effect.

    A replayed success for a different intent would tell the worker its new request happened when
    the downstream really did something else.
    """
    name = "intent_conflict"
    violations: list[Violation] = []
    first: dict[Any, Event] = {}
    hashes: dict[Any, set[Any]] = defaultdict(set)
    for e in _requests(history):
        key, h = e.get("key"), e.get("intent_hash")
        if key is None or h is None:
            continue
        hashes[key].add(h)
        owner = first.get(key)
        if owner is None:
            if e.get("outcome") in _FINISHED:
                first[key] = e
            continue
        if h == owner.get("intent_hash"):
            continue
        outcome, status = e.get("outcome"), e.get("status")
        inst, step = _effect_step(e)
        if outcome in _SUCCESSES:
            violations.append(Violation(
                name, inst, step,
                f"key {key!r} reused with another intent ({h} vs {owner.get('intent_hash')}, "
                f"{_at(owner)}) got {outcome} (status {status}) instead of 422: reused key with "
                f"another intent got a replayed success", _idx([owner, e])))
        elif outcome == "conflict" and status is not None and status != 422:
            violations.append(Violation(
                name, inst, step,
                f"key {key!r} reused with another intent got conflict with status {status}, "
                f"not 422", _idx([owner, e])))
    checked = any(len(hs) > 1 for hs in hashes.values())
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 8. retry_budget


def retry_budget(history: History) -> Result:
    """No call was made at an attempt beyond the step's maximum: retries must be bounded."""
    name = "retry_budget"
    violations: list[Violation] = []
    checked = False
    for e in history.events:
        if not (_is_worker(e) and e.kind == "call" and e.type == "invoke"):
            continue
        attempt = e.get("attempt")
        if attempt is None:
            continue
        if attempt > 1:
            checked = True
        inst, step = _step_of(e)
        cfg = history.step_config(inst, step)
        limit = cfg.max_attempts if cfg is not None else DEFAULT_MAX_ATTEMPTS
        if attempt > limit:
            violations.append(Violation(
                name, inst, step,
                f"worker {e.process} called {e.get('resource')} for step {step} of {inst} at "
                f"attempt {attempt}, beyond the maximum of {limit}", (e.index,)))
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 9. terminates


# Settled states that wait for an outside event (an operator, an approval) and hold later steps.
_AWAITING_OUTSIDE = frozenset({MANUAL, WAITING_APPROVAL})


def terminates(history: History) -> Result:
    """With the harness quiescent every step settled; a step left mid-flight is stuck forever.

    A run that hit its bound proves nothing either way, unless every step had settled anyway.
    A step in manual review or awaiting approval holds the steps after it (nothing after it runs
    until an outside event), so a pending step behind one is waiting, not stuck.
    """
    name = "terminates"
    final = history.final
    unsettled = [row for row in final if row["state"] not in SETTLED]
    if unsettled:
        held: set[StepId] = set()
        blocked: set[Any] = set()  # instances with a step awaiting an outside event
        for row in final:  # the store's order: instance, then step index
            if row["instance"] in blocked and row["state"] == PENDING:
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
    last_store: dict[StepId, Event] = {}
    for e in _store(history):
        last_store[_step_of(e)] = e
    violations = [Violation(
        name, row["instance"], row["step"],
        f"instance {row['instance']} did not reach a terminal state: step {row['step']} is "
        f"{row['state']}", _idx([last_store.get((row["instance"], row["step"]))]))
        for row in unsettled]
    return _result(name, True, violations, f"{len(final)} step(s)")


# ---------------------------------------------------------------------------------------------
# 10. stuck_detected


def stuck_detected(history: History) -> Result:
    """A worker hanging with its heartbeat alive is flagged within stuck_bound + slack.

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
    flags: dict[StepId, list[Event]] = defaultdict(list)
    deaths: dict[Any, list[Event]] = defaultdict(list)
    owners: dict[StepId, list[Event]] = defaultdict(list)  # events that set or clear the lease
    identity: dict[Any, Any] = {}  # worker incarnation (A.2) -> the identity the store saw (A)
    for e in history.events:
        if e.process == "store" and e.kind == "stuck_flagged":
            flags[_step_of(e)].append(e)
        elif e.process == "harness" and e.kind in ("kill", "exit"):
            deaths[e.get("worker")].append(e)
        elif e.process == "harness" and e.kind == "spawn" and e.get("identity") is not None:
            identity[e.get("worker")] = e.get("identity")
        if e.process == "store" and (e.kind in ("created", "claimed", "stuck_flagged")
                                     or (e.kind == "committed" and e.get("fence") is not None)):
            owners[_step_of(e)].append(e)

    def held_no_lease(hang: Event, sid: StepId) -> bool:
        before = [o for o in owners.get(sid, ()) if o.time <= hang.time]
        if not before:
            return False  # the store says nothing: judge the hang
        who = identity.get(hang.process, str(hang.process).split(".")[0])
        return not (before[-1].kind == "claimed" and before[-1].get("worker") == who)
    violations: list[Violation] = []
    checked = False
    for e in history.events:
        if not (_is_worker(e) and e.kind == "point" and e.get("action") == "hang"):
            continue
        sid = _step_of(e)
        if None in sid or held_no_lease(e, sid):
            continue
        deadline = e.time + window
        in_time = [f for f in flags.get(sid, ()) if e.time <= f.time <= deadline]
        if in_time:
            checked = True
            continue
        if any(e.time <= d.time <= deadline for d in deaths.get(e.process, ())):
            continue  # the worker died unflagged before the deadline: its heartbeat died with it
        if end <= deadline:
            continue  # the history ends before the deadline
        checked = True
        late = [f for f in flags.get(sid, ()) if f.time > deadline]
        ms = window / 1_000_000
        if late:
            after = (late[0].time - e.time) / 1_000_000
            detail = (f"worker {e.process} hung at {e.get('point')} on step {sid[1]} of {sid[0]} "
                      f"and was flagged only after {after:g} ms (bound {ms:g} ms)")
        else:
            detail = (f"worker {e.process} hung at {e.get('point')} on step {sid[1]} of {sid[0]} "
                      f"and was never flagged within {ms:g} ms")
        violations.append(Violation(name, sid[0], sid[1], detail, _idx([e, *late[:1]])))
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 11. checkpoints_honoured

REFUSED = "refused"


def checkpoints_honoured(history: History) -> Result:
    """A worker runs an instance only on a checkpoint it could trust (DESIGN section 3).

    ``history.checkpoints`` holds the harness's own verification of every stored checkpoint, the
    conclusion a correct worker must reach. For an instance whose checkpoint had to be *refused*
    (corrupt, forged, or an unreadable definition with no migration), no step may be committed to
    ``succeeded`` and the downstream may apply no effect for it: either proves a worker ran on a
    checkpoint it had to refuse. Only what the store and the ledger show is judged, so any worker,
    not only ours, can be held to it. A history with no refused checkpoint is not checked.
    """
    name = "checkpoints_honoured"
    refused = {c["instance"]: c for c in history.checkpoints if c.get("outcome") == REFUSED}
    if not refused:
        return _result(name, False, [], "no checkpoint had to be refused")
    violations: list[Violation] = []
    for instance, verdict in refused.items():
        by_step: dict[Any, list[Event]] = defaultdict(list)
        for e in _store(history):
            if e.kind == "committed" and e.get("instance") == instance and e.get("to_state") == SUCCEEDED:
                by_step[e.get("step")].append(e)
        for e in _applied(history):
            if _effect_step(e)[0] == instance:
                by_step[_effect_step(e)[1]].append(e)
        for step, proof in by_step.items():
            proof.sort(key=lambda e: e.index)
            commits = [e for e in proof if e.process == "store"]
            effects = [e for e in proof if e.process == "downstream"]
            what = []
            if commits:
                workers = ", ".join(sorted({str(e.get("worker")) for e in commits}))
                what.append(f"committed to succeeded by {workers}")
            if effects:
                what.append(f"{len(effects)} downstream effect(s) applied")
            violations.append(Violation(
                name, instance, step,
                f"{instance}'s checkpoint had to be refused ({verdict.get('reason')}), yet step "
                f"{step} ran: {'; '.join(what)}", _idx(proof)))
    return _result(name, True, violations, f"{len(refused)} checkpoint(s) had to be refused")


# ---------------------------------------------------------------------------------------------
# 12. lease_fenced

# Store events after which a step's lease is free: the holder's accepted commit (one with a fence),
# the monitor freeing a stuck lease, the holder's release.
_FREES_LEASE = frozenset({"stuck_flagged", "released"})


def lease_fenced(history: History) -> Result:
    """Only the lease's current holder, with its current fence, renews or releases it.

    A renewal by anyone else keeps a lease alive under its holder's feet: a stale worker whose
    heartbeat renews by instance alone takes the lease back and the new holder's commit is refused
    (aegra #502). A release by anyone else frees a lease its holder still works under. Renewals and
    releases are store events (``renewed``, ``released``), each with the writer and the fence it
    held; commits are judged by ``stale_writes_rejected``.
    """
    name = "lease_fenced"
    violations: list[Violation] = []
    holder: dict[StepId, tuple[Any, Any, Event]] = {}  # step -> (owner, fence, the claim)
    checked = False
    for e in _store(history):
        sid = _step_of(e)
        if e.kind == "claimed":
            holder[sid] = (e.get("worker"), e.get("lease_version"), e)
            continue
        if e.kind in ("renewed", "released"):
            checked = True
            worker, fence = e.get("worker"), e.get("fence")
            owner, current, claim = holder.get(sid, (None, None, None))
            if owner is None:
                why = "nobody held the lease then"
            elif (worker, fence) != (owner, current):
                why = f"the lease belonged to {owner} with fence {current}"
            else:
                why = ""
            if why:
                verb = "renewed" if e.kind == "renewed" else "released"
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"{worker} {verb} the lease of step {sid[1]} of {sid[0]} with fence {fence}, "
                    f"but {why}: only the current holder with its current fence may", _idx([claim, e])))
                continue
        if e.kind in _FREES_LEASE or (e.kind == "committed" and e.get("fence") is not None):
            holder.pop(sid, None)
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 13. fence_rises


def fence_rises(history: History) -> Result:
    """Each claim of a step gets a fence strictly above every earlier fence of that step.

    A fence that does not rise (a lease generation reset to 1 on re-grant, semaprax #192) lets two
    holders share one token, and a fenced downstream can no longer tell the stale one.
    """
    name = "fence_rises"
    violations: list[Violation] = []
    top: dict[StepId, Event] = {}
    checked = False
    for e in _store(history):
        if e.kind != "claimed" or e.get("lease_version") is None:
            continue
        sid = _step_of(e)
        before = top.get(sid)
        if before is None:
            top[sid] = e
            continue
        checked = True
        fence, highest = e.get("lease_version"), before.get("lease_version")
        if fence <= highest:
            violations.append(Violation(
                name, sid[0], sid[1],
                f"{e.get('worker')} claimed step {sid[1]} of {sid[0]} with fence {fence}, not above "
                f"fence {highest} of the claim by {before.get('worker')} ({_at(before)}): two "
                f"holders share one fencing token", _idx([before, e])))
        else:
            top[sid] = e
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 14. receipt_first


def receipt_first(history: History) -> Result:
    """A keyed step committed as done has its succeeded receipt recorded before the commit.

    A commit that comes first leaves, when the worker dies in between, a success the store can no
    longer explain: recovery finds no receipt to rest on. Judged on commits under a lease (a fence)
    that end a keyed call: ``succeeded`` under the step's key, ``compensated`` under its
    compensation key. A target that records no receipt at all is not judged.
    """
    name = "receipt_first"
    events = _store(history)
    if not any(e.kind == "receipt_recorded" for e in events):
        return _result(name, False, [], "the target recorded no receipt")
    violations: list[Violation] = []
    receipts: dict[Any, Event] = {}  # key -> its first succeeded receipt
    checked = False
    for e in events:
        if e.kind == "receipt_recorded" and e.get("status") == "succeeded":
            receipts.setdefault(e.get("key"), e)
            continue
        if e.kind != "committed" or e.get("fence") is None:
            continue
        to_state = e.get("to_state")
        if to_state not in (SUCCEEDED, COMPENSATED):
            continue
        sid = _step_of(e)
        cfg = history.step_config(*sid)
        if cfg is None:
            continue
        key = cfg.key if to_state == SUCCEEDED else cfg.compensation_key
        if key is None:
            continue
        checked = True
        if key not in receipts:
            violations.append(Violation(
                name, sid[0], sid[1],
                f"{e.get('worker')} committed step {sid[1]} of {sid[0]} {to_state} before any "
                f"succeeded receipt for key {key!r} was recorded", (e.index,)))
    return _result(name, checked, violations)


# The order is the order of DESIGN section 7 (and of reports), then the checkpoint rule of section 3,
# then the lease, fence and receipt rules of section 7's bug classes.
CHECKERS = (no_duplicate_effects, effects_accounted, stale_writes_rejected, version_chain,
            legal_transitions, manual_stable, intent_conflict, retry_budget, terminates,
            stuck_detected, checkpoints_honoured, lease_fenced, fence_rises, receipt_first)
