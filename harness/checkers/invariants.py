"""The invariants of DESIGN section 7 (its ten, then checkpoints_honoured, lease_fenced, fence_rises and
receipt_first for the bug classes it names beyond them), each a pure function ``History -> Result``.

No checker does I/O or reads a clock: they only walk the events of one history, so each one is
tested on small hand-written histories. Every violation names the events that prove it, so a report
can point at them. ``checked`` says whether the history had anything for the invariant to judge: a
run with no reused key says nothing about ``intent_conflict`` and must not count as evidence for it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any, Iterable, Mapping

from killpoint import vocab as v
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.history import ACCEPTED_TRANSITIONS, Event, History
from killpoint.harness.states import (COMPENSATED, COMPENSATING, MANUAL, PENDING, RETRY_SCHEDULED, RUNNING,
                            SETTLED, SUCCEEDED, UNKNOWN, WAITING_APPROVAL, allowed)

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


def _is_accepted(e: Event) -> bool:
    """Accepted transitions are the store events that changed a step (commit_rejected did not)."""
    return e.process == v.STORE and e.kind in ACCEPTED_TRANSITIONS


def _step_of(e: Event) -> StepId:
    data = e.data
    return (data.get("instance"), data.get("step"))


def _effect_step(e: Event) -> StepId:
    meta = e.meta
    return (meta.get("instance"), meta.get("step"))


def _direction(e: Event) -> str:
    return e.meta.get("direction") or FORWARD


def _last_store(history: History) -> dict[StepId, Event]:
    """Each step's last store event."""
    return {sid: evs[-1] for sid, evs in history.store_by_step().items()}


def _in_order(violations: list[Violation]) -> list[Violation]:
    """Violations found step by step, put back in the order of the events that revealed them (the
    latest event of each proof), as a walk over the whole history in order would have found them."""
    return sorted(violations, key=lambda found: max(found.events, default=-1))


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
    meta = e.meta
    inst, step = meta.get("instance"), meta.get("step")
    cfg = history.step_config(inst, step) if inst is not None and step is not None else None
    if cfg is not None:
        expected = cfg.compensation_key if (meta.get("direction") or FORWARD) == COMPENSATION else cfg.key
        if expected is not None:
            return expected
    return e.data.get("key")


