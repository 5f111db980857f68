"""Judging a run: gather its history from every source, check every invariant, account for faults.

The harness is the oracle here, never the target: the history merges the workers' journals, the
store's event table, the downstream's ledger and the harness's own process events; checkpoints are
verified again by the harness; a scheduled fault that never fired makes the verdict unknown (at
best), never valid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Mapping, Sequence

from killpoint import vocab
from killpoint.chaos.schedule import Schedule
from killpoint.harness import checkpoint
from killpoint.harness import downstream as ds
from killpoint.harness import history as hist
from killpoint.harness.checkers import checking
from killpoint.harness.events import PointHit, parse_store_row
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.exercise import Exercise, exercised
from killpoint.harness.states import PENDING
from killpoint.harness.store.base import Store
from killpoint.harness.worker import Timing
from killpoint.harness.workload import Workload, policy_of

if TYPE_CHECKING:
    from killpoint.harness.hooks import Hooks

__all__ = ["Judgement", "checkpoint_verdicts", "gathering", "judge", "judging"]


def checkpoint_verdicts(workload: Workload, store: Store) -> tuple[dict[str, Any], ...]:
    """What a correct worker concludes about each stored checkpoint: the same pure
    ``checkpoint.verify`` on the stored row, this code's definition and the deployment's key
    and migrations that ``ReferenceWorker.load_instance`` uses. The harness is the oracle, so a
    target that skips or botches the verification cannot also change the answer it is judged by."""
    policy = policy_of(workload)
    verdicts = []
    for inst in workload.instances:
        loaded = checkpoint.verify(store.instance(inst.id), inst, policy)
        verdicts.append({"instance": inst.id, "outcome": loaded.outcome, "reason": loaded.reason})
    return tuple(verdicts)


def gathering(*, workload: Workload, store: Store, client: ds.DownstreamClient,
              workers: Iterable[Any], harness_events: Sequence[Mapping[str, Any]],
              schedule: Schedule, timing: Timing, quiescent: bool, bound_hit: bool,
              hooks: "Hooks | None" = None, at: Callable[[int], int] | None = None,
              ) -> Generator[None, None, hist.History]:
    """One history from the journals of ``workers`` (label, journal path, exit code), the store,
    the downstream's ledger and the harness's events; ``at`` puts each time on the run's clock.
    Made a piece at a time (each a millisecond or so): it yields between pieces and returns the
    history, so a harness with workers to answer can look at them in between.

    With the ``hooks`` of a target that owns its state, killpoint's store (which then holds only
    the rows it was set up with) gives way to what the target's ``history()`` and ``final_states()``
    say; with neither, the invariants that read them say "not applicable"."""
    workers = list(workers)
    journals = {}
    for w in workers:
        if os.path.exists(w.journal):
            journals[w.label] = hist.read_journal(w.journal)
            yield
    dead = {w.label for w in workers if w.exitcode != 0}
    owns = hooks is not None and hooks.target.owns_state
    checkpoints = () if owns else checkpoint_verdicts(workload, store)
    yield
    store_events = store.events()
    final: tuple[Mapping[str, Any], ...] = tuple(store.steps())
    if owns:
        assert hooks is not None
        # killpoint's own 'created' rows go: the target's history() tells its steps' story
        store_events = [e for n, e in enumerate(store_events) if parse_store_row(e, index=n).kind != vocab.CREATED]
        end = max([h["t"] for h in harness_events] or [0])
        told = hooks.history(end)
        store_events += told
        final = hooks.final_states()
        if told and final:
            for why in _untold(told, final):
                hooks.untrusted(why)
    yield
    ledger = client.ledger()
    yield
    steps = tuple(_step_config(inst, s, hooks) for inst in workload.instances for s in inst.steps)
    return (yield from hist.merging(journals, store_events, ledger, list(harness_events),
                                    dead=dead, steps=steps, final=final, checkpoints=checkpoints,
                                    owns_state=owns, schedule=str(schedule), quiescent=quiescent,
                                    bound_hit=bound_hit, stuck_bound_ms=timing.stuck_bound_ms,
                                    stuck_slack_ms=timing.stuck_slack_ms, at=at))


def _step_config(inst: Any, spec: Any, hooks: "Hooks | None") -> hist.StepConfig:
    """What the checkers know of one step, its declared intent included (the target's ``intent``
    hook's, else the workload's parameters)."""
    params = hooks.intent(inst, spec) if hooks is not None else (dict(spec.params) or None)
    return hist.StepConfig(inst.id, spec.name, spec.resource, spec.key(inst.id), not spec.retry_safe,
                           spec.max_attempts, spec.compensation_key(inst.id), params,
                           spec.compensation_params(inst.id, params) if params else None)


def _untold(events: Sequence[Mapping[str, Any]], final: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where a target's ``history()`` and ``final_states()`` disagree: a step whose final state is
    not ``pending`` but whose last transition in the history (``claimed``, ``committed``, an
    operator's or an approval) is missing or leads elsewhere. Such a history left out what moved
    the step -- a hook that gave only claims once hid a stale commit, and the run came out valid
    -- so the invariants that judge it cannot be trusted: one line, the run unknown."""
    last: dict[tuple[Any, Any], Any] = {}
    typed = (parse_store_row(e, index=n) for n, e in enumerate(events))  # valid: hooks.history checked them
    for e in sorted(typed, key=lambda e: e.time):
        if e.accepted and e.to_state is not None:
            last[(e.instance, e.step)] = e.to_state
    off = [(r["instance"], r["step"], r["state"], last.get((r["instance"], r["step"])))
           for r in final if r["state"] != PENDING and last.get((r["instance"], r["step"])) != r["state"]]
    if not off:
        return []
    shown_ = "; ".join(f"{i}/{s} is {state} but its last transition there is "
                       f"{'to ' + str(to) if to is not None else 'none'}" for i, s, state, to in off[:5])
    more = f" (and {len(off) - 5} more)" if len(off) > 5 else ""
    return [f"the target's history() leaves out what moved its steps to their final states: {shown_}{more}; "
            f"the invariants that judge its events cannot be trusted (give every claimed and committed "
            f"event, with to_state)"]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    fired: dict[str, int]  # fault text -> times an action fired
    unfired: tuple[str, ...]
    exercise: Exercise | None = None  # what the faults provoked (harness.exercise)


