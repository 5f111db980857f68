"""Leases and fences: a write under a lease that is no longer current is refused
(``stale_writes_rejected``), only the current holder renews or releases a lease (``lease_fenced``),
and each claim's fence rises above every earlier one of its step (``fence_rises``)."""

from __future__ import annotations

from typing import Any

from killpoint import vocab as v
from killpoint.harness.checkers._common import StepId, _at, _effect_step, _idx, _in_order, _result, _step_of
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import Request, StoreEvent
from killpoint.harness.history import History


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
        fence_src: StoreEvent | None = None
        owner: Any = None
        claim_of: dict[tuple[Any, Any], StoreEvent] = {}  # (worker, fence) -> its claimed event
        claims = 0
        fenced = False  # a commit of this step was compared with its lease
        for e in events:
            if e.kind == v.COMMIT_REJECTED:
                takeover = True
            if e.kind == v.COMMITTED and fence_src is not None and e.fence is not None:
                fenced = True
                held, worker = e.fence, e.worker
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
                owner = e.worker
                claim_of[(owner, e.lease_version)] = e
            lease = e.lease_version
            if lease is not None and (fence_src is None or lease != fence):
                fence, fence_src = lease, e
        if claims > 1 and fenced:
            takeover = True
    violations = _in_order(violations)

    highest: dict[tuple[Any, Any], tuple[int, Request]] = {}  # scope -> its highest fence, and where
    for r in history.typed(Request):
        if r.outcome == v.STALE_FENCE:
            takeover = True
        f = r.fence
        if f is None or r.key is None:
            continue  # a legacy resource takes no key and enforces no fence: manual review covers it
        scope = (r.resource, r.scope)
        top = highest.get(scope)
        if r.applied and top is not None and f < top[0]:
            inst, step = _effect_step(r)
            violations.append(Violation(
                name, inst, step,
                f"{r.resource} applied a request with fence {f} after it had seen fence "
                f"{top[0]} ({_at(top[1])}) in scope {r.scope!r}: a stale write",
                _idx([top[1], r])))
        if top is None or f > top[0]:
            highest[scope] = (f, r)
    return _result(name, takeover, violations)


# Store events after which a step's lease is free: the holder's accepted commit (one with a fence),
# the monitor freeing a stuck lease, the holder's release.
_FREES_LEASE = frozenset({v.STUCK_FLAGGED, v.RELEASED})


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
    holder: dict[StepId, tuple[Any, Any, StoreEvent]] = {}  # step -> (owner, fence, the claim)
    checked = False
    for e in history.typed(StoreEvent):
        sid = _step_of(e)
        if e.kind == v.CLAIMED:
            holder[sid] = (e.worker, e.lease_version, e)
            continue
        if e.kind in (v.RENEWED, v.RELEASED):
            checked = True
            worker, fence = e.worker, e.fence
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
        if e.kind in _FREES_LEASE or (e.kind == v.COMMITTED and e.fence is not None):
            holder.pop(sid, None)
    return _result(name, checked, violations)


def fence_rises(history: History) -> Result:
    """Each claim of a step gets a fence strictly above every earlier fence of that step.

    A fence that does not rise (a lease generation reset to 1 on re-grant, semaprax #192) lets two
    holders share one token, and a fenced downstream can no longer tell the stale one.
    """
    name = "fence_rises"
    violations: list[Violation] = []
    top: dict[StepId, tuple[int, StoreEvent]] = {}  # step -> its highest fence, and its claim
    checked = False
    for e in history.typed(StoreEvent):
        fence = e.lease_version
        if e.kind != v.CLAIMED or fence is None:
            continue
        sid = _step_of(e)
        if sid not in top:
            top[sid] = (fence, e)
            continue
        checked = True
        highest, before = top[sid]
        if fence <= highest:
            violations.append(Violation(
                name, sid[0], sid[1],
                f"{e.worker} claimed step {sid[1]} of {sid[0]} with fence {fence}, not above "
                f"fence {highest} of the claim by {before.worker} ({_at(before)}): two "
                f"holders share one fencing token", _idx([before, e])))
        else:
            top[sid] = (fence, e)
    return _result(name, checked, violations)
