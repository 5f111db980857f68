"""The invariant checkers and the one function that turns a history into a verdict.

``check_all`` never lets a broken checker pass a run: a checker that raises gives an unknown result,
and unknown outranks valid.
"""

from __future__ import annotations

import dataclasses
import gc
from types import MappingProxyType
from typing import Callable, Generator, Iterable, Mapping

from killpoint import vocab
from killpoint.harness.checkers.base import Checker, Result, Verdict, Violation, rank
from killpoint.harness.checkers.invariants import (CHECKERS, checkpoints_honoured, effects_accounted,
                                         intent_conflict, legal_transitions, manual_stable,
                                         no_duplicate_effects, retry_budget, stale_writes_rejected,
                                         stuck_detected, terminates, version_chain, lease_fenced,
                                         fence_rises, receipt_first)
from killpoint.harness.checkers.replay import replay_compatible
from killpoint.harness.history import History, drained

# name -> checker, in the order of DESIGN section 7, then checkpoints_honoured (section 3), then
# lease_fenced, fence_rises and receipt_first (section 7's bug classes);
# read-only so no caller can change it for others.
ALL: Mapping[str, Checker] = MappingProxyType({c.__name__: c for c in CHECKERS})
# Invariants of what only some targets have, each judged (and reported, in the same table and JSON
# as the others) in a run whose history has its evidence: ``replay_compatible`` where the target
# replayed a workflow's recorded histories (the Temporal targets), and nowhere else.
OPTIONAL: Mapping[str, tuple[Checker, Callable[[History], bool]]] = MappingProxyType({
    "replay_compatible": (replay_compatible, lambda h: any(e.kind == vocab.REPLAYED for e in h.events)),
})


def _named(checkers: Mapping[str, Checker] | Iterable[Checker] | None,
           history: History) -> list[tuple[str, Checker]]:
    if checkers is None:
        return list(ALL.items()) + [(name, checker) for name, (checker, applies) in OPTIONAL.items()
                                    if applies(history)]
    if isinstance(checkers, Mapping):
        return list(checkers.items())
    return [(getattr(c, "__name__", repr(c)), c) for c in checkers]


def check_all(history: History, checkers: Mapping[str, Checker] | Iterable[Checker] | None = None,
              schedule: str = "") -> Verdict:
    """Run each checker on the history and rank the results (False > None > True).

    ``schedule`` (default: the history's own) is written into every violation so that a violation
    read on its own still says how to replay it.
    """
    return drained(checking(history, checkers, schedule))


def checking(history: History, checkers: Mapping[str, Checker] | Iterable[Checker] | None = None,
             schedule: str = "") -> Generator[None, None, Verdict]:
    """:func:`check_all` a checker at a time: it yields after each and returns the verdict."""
    schedule = schedule or history.schedule
    yield from history.parsing()
    results: list[Result] = []
    for name, checker in _named(checkers, history):
        why_not = not_applicable(name, history)
        if why_not is not None:
            results.append(Result(name, True, False, (), f"not applicable: {why_not}",
                                  applicable=False))
            continue
        # The checkers build large indexes over a large history and make no reference cycles, so
        # the cycle collector would only walk every event again and again (a third of the time on
        # a million events) and find nothing: it is paused while each runs.
        collecting = gc.isenabled()
        gc.disable()
        try:
            results.append(_judge(history, name, checker, schedule))
        finally:
            if collecting:
                gc.enable()
        yield
    unknown = tuple(f"{r.invariant}: {r.detail}" for r in results if r.valid is None)
    valid = rank(r.valid for r in results)
    if history.invalid:
        # The checkers judged the events they could read; one they could not might hold the proof.
        valid = rank((valid, None))
        shown = "; ".join(str(exc) for exc in history.invalid[:3])
        more = f" (and {len(history.invalid) - 3} more)" if len(history.invalid) > 3 else ""
        unknown += (f"{len(history.invalid)} event(s) of the history are not in its vocabulary, so no "
                    f"invariant read them: {shown}{more}",)
    if valid is True and not any(r.judged for r in results):
        # Valid must rest on something judged, never on invariants that had nothing to judge.
        valid = None
        unknown += (f"no invariant had anything to judge ({len(results)} ran, "
                    f"{sum(not r.applicable for r in results)} not applicable)",)
    return Verdict(valid, tuple(results), unknown)


def _judge(history: History, name: str, checker: Checker, schedule: str) -> Result:
    try:
        result = checker(history)
    except Exception as exc:  # a broken checker must give unknown, never valid
        result = Result(name, None, False, (), f"checker raised: {type(exc).__name__}: {exc}")
    if schedule:
        result = dataclasses.replace(result, violations=tuple(
            dataclasses.replace(v, schedule=schedule) for v in result.violations))
    return result


# What an invariant reads beyond the downstream ledger and the worker journals. A target that owns
# its state leaves killpoint's store empty, so these judge only what its hooks supply -- store events
# from ``history()``, final states from ``final_states()`` -- and otherwise are not applicable.
NEEDS_STORE_EVENTS = frozenset({"version_chain", "legal_transitions", "manual_stable", "stuck_detected",
                                "lease_fenced", "fence_rises", "receipt_first"})
NEEDS_FINAL_STATES = frozenset({"effects_accounted", "terminates"})
NEEDS_CHECKPOINTS = frozenset({"checkpoints_honoured"})


def not_applicable(name: str, history: History) -> str | None:
    """Why invariant ``name`` cannot judge ``history`` at all (None: it can). Only a target that
    owns its state can leave an invariant without its source; the ledger-based ones always judge."""
    if not history.owns_state:
        return None
    if name in NEEDS_STORE_EVENTS and not history.of(vocab.STORE):
        return "the target owns its state and its history() gave no store events"
    if name in NEEDS_FINAL_STATES and not history.final:
        return "the target owns its state and gave no final_states()"
    if name in NEEDS_CHECKPOINTS and not history.checkpoints:
        return "the target owns its state; killpoint's checkpoints are not what it reads"
    return None


__all__ = ["ALL", "OPTIONAL", "NEEDS_CHECKPOINTS", "NEEDS_FINAL_STATES", "NEEDS_STORE_EVENTS", "not_applicable",
           "Checker", "Result", "Verdict", "Violation", "check_all", "rank",
           "no_duplicate_effects", "effects_accounted", "stale_writes_rejected", "version_chain",
           "legal_transitions", "manual_stable", "intent_conflict", "retry_budget", "terminates",
           "stuck_detected", "checkpoints_honoured", "lease_fenced", "fence_rises", "receipt_first",
           "replay_compatible"]
