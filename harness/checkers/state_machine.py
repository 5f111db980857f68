"""Each step's life in the store as one state machine: its accepted transitions form one chain of
versions (``version_chain``), each is in the transition table and steps run in order
(``legal_transitions``), and a step in manual review leaves it only by an operator's hand
(``manual_stable``)."""

from __future__ import annotations

from typing import Any

from killpoint import vocab as v
from killpoint.harness.checkers._common import StepId, _at, _idx, _in_order, _result, _step_of
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import StoreEvent
from killpoint.harness.history import ACCEPTED_TRANSITIONS, History
from killpoint.harness.states import MANUAL, RUNNING, SUCCEEDED, allowed


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
        prev: StoreEvent | None = None
        seen: dict[int, StoreEvent] = {}
        for e in events:
            if e.kind != v.CREATED and e.kind not in ACCEPTED_TRANSITIONS:
                continue
            sv = e.state_version
            if sv is None:
                continue
            if e.kind == v.CREATED:
                if prev is None:
                    prev = e
                    seen[sv] = e
                continue
            before = prev
            if before is not None and before.state_version is not None:
                checked = True
                expected = before.state_version + 1
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
                    left, src = before.to_state, e.from_state
                    if left is not None and src is not None and src != left:
                        violations.append(Violation(
                            name, sid[0], sid[1],
                            f"step {sid[1]} of {sid[0]}: {e.kind} at state_version {sv} moved it "
                            f"from {src}, but version {expected - 1} ({_at(before)}) left it {left}: "
                            f"a change of state the history does not show", _idx([before, e])))
            seen[sv] = e
            prev = e
    return _result(name, checked, _in_order(violations))


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
    succeeded: dict[StepId, StoreEvent] = {}  # a step's first success
    for e in history.typed(StoreEvent):
        if not e.accepted:
            continue
        src, dst = e.from_state, e.to_state
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


def manual_stable(history: History) -> Result:
    """A step in manual review leaves it only through an operator event with actor and evidence.

    No background loop may retry or claim such a step: only a human knows whether the unsafe effect
    happened.
    """
    name = "manual_stable"
    violations: list[Violation] = []
    checked = False
    for sid, events in history.store_by_step().items():
        entered: StoreEvent | None = None  # the event that put the step in manual review, while it is
        for e in events:
            if not e.accepted:
                continue
            src, dst = e.from_state, e.to_state
            if entered is not None or src == MANUAL:
                operator = e.kind == v.OPERATOR_RESOLVED
                if not operator or not e.actor or not e.evidence:
                    why = ("without actor and evidence" if operator
                           else f"through {e.kind} by {e.worker or 'an unnamed writer'}, "
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