def no_duplicate_effects(history: History) -> Result:
    """At most one applied effect per logical intent.

    Keyed requests are grouped by the step's stable idempotency key (see :func:`_logical_key`);
    legacy ones (no key) by instance, step, resource and direction, because a legacy downstream
    cannot tell a retry from a new request.
    """
    name = "no_duplicate_effects"
    effects = history.applied()
    groups: dict[tuple[Any, ...], list[Event]] = defaultdict(list)
    for e in effects:
        if e.data.get("key") is not None:
            groups[("key", _logical_key(history, e))].append(e)
        else:
            meta = e.meta
            groups[("legacy", meta.get("instance"), meta.get("step"), e.data.get("resource"),
                    meta.get("direction") or FORWARD)].append(e)
    violations = []
    for group, evs in groups.items():
        if len(evs) < 2:
            continue
        inst, step = _effect_step(evs[0])
        sent = list(dict.fromkeys(x.data.get("key") for x in evs))
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
    effects = history.applied()
    by_step: dict[tuple[Any, Any, str], list[Event]] = defaultdict(list)
    for e in effects:
        meta = e.meta
        by_step[(meta.get("instance"), meta.get("step"), meta.get("direction") or FORWARD)].append(e)
    last_store = _last_store(history)

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
        if state == SUCCEEDED and not by_step.get((cfg.instance, cfg.step, FORWARD)):
            violations.append(Violation(
                name, cfg.instance, cfg.step,
                f"step {cfg.step} of {cfg.instance} succeeded without an effect on "
                f"{cfg.resource!r}: lost", _idx([last_store.get((cfg.instance, cfg.step))])))
        if state == COMPENSATED and not by_step.get((cfg.instance, cfg.step, COMPENSATION)):
            violations.append(Violation(
                name, cfg.instance, cfg.step,
                f"step {cfg.step} of {cfg.instance} was compensated without a compensation "
                f"effect: lost", _idx([last_store.get((cfg.instance, cfg.step))])))

    if final:  # without final states nothing can be attributed
        ok = _ACCOUNTING_STATES if history.quiescent else _ACCOUNTING_STATES | _IN_FLIGHT_STATES
        for (inst, step, direction), evs in by_step.items():
            state = final.get((inst, step))
            if state in ok and not (direction == COMPENSATION and state == SUCCEEDED):
                continue
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
    scope, or a woken stale worker overwrote its successor. A step claimed again whose commits carry
    no fence (a library that records none) gives it nothing to judge.
    """
    name = "stale_writes_rejected"
    violations: list[Violation] = []
    takeover = False
    for sid, events in history.store_by_step().items():
        fence: Any = None  # the step's current lease version, and the event that set it
        fence_src: Event | None = None
        owner: Any = None
        claim_of: dict[tuple[Any, Any], Event] = {}  # (worker, fence) -> its claimed event
        claims = 0
        fenced = False  # a commit of this step was compared with its lease
        for e in events:
            data = e.data
            if e.kind == v.COMMIT_REJECTED:
                takeover = True
            if e.kind == v.COMMITTED and fence_src is not None and data.get("fence") is not None:
                fenced = True
                held, worker = data.get("fence"), data.get("worker")
                stale_fence = held != fence
                stale_owner = worker is not None and owner is not None and worker != owner
                if stale_fence or stale_owner:
                    why = (f"fence {held} while the current lease version was {fence}"
                           if stale_fence else
                           f"worker {worker} while the lease belonged to {owner}")
                    proof = [e, fence_src, claim_of.get((worker, held))]
                    violations.append(Violation(
                        name, sid[0], sid[1],
                        f"commit of step {sid[1]} of {sid[0]} by {worker} accepted with {why}: "
                        f"a stale write", _idx(proof)))
            if e.kind == v.CLAIMED:
                claims += 1
                owner = data.get("worker")
                claim_of[(owner, data.get("lease_version"))] = e
            lease = data.get("lease_version")
            if lease is not None and (fence_src is None or lease != fence):
                fence, fence_src = lease, e
        if claims > 1 and fenced:
            takeover = True
    violations = _in_order(violations)

    highest: dict[tuple[Any, Any], Event] = {}
    for e in history.requests():
        if e.data.get("outcome") == v.STALE_FENCE:
            takeover = True
        f = e.data.get("fence")
        if f is None or e.data.get("key") is None:
            continue  # a legacy resource takes no key and enforces no fence: manual review covers it
        scope = (e.data.get("resource"), e.data.get("scope"))
        top = highest.get(scope)
        if e.data.get("applied") is True and top is not None and f < top.data.get("fence"):
            inst, step = _effect_step(e)
            violations.append(Violation(
                name, inst, step,
                f"{e.data.get('resource')} applied a request with fence {f} after it had seen fence "
                f"{top.data.get('fence')} ({_at(top)}) in scope {e.data.get('scope')!r}: a stale write",
                _idx([top, e])))
        if top is None or f > top.data.get("fence"):
            highest[scope] = e
    return _result(name, takeover, violations)


# ---------------------------------------------------------------------------------------------
# 4. version_chain


def version_chain(history: History) -> Result:
    """Each step's accepted transitions form one chain, ``state_version`` +1 each, each claim
    starting from the state the transition before it left.

    Two accepted events with the same version are a fork (two writers both won a compare-and-set);
    a gap or a step back means a write bypassed the compare-and-set. A claim whose ``from_state``
    is not the state the transition before it left (a step committed ``succeeded``, then claimed
    from ``pending``) means the step was moved by a write the history does not show: a recovery
    that put a finished step back, say, without bumping its version.
    """
    name = "version_chain"
    violations: list[Violation] = []
    checked = False
    for sid, events in history.store_by_step().items():
        prev: Event | None = None
        seen: dict[Any, Event] = {}
        for e in events:
            if e.kind != v.CREATED and e.kind not in ACCEPTED_TRANSITIONS:
                continue
            sv = e.data.get("state_version")
            if sv is None:
                continue
            if e.kind == v.CREATED:
                if prev is None:
                    prev = e
                    seen[sv] = e
                continue
            before = prev
            if before is not None:
                checked = True
                expected = before.data["state_version"] + 1
                if sv in seen:
                    twin = seen[sv]
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
                elif e.kind == v.CLAIMED:
                    # A claim picks a step up from the state it is in (the compare-and-set reads
                    # it); a commit's from_state is only what its writer believed, which a stale
                    # writer gets wrong, and stale_writes_rejected judges that.
                    left, src = before.data.get("to_state"), e.data.get("from_state")
                    if left is not None and src is not None and src != left:
                        violations.append(Violation(
                            name, sid[0], sid[1],
                            f"step {sid[1]} of {sid[0]}: {e.kind} at state_version {sv} moved it "
                            f"from {src}, but version {expected - 1} ({_at(before)}) left it {left}: "
                            f"a change of state the history does not show", _idx([before, e])))
            seen[sv] = e
            prev = e
    return _result(name, checked, _in_order(violations))


# ---------------------------------------------------------------------------------------------
# 5. legal_transitions


def legal_transitions(history: History) -> Result:
    """Every accepted transition is in the one table the store also enforces; and, in killpoint's
    store, a step is claimed to run only once every step before it in its instance has succeeded
    (steps run in order: a worker that starts an instance's next step while the one before is
    still running sent a trip's confirmation mail before its card was declined, and every other
    invariant held). A target that owns its state is not judged on the order: its history may give
    one job's start as a claim of every step of its instance (procrastinate's, one job an order)."""
    name = "legal_transitions"
    violations: list[Violation] = []
    checked = False
    order: dict[Any, list[Any]] = {}  # instance -> its steps, in the workload's order
    if not history.owns_state:
        for cfg in history.steps:
            order.setdefault(cfg.instance, []).append(cfg.step)
    succeeded: dict[tuple[Any, Any], Event] = {}  # a step's first success
    for e in history.store_events():
        if not _is_accepted(e):
            continue
        src, dst = e.data.get("from_state"), e.data.get("to_state")
        if src is None or dst is None:
            continue  # cannot be judged
        checked = True
        inst, step = _step_of(e)
        if not allowed(src, dst):
            violations.append(Violation(
                name, inst, step,
                f"step {step} of {inst}: {e.kind} moved it {src} -> {dst}, which the transition "
                f"table does not allow", (e.index,)))
        if dst == SUCCEEDED:
            succeeded.setdefault((inst, step), e)
        elif e.kind == v.CLAIMED and dst == RUNNING and step in order.get(inst, ()):
            steps = order[inst]
            before = [s for s in steps[:steps.index(step)] if (inst, s) not in succeeded]
            if before:
                violations.append(Violation(
                    name, inst, step,
                    f"step {step} of {inst} was claimed to run before {', '.join(before)} (before it in "
                    f"the instance) succeeded: steps run in order", (e.index,)))
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
    checked = False
    for sid, events in history.store_by_step().items():
        entered: Event | None = None  # the event that put the step in manual review, while it is
        for e in events:
            if e.kind not in ACCEPTED_TRANSITIONS:
                continue
            src, dst = e.data.get("from_state"), e.data.get("to_state")
            if entered is not None or src == MANUAL:
                operator = e.kind == v.OPERATOR_RESOLVED
                if not operator or not e.data.get("actor") or not e.data.get("evidence"):
                    why = ("without actor and evidence" if operator
                           else f"through {e.kind} by {e.data.get('worker') or 'an unnamed writer'}, "
                                f"not an operator event")
                    violations.append(Violation(
                        name, sid[0], sid[1],
                        f"step {sid[1]} of {sid[0]} in manual_intervention"
                        f"{f' since {_at(entered)}' if entered else ''} was moved to {dst} {why}",
                        _idx([entered, e])))
            if dst == MANUAL:
                checked = True
                if entered is None:
                    entered = e
            else:
                entered = None
    return _result(name, checked, _in_order(violations))


# ---------------------------------------------------------------------------------------------
# 7. intent_conflict

_FINISHED = frozenset({v.APPLIED, v.DECLINED, v.DROPPED})
_SUCCESSES = frozenset({v.APPLIED, v.DECLINED, v.DROPPED, v.REPLAY})


def intent_conflict(history: History) -> Result:
    """A key reused with another intent gets 422, never the old result or a new effect.

    A replayed success for a different intent would tell the worker its new request happened when
    the downstream really did something else.
    """
    name = "intent_conflict"
    violations: list[Violation] = []
    first: dict[Any, Event] = {}
    hashes: dict[Any, set[Any]] = defaultdict(set)
    for e in history.requests():
        key, h = e.data.get("key"), e.data.get("intent_hash")
        if key is None or h is None:
            continue
        hashes[key].add(h)
        owner = first.get(key)
        if owner is None:
            if e.data.get("outcome") in _FINISHED:
                first[key] = e
            continue
        if h == owner.get("intent_hash"):
            continue
        outcome, status = e.data.get("outcome"), e.data.get("status")
        inst, step = _effect_step(e)
        if outcome in _SUCCESSES:
            violations.append(Violation(
                name, inst, step,
                f"key {key!r} reused with another intent ({h} vs {owner.get('intent_hash')}, "
                f"{_at(owner)}) got {outcome} (status {status}) instead of 422: reused key with "
                f"another intent got a replayed success", _idx([owner, e])))
        elif outcome == v.CONFLICT and status is not None and status != 422:
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
    for e in history.of_workers("call"):
        if e.type != v.INVOKE:
            continue
        attempt = e.data.get("attempt")
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
                f"worker {e.process} called {e.data.get('resource')} for step {step} of {inst} at "
                f"attempt {attempt}, beyond the maximum of {limit}", (e.index,)))
    return _result(name, checked, violations)


# ---------------------------------------------------------------------------------------------
# 9. terminates


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


# ---------------------------------------------------------------------------------------------
# 10. stuck_detected


def stuck_detected(history: History) -> Result:
    """A worker hanging with its heartbeat alive is flagged within stuck_bound + slack.

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
    flags: dict[StepId, list[Event]] = defaultdict(list)
    claims: dict[StepId, list[Event]] = defaultdict(list)
    deaths: dict[Any, list[Event]] = defaultdict(list)
    owners: dict[StepId, list[Event]] = defaultdict(list)  # events that set or clear the lease
    identity: dict[Any, Any] = {}  # worker incarnation (A.2) -> the identity the store saw (A)
    for e in history.of(v.HARNESS):
        if e.kind in (v.KILL, v.EXIT):
            deaths[e.data.get("worker")].append(e)
        elif e.kind == v.SPAWN and e.data.get("identity") is not None:
            identity[e.data.get("worker")] = e.data.get("identity")
    for e in history.store_events():
        if e.kind == v.STUCK_FLAGGED:
            flags[_step_of(e)].append(e)
        elif e.kind == v.CLAIMED:
            claims[_step_of(e)].append(e)
        if e.kind in (v.CREATED, v.CLAIMED, v.STUCK_FLAGGED) or (
                e.kind == v.COMMITTED and e.data.get("fence") is not None):
            owners[_step_of(e)].append(e)

    # Each list is in history order, so in time order: a bisection finds the events around a hang
    # without rescanning them (a worker may die many times in a long history).
    def times(index: Mapping[Any, list[Event]]) -> dict[Any, list[int]]:
        return {k: [x.time for x in evs] for k, evs in index.items()}
    flag_times, death_times, owner_times = times(flags), times(deaths), times(owners)
    claim_times = times(claims)
    starved = [(e.time, int(round(float(e.data.get("ms") or 0) * 1_000_000)))
               for e in history.of(v.HARNESS) if e.kind == v.STARVED]
    starved_times = [t for t, _ in starved]

    def deadline_of(hang: Event, start: int | None = None) -> int:
        """The hang's deadline (``start``: when the window ends, by default ``window`` after the
        hang), moved by every starvation of the harness before it."""
        deadline = hang.time + window if start is None else start
        for t, ns in starved[bisect_left(starved_times, hang.time):]:
            if t > deadline:
                break
            deadline += ns
        return deadline

    def held_no_lease(hang: Event, sid: StepId) -> bool:
        n = bisect_right(owner_times.get(sid, ()), hang.time)  # the owner events up to the hang
        if n == 0:
            return False  # the store says nothing: judge the hang
        last = owners[sid][n - 1]
        who = identity.get(hang.process, str(hang.process).split(".")[0])
        return not (last.kind == v.CLAIMED and last.data.get("worker") == who)

    def first_from(index: dict[Any, list[int]], key: Any, t: int) -> int | None:
        """The time of the first event of ``index[key]`` at or after ``t``."""
        ts = index.get(key, ())
        i = bisect_left(ts, t)
        return ts[i] if i < len(ts) else None
    violations: list[Violation] = []
    checked = False
    free: dict[Any, list[tuple[int, int]]] | None = None  # made only for a hang flagged late
    for e in history.of_workers("point"):
        if e.data.get("action") != "hang":
            continue
        sid = _step_of(e)
        if None in sid or held_no_lease(e, sid):
            continue
        deadline = deadline_of(e)
        # A flag ends the hang's hold on its step; so does a later claim of the step (the hung
        # worker's heartbeat was not running -- it hung before its first beat -- and its lease
        # ran out): either way the step is free again, which is what the bound is about.
        ends = [t for t in (first_from(flag_times, sid, e.time), first_from(claim_times, sid, e.time + 1))
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
            window_end = _after_free_time(e.time, window, [iv for w, ivs in free.items()
                                                           if w != e.process for iv in ivs])
            if window_end is None:  # the other workers were free for less than the window in all
                checked = checked or flagged is not None  # ended within it: judged, and held
                continue  # else nobody was free long enough to flag it: nothing to judge
            deadline = deadline_of(e, window_end)
            if flagged is not None and flagged <= deadline:
                checked = True
                continue
        died = first_from(death_times, e.process, e.time)
        if died is not None and died <= deadline:
            continue  # the worker died unflagged before the deadline: its heartbeat died with it
        if end <= deadline:
            continue  # the history ends before the deadline
        checked = True
        late = flags.get(sid, [])[bisect_right(flag_times.get(sid, ()), deadline):]
        ms = (deadline - e.time) / 1_000_000
        if late:
            after = (late[0].time - e.time) / 1_000_000
            detail = (f"worker {e.process} hung at {e.data.get('point')} on step {sid[1]} of {sid[0]} "
                      f"and was flagged only after {after:g} ms (bound {ms:g} ms)")
        else:
            detail = (f"worker {e.process} hung at {e.data.get('point')} on step {sid[1]} of {sid[0]} "
                      f"and was never flagged within {ms:g} ms")
        violations.append(Violation(name, sid[0], sid[1], detail, _idx([e, *late[:1]])))
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
    for e in history.events:
        if e.process == v.HARNESS:
            w = e.data.get("worker")
            if e.kind == v.SPAWN:
                born.setdefault(w, e.time)
            elif e.kind in (v.KILL, v.EXIT):
                dead.setdefault(w, e.time)
            elif e.kind == v.STOP:
                stalls[w].append([e.time, _FOREVER])
            elif e.kind == v.CONT and stalls.get(w) and stalls[w][-1][1] == _FOREVER:
                stalls[w][-1][1] = e.time
        elif e.kind == "point" and e.data.get("action") == "hang":
            stalls[e.process].append([e.time, _FOREVER])
        elif e.kind == "point" and e.data.get("action") == "sleep":
            # as long as the schedule's sleep, on the run clock (the history's time); unknown: to
            # the end (not free, so never a deadline that lands on a worker that was asleep)
            if sleeps is None:
                sleeps = _sleep_lengths(history)
            ms = sleeps.get(e.data.get("fault", -1))
            stalls[e.process].append([e.time, _FOREVER if ms is None else e.time + int(ms * 1_000_000)])
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

    names = frozenset(str(e.data.get("point")) for e in history.of_workers("point")) | POINTS
    try:
        faults = chaos.parse(history.schedule, points=names).faults
    except chaos.InvalidSchedule:
        return {}
    out: dict[int, int | None] = {}
    for i, fault in enumerate(faults):
        lengths = {t.arg for t in fault.actions.terms if t.action == "sleep"}
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
    # One pass over the store and the ledger (not one per refused instance): instance -> step -> proof.
    proofs: dict[Any, dict[Any, list[Event]]] = {instance: defaultdict(list) for instance in refused}
    for e in history.store_events():
        if e.kind == v.COMMITTED and e.data.get("to_state") == SUCCEEDED and e.data.get("instance") in proofs:
            proofs[e.data.get("instance")][e.data.get("step")].append(e)
    for e in history.applied():
        instance, step = _effect_step(e)
        if instance in proofs:
            proofs[instance][step].append(e)
    violations: list[Violation] = []
    for instance, verdict in refused.items():
        for step, proof in proofs[instance].items():
            proof.sort(key=lambda e: e.index)
            commits = [e for e in proof if e.process == v.STORE]
            effects = [e for e in proof if e.process == v.DOWNSTREAM]
            what = []
            if commits:
                workers = ", ".join(sorted({str(e.data.get("worker")) for e in commits}))
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
    for e in history.store_events():
        sid = _step_of(e)
        if e.kind == v.CLAIMED:
            holder[sid] = (e.get("worker"), e.get("lease_version"), e)
            continue
        if e.kind in (v.RENEWED, v.RELEASED):
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
                verb = "renewed" if e.kind == v.RENEWED else "released"
                violations.append(Violation(
                    name, sid[0], sid[1],
                    f"{worker} {verb} the lease of step {sid[1]} of {sid[0]} with fence {fence}, "
                    f"but {why}: only the current holder with its current fence may", _idx([claim, e])))
                continue
        if e.kind in _FREES_LEASE or (e.kind == v.COMMITTED and e.get("fence") is not None):
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
    for e in history.store_events():
        if e.kind != v.CLAIMED or e.get("lease_version") is None:
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

    A worker may key its calls its own way (``order-1/charge`` rather than the step's derived key):
    a succeeded receipt recorded for the same step under any key counts, for a ``compensated``
    commit only one recorded after the step's forward success was committed.
    """
    name = "receipt_first"
    events = history.store_events()
    if not any(e.kind == v.RECEIPT_RECORDED for e in events):
        return _result(name, False, [], "the target recorded no receipt")
    early: dict[Any, list[tuple[StepId, str, str, Event]]] = {}  # worker -> its commits before a receipt
    receipts: dict[Any, Event] = {}  # key -> its first succeeded receipt
    # step -> a succeeded receipt recorded for it, under any key, since its last succeeded commit
    fresh: dict[StepId, Event] = {}
    checked = False
    for e in events:
        if e.kind == v.RECEIPT_RECORDED and e.get("status") == "succeeded":
            receipts.setdefault(e.get("key"), e)
            fresh.setdefault(_step_of(e), e)
            continue
        if e.kind != v.COMMITTED or e.get("fence") is None:
            continue
        to_state = e.get("to_state")
        if to_state not in (SUCCEEDED, COMPENSATED):
            continue
        sid = _step_of(e)
        cfg = history.step_config(*sid)
        if cfg is None:
            continue
        key = cfg.key if to_state == SUCCEEDED else cfg.compensation_key
        own = fresh.pop(sid, None) if to_state == SUCCEEDED else fresh.get(sid)
        if key is None:
            continue
        checked = True
        if key not in receipts and own is None:
            early.setdefault(e.get("worker"), []).append((sid, to_state, key, e))
    # One violation per worker (a worker that commits first does so at every step: hundreds of lines
    # a matrix said the same thing), naming the key the worker itself sent for its first such step.
    violations: list[Violation] = []
    for worker, commits in early.items():
        sid, to_state, key, first = commits[0]
        sent = _sent_key(history, sid, worker, COMPENSATION if to_state == COMPENSATED else FORWARD) or key
        more = f" (and {len(commits) - 1} more step{'s' if len(commits) > 2 else ''})" if len(commits) > 1 else ""
        violations.append(Violation(
            name, sid[0], sid[1],
            f"{worker} committed step {sid[1]} of {sid[0]} {to_state}{more} before any succeeded receipt "
            f"was recorded for it; the key it sent was {sent!r}",
            tuple(c[3].index for c in commits[:20])))
    return _result(name, checked, violations)


def _sent_key(history: History, sid: StepId, worker: Any, direction: str) -> Any:
    """The idempotency key ``worker`` sent for step ``sid`` in ``direction`` (any worker's when it
    sent none)."""
    rows = [r for r in history.requests(instance=sid[0], step=sid[1]) if _direction(r) == direction]
    mine = [r for r in rows if r.meta.get("worker") == worker and r.get("key") is not None]
    keyed = mine or [r for r in rows if r.get("key") is not None]
    return keyed[0].get("key") if keyed else None


# The order is the order of DESIGN section 7 (and of reports), then the checkpoint rule of section 3,
# then the lease, fence and receipt rules of section 7's bug classes.
CHECKERS = (no_duplicate_effects, effects_accounted, stale_writes_rejected, version_chain,
            legal_transitions, manual_stable, intent_conflict, retry_budget, terminates,
            stuck_detected, checkpoints_honoured, lease_fenced, fence_rises, receipt_first)