# Beyond the invariants that need store events to judge at all, those that also read them: a step's
# claims and fences (stale writes), its last event (what is accounted for, what terminated).
READS_STORE_EVENTS = frozenset({"stale_writes_rejected", "effects_accounted", "terminates"})


def _distrust(verdict: Verdict, untrusted: Sequence[str]) -> Verdict:
    """The verdict with every invariant that reads the target's store events unknown: its history()
    left events out or gave them wrong, and a chain judged with holes in it is a false alarm (an
    unknown kind once gave a correct worker version_chain violations in most of its runs) or a
    false pass. The ledger's invariants still judge."""
    from killpoint.harness.checkers import NEEDS_STORE_EVENTS
    from killpoint.harness.checkers.base import Result, rank

    why = f"not judged: {untrusted[0]}"
    reads = NEEDS_STORE_EVENTS | READS_STORE_EVENTS
    names = [r.invariant for r in verdict.results if r.invariant in reads and r.applicable]
    if not names:
        return verdict
    results = tuple(Result(r.invariant, None, False, (), why) if r.invariant in names else r
                    for r in verdict.results)
    kept = tuple(u for u in verdict.unknown_reasons if u.split(":")[0] not in names)
    return Verdict(rank(r.valid for r in results), results,
                   kept + (f"{', '.join(names)} not judged: the target's history() cannot be trusted",))


def _stepless(history: hist.History, fault: Any) -> str:
    """Why a fault at a step never fired, when its worker passed its point outside any step (the
    target marked no step around it, as a queue worker's ``before_claim`` before it knows its job):
    a fault at a step never matches such a hit. Empty when that is not why."""
    if fault.step is None:
        return ""
    hits = [e for e in history.typed(PointHit) if e.point == fault.point
            and e.step is None and e.process.split(".")[0] == fault.worker]
    if not hits:
        return ""
    return (f": worker {fault.worker} passed {fault.point} {len(hits)} time{'s' if len(hits) != 1 else ''} "
            f"outside any step (no ctx.at around it), where a fault at step {fault.step} never matches; "
            f"schedule it once per worker, without a step ({fault.worker}@{fault.point}:{fault.actions}), "
            f"or mark its step with ctx.at")


def judge(history: hist.History, schedule: Schedule, fired: Mapping[int, int],
          findings: Sequence[str] = (), sometimes: Sequence[str] = (),
          untrusted: Sequence[str] = ()) -> Judgement:
    """Every invariant on ``history``; a scheduled fault that never fired, a pause or hang that
    provoked no takeover (:mod:`harness.exercise`), or a ``finding`` (the target raised, a hook
    failed), makes it unknown at best. ``sometimes``: the expectations the target declared.
    ``untrusted``: why the target's ``history()`` cannot be trusted (an unknown kind, a bad field):
    the invariants that read its events then judge nothing, naming it."""
    return hist.drained(judging(history, schedule, fired, findings, sometimes, untrusted))


def judging(history: hist.History, schedule: Schedule, fired: Mapping[int, int],
            findings: Sequence[str] = (), sometimes: Sequence[str] = (),
            untrusted: Sequence[str] = ()) -> Generator[None, None, Judgement]:
    """:func:`judge` an invariant at a time: it yields between them and returns the judgement."""
    verdict = yield from checking(history, schedule=str(schedule))
    if untrusted:
        verdict = _distrust(verdict, untrusted)
    unfired = tuple(str(f) for i, f in enumerate(schedule.faults) if i not in fired)
    exercise = exercised(history, schedule.faults, sometimes)
    yield
    # A pause or hang nobody took over tested nothing a run without it would have: never evidence
    # for valid, as a fault that never fired is not.
    extra = tuple(findings) + tuple(f"scheduled fault {f} never fired{_stepless(history, f)}"
                                    for i, f in enumerate(schedule.faults) if i not in fired) + exercise.reasons()
    if extra:
        valid = False if verdict.valid is False else None
        verdict = Verdict(valid, verdict.results, verdict.unknown_reasons + extra)
    counts = {str(f): fired.get(i, 0) for i, f in enumerate(schedule.faults)}
    return Judgement(verdict, counts, unfired, exercise)
