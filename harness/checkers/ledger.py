"""The effects the downstream's ledger shows, judged against the steps that own them: one applied
effect per intent (``no_duplicate_effects``), every effect owned and every success with its effect
(``effects_accounted``), a key reused with another intent refused (``intent_conflict``), retries
bounded (``retry_budget``), and a step's receipt recorded before it is committed done
(``receipt_first``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from killpoint import vocab as v
from killpoint.harness.checkers._common import (
    DEFAULT_MAX_ATTEMPTS,
    StepId,
    _at,
    _effect_step,
    _final_states,
    _idx,
    _last_store,
    _result,
    _step_of,
)
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import COMPENSATION, FORWARD, Request, StoreEvent, WorkerOp
from killpoint.harness.history import History
from killpoint.harness.states import (
    COMPENSATED,
    COMPENSATING,
    MANUAL,
    PENDING,
    RETRY_SCHEDULED,
    RUNNING,
    SETTLED,
    SUCCEEDED,
    UNKNOWN,
)


def _logical_key(history: History, e: Request) -> Any:
    """The idempotency key a keyed request should have carried: the step's own, when known.

    The key a worker sent is the worker's claim about which intent it means; a worker that mints a
    new key per retry would make every duplicate look like a new intent. So an effect whose step is
    configured is grouped under that step's stable key, and only otherwise under the key it sent.
    """
    inst, step = e.meta.instance, e.meta.step
    cfg = history.step_config(inst, step) if inst is not None and step is not None else None
    if cfg is not None:
        expected = cfg.compensation_key if e.direction == COMPENSATION else cfg.key
        if expected is not None:
            return expected
    return e.key


def no_duplicate_effects(history: History) -> Result:
    """At most one applied effect per logical intent.

    Keyed requests are grouped by the step's stable idempotency key (see :func:`_logical_key`);
    legacy ones (no key) by instance, step, resource and direction, because a legacy downstream
    cannot tell a retry from a new request.
    """
    name = "no_duplicate_effects"
    effects = history.effects()
    groups: dict[tuple[Any, ...], list[Request]] = defaultdict(list)
    for e in effects:
        if e.key is not None:
            groups[("key", _logical_key(history, e))].append(e)
        else:
            groups[("legacy", e.meta.instance, e.meta.step, e.resource, e.direction)].append(e)
    violations = []
    for group, evs in groups.items():
        if len(evs) < 2:
            continue
        inst, step = _effect_step(evs[0])
        sent = list(dict.fromkeys(x.key for x in evs))
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
    effects = history.effects()
    by_step: dict[tuple[Any, Any, str], list[Request]] = defaultdict(list)
    for e in effects:
        by_step[(e.meta.instance, e.meta.step, e.direction)].append(e)
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


_FINISHED = frozenset({v.APPLIED, v.DECLINED, v.DROPPED})
_SUCCESSES = frozenset({v.APPLIED, v.DECLINED, v.DROPPED, v.REPLAY})


def intent_conflict(history: History) -> Result:
    """A key reused with another intent gets 422, never the old result or a new effect.

    A replayed success for a different intent would tell the worker its new request happened when
    the downstream really did something else.
    """
    name = "intent_conflict"
    violations: list[Violation] = []
    first: dict[str, Request] = {}
    hashes: dict[str, set[str]] = defaultdict(set)
    for e in history.typed(Request):
        key, h = e.key, e.intent_hash
        if key is None or h is None:
            continue
        hashes[key].add(h)
        owner = first.get(key)
        if owner is None:
            if e.outcome in _FINISHED:
                first[key] = e
            continue
        if h == owner.intent_hash:
            continue
        outcome, status = e.outcome, e.status
        inst, step = _effect_step(e)
        if outcome in _SUCCESSES:
            violations.append(Violation(
                name, inst, step,
                f"key {key!r} reused with another intent ({h} vs {owner.intent_hash}, "
                f"{_at(owner)}) got {outcome} (status {status}) instead of 422: reused key with "
                f"another intent got a replayed success", _idx([owner, e])))
        elif outcome == v.CONFLICT and status is not None and status != 422:
            violations.append(Violation(
                name, inst, step,
                f"key {key!r} reused with another intent got conflict with status {status}, "
                f"not 422", _idx([owner, e])))
    checked = any(len(hs) > 1 for hs in hashes.values())
    return _result(name, checked, violations)


def retry_budget(history: History) -> Result:
    """No call was made at an attempt beyond the step's maximum: retries must be bounded."""
    name = "retry_budget"
    violations: list[Violation] = []
    checked = False
    for e in history.typed(WorkerOp):
        if e.kind != v.CALL or e.type != v.INVOKE:
            continue
        attempt = e.attempt
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
                f"worker {e.process} called {e.resource} for step {step} of {inst} at "
                f"attempt {attempt}, beyond the maximum of {limit}", (e.index,)))
    return _result(name, checked, violations)


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
    events = history.typed(StoreEvent)
    if not any(e.kind == v.RECEIPT_RECORDED for e in events):
        return _result(name, False, [], "the target recorded no receipt")
    early: dict[Any, list[tuple[StepId, str, str, StoreEvent]]] = {}  # worker -> its commits before a receipt
    receipts: dict[Any, StoreEvent] = {}  # key -> its first succeeded receipt
    # step -> a succeeded receipt recorded for it, under any key, since its last succeeded commit
    fresh: dict[StepId, StoreEvent] = {}
    checked = False
    for e in events:
        if e.kind == v.RECEIPT_RECORDED and e.status == SUCCEEDED:
            receipts.setdefault(e.key, e)
            fresh.setdefault(_step_of(e), e)
            continue
        if e.kind != v.COMMITTED or e.fence is None:
            continue
        to_state = e.to_state
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
            early.setdefault(e.worker, []).append((sid, to_state, key, e))
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
    rows = [r for r in history.typed(Request) if (r.meta.instance, r.meta.step) == sid and r.direction == direction]
    mine = [r for r in rows if r.meta.worker == worker and r.key is not None]
    keyed = mine or [r for r in rows if r.key is not None]
    return keyed[0].key if keyed else None
