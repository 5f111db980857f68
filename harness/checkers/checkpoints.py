"""``checkpoints_honoured``: no worker runs an instance on a checkpoint it had to refuse."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from killpoint import vocab as v
from killpoint.harness.checkers._common import _effect_step, _idx, _result
from killpoint.harness.checkers.base import Result, Violation
from killpoint.harness.events import Request, StoreEvent
from killpoint.harness.history import History
from killpoint.harness.states import SUCCEEDED

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
    proofs: dict[Any, dict[Any, list[StoreEvent | Request]]] = {
        instance: defaultdict(list) for instance in refused}
    for e in history.typed(StoreEvent):
        if e.kind == v.COMMITTED and e.to_state == SUCCEEDED and e.instance in proofs:
            proofs[e.instance][e.step].append(e)
    for r in history.effects():
        instance, step = _effect_step(r)
        if instance in proofs:
            proofs[instance][step].append(r)
    violations: list[Violation] = []
    for instance, verdict in refused.items():
        for step, proof in proofs[instance].items():
            proof.sort(key=lambda e: e.index)
            commits = [e for e in proof if isinstance(e, StoreEvent)]
            effects = [e for e in proof if isinstance(e, Request)]
            what = []
            if commits:
                workers = ", ".join(sorted({str(e.worker) for e in commits}))
                what.append(f"committed to succeeded by {workers}")
            if effects:
                what.append(f"{len(effects)} downstream effect(s) applied")
            violations.append(Violation(
                name, instance, step,
                f"{instance}'s checkpoint had to be refused ({verdict.get('reason')}), yet step "
                f"{step} ran: {'; '.join(what)}", _idx(proof)))
    return _result(name, True, violations, f"{len(refused)} checkpoint(s) had to be refused")
