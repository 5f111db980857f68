"""``effects_match_intent``: what an applied effect did, against what its step declared.

The other effect invariants count effects (one per intent, each accounted for); this one reads
them. Every effect the downstream applied (its ledger's ``params``) must carry the parameters its
step declared: the workload's, or what the target's own ``intent(instance, step)`` hook gave
(``StepConfig.params``). A compensation's declared intent is the step's own plus the key it undoes
(``{"undo": key, **params}``, ``StepConfig.compensation_params``). A charge replayed on recovery
with another amount is a bug even under the right key, and only this invariant sees it.

Judged only where the workload declares parameters: a step whose ``params`` is ``None`` (or empty)
declares no intent, and its effects are passed over; a history with no such step at all is not
applicable. Pure, as every checker: it reads the history and nothing else.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.history import History, StepConfig

NAME = "effects_match_intent"
COMPENSATION = "compensation"


def canonical(params: Any) -> Any:
    """Parameters as the downstream keeps them (JSON: tuples are lists, keys are strings), so that
    a declared ``(1, 2)`` equals an applied ``[1, 2]``; what JSON cannot carry stays as it is."""
    try:
        return json.loads(json.dumps(params, sort_keys=True))
    except (TypeError, ValueError):
        return params


def declared(config: StepConfig, direction: str) -> Mapping[str, Any] | None:
    """The parameters ``config`` declares for an effect in ``direction`` (None: it declares none)."""
    if direction == COMPENSATION:
        return config.compensation_params or None
    return config.params or None


def _differences(expected: Mapping[str, Any], applied: Any) -> str:
    """The parameters that differ, named one by one (at most five), or the two whole values."""
    if not isinstance(applied, Mapping):
        return f"expected {json.dumps(expected, sort_keys=True)}, applied {applied!r:.200}"
    names = sorted(set(expected) | set(applied), key=str)
    missing = object()
    diffs = [f"{n}: expected {_shown(expected.get(n, missing), missing)}, "
             f"applied {_shown(applied.get(n, missing), missing)}"
             for n in names if expected.get(n, missing) != applied.get(n, missing)]
    more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
    return "; ".join(diffs[:5]) + more


def _shown(value: Any, missing: object) -> str:
    return "nothing" if value is missing else json.dumps(value, sort_keys=True)[:120]


def effects_match_intent(history: History) -> Result:
    """Every applied effect's parameters equal its step's declared intent."""
    configs = [s for s in history.steps if s.params or s.compensation_params]
    if not configs:
        return Result(NAME, True, False, (), "not applicable: the workload declares no parameters",
                      applicable=False)
    judged = 0
    violations = []
    for e in history.effects():
        meta = e.meta
        instance, step = meta.instance, meta.step
        config = history.step_config(instance, step) if instance is not None and step is not None else None
        direction = e.direction
        expected = declared(config, direction) if config is not None else None
        if expected is None:
            continue  # a step that declares nothing, or an effect no step claims (effects_accounted's)
        judged += 1
        expected, applied = canonical(dict(expected)), canonical(e.params)
        if applied != expected:
            what = f"{direction} effect under key {e.key!r}" if e.key is not None \
                else f"{direction} effect on legacy resource {e.resource!r}"
            violations.append(Violation(
                NAME, instance, step,
                f"the {what} (event {e.index}, attempt {'?' if meta.attempt is None else meta.attempt}, worker "
                f"{meta.worker or '?'}) applied other parameters than its step declared: "
                f"{_differences(expected, applied)}",
                (e.index,)))
    if violations:
        return Result(NAME, False, True, tuple(violations), f"{len(violations)} violation(s)")
    if not judged:
        return Result(NAME, True, False, (), "no applied effect of a step that declares parameters")
    return Result(NAME, True, True, (), f"{judged} applied effect(s) match their declared intent")


__all__ = ["NAME", "canonical", "declared", "effects_match_intent"]
