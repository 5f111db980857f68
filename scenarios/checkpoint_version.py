"""Checkpoints a new deployment must not trust blindly: an old definition, a corrupt row, a forgery.

The order workflow's definition moved from version 1 to version 2: the instance data now keeps the
amount as ``{"value", "currency"}`` instead of ``amount_cents``. Version 2 of the code is deployed
while the store still holds instances written by version 1. Before a worker runs any step of an
instance it verifies the stored checkpoint (``ReferenceWorker.load_instance``, the pure
:func:`harness.checkpoint.verify`): format version, integrity hash, definition fingerprint.

1. The v2 deployment has the v1 -> v2 migration registered. order-1 (written by v2) is read as is;
   order-2 (written by v1) is upgraded by the migration and runs; order-3's row was damaged after it
   was written (its data no longer matches its hash) and is refused: its step goes to
   ``manual_intervention`` with the reason, and the downstream never hears of it.
2. The same v1 checkpoint, read by a deployment with no migration registered: the code cannot
   read that definition, so the step goes to manual review rather than run with a guess.
3. A deployment with an HMAC key. order-4's amount was changed by someone who also recomputed the
   plain hash, which anyone can: without a key that forgery passes (the scenario shows it), with
   the key it is refused, because only the key's holder can make a valid HMAC. An integrity hash
   catches accidents; only a MAC (or a signature) authenticates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from killpoint import vocab
from killpoint.harness import checkpoint
from killpoint.harness.checkpoint import Migration, Migrations, Policy
from killpoint.harness.events import StoreEvent, WorkerEvent
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.workload import CheckpointedWorkload, InstanceSpec, default_workload
from killpoint.scenarios._story import Story, config, typed, who

STEP = "charge"
RESOURCES = {"payment": {"legacy": False, "fencing": True}}


def _upgrade_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 keeps the amount with its currency; version 1 kept cents only (always EUR)."""
    out = {k: v for k, v in data.items() if k != "amount_cents"}
    out["amount"] = {"value": data["amount_cents"], "currency": "EUR"}
    return out


def definitions(seed: int, n: int) -> tuple[InstanceSpec, InstanceSpec]:
    """Order ``order-n`` as the v1 code wrote it and as the v2 code defines it (one charge)."""
    base = default_workload(seed).instances[0]
    charge = base.step(STEP)
    amount = int(charge.params["amount"]) + 100 * n
    common = {"customer": base.data["customer"], "email": base.data["email"],
              "card": charge.params["card"]}
    steps = (dataclasses.replace(charge, params={**charge.params, "amount": amount}),)
    v1 = InstanceSpec(f"order-{n}", steps, {**common, "amount_cents": amount}, "order", 1)
    v2 = InstanceSpec(f"order-{n}", steps, _upgrade_v1_to_v2(v1.data), "order", 2)
    return v1, v2


def migrations(seed: int) -> Migrations:
    """What the v2 code registers: it knows how to read order v1."""
    v1, v2 = definitions(seed, 2)
    return Migrations().register(Migration.between(v1, v2, _upgrade_v1_to_v2))


def hmac_key(seed: int) -> bytes:
    return hashlib.sha256(f"killpoint-scenario-key-{seed}".encode()).digest()


def corrupt(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its data changed after the hash was taken (a torn write, a bad disk)."""
    return checkpoint.corrupt(row, ("amount", "value"))


def forge(spec: InstanceSpec) -> dict[str, Any]:
    """The row with the amount lowered to one cent and the plain hash recomputed, as anyone can."""
    data = {**spec.data, "amount": {"value": 1, "currency": "EUR"}}
    return checkpoint.checkpoint_row(spec, data)


def version_answer(seed: int) -> list[str]:
    """What happens to a checkpoint whose definition version this code cannot read as is: the
    same pure verification the workers run, with and without a registered migration."""
    v1, v2 = definitions(seed, 2)
    row = checkpoint.checkpoint_row(v1)
    out = [f"order-2 stored by v1 code (fingerprint {v1.fingerprint}), read by v2 code "
           f"(fingerprint {v2.fingerprint}):"]
    for label, policy in (("with the v1 -> v2 migration registered", Policy(migrations=migrations(seed))),
                          ("with no migration registered", Policy())):
        loaded = checkpoint.verify(row, v2, policy)
        then = ("the step runs on the upgraded data " + json.dumps(loaded.data, sort_keys=True)
                if loaded.ok else "the worker sends the step to manual_intervention with that reason")
        out.append(f"  {label}: {loaded.outcome} ({loaded.reason}); {then}")
    return out


def _workload(name: str, specs: list[InstanceSpec], policy: Policy,
              stored: dict[str, dict[str, Any]]) -> CheckpointedWorkload:
    return CheckpointedWorkload(name, tuple(specs), RESOURCES, (), policy, stored)


def _refused(story: Story, h, instance: str, because: str, what: str) -> None:
    """The facts of a refused checkpoint: the reason journaled, the step in manual review with the
    reason recorded, no request to the downstream."""
    notes = [e for e in typed(h.worker_events(vocab.CHECKPOINT, instance=instance), WorkerEvent)
             if e.outcome == "refused"]
    story.expect(notes and because in (notes[0].reason or ""),
                 f"{instance}'s checkpoint refused: {what}", who(notes, "outcome", "reason"))
    manual = [e for e in typed(h.store_events(instance, STEP, vocab.COMMITTED), StoreEvent)
              if e.to_state == "manual_intervention"
              and "checkpoint refused" in str(e.reason)]
    story.expect(manual and h.final_state(instance, STEP) == "manual_intervention",
                 f"{instance}:{STEP} went to manual_intervention with the reason recorded",
                 f"final state {h.final_state(instance, STEP)}")
    calls = h.requests(instance=instance, step=STEP)
    story.expect(not calls, f"the downstream never heard of {instance}", who(calls, "status", "outcome"))


def _ran(story: Story, h, instance: str, how: str) -> None:
    story.expect(h.final_state(instance, STEP) == "succeeded", f"{instance} ({how}) ran: {STEP} succeeded",
                 f"final state {h.final_state(instance, STEP)}")


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("checkpoint_version")
    key = hmac_key(seed)
    _, current = definitions(seed, 1)
    old, migrated = definitions(seed, 2)
    _, damaged = definitions(seed, 3)
    _, forged = definitions(seed, 4)
    v1_row = checkpoint.checkpoint_row(old)
    one: dict[str, Any] = {"workers": 1, "same_identity": 0.0}  # one worker: the same narration on every run

    # 1. v2 code with the migration registered; plain hashes.
    wl = _workload("checkpoint-v2", [current, migrated, damaged], Policy(migrations=migrations(seed)),
                   {old.id: v1_row, damaged.id: corrupt(checkpoint.checkpoint_row(damaged))})
    h = story.run(session, config(target, seed, store, workload=wl.name, workload_spec=wl,
                                  **one),
                  "1. v2 code, migration v1 -> v2 registered: order-1 (v2), order-2 (stored by v1), "
                  "order-3 (damaged after it was written)",
                  [(i.id, STEP) for i in wl.instances]).history
    _ran(story, h, current.id, "written by v2")
    notes = [e for e in typed(h.worker_events(vocab.CHECKPOINT, instance=old.id), WorkerEvent)
             if e.outcome == "migrated"]
    story.expect(notes, f"{old.id}'s v1 checkpoint was upgraded by the registered migration",
                 who(h.worker_events(vocab.CHECKPOINT, instance=old.id), "outcome", "reason"))
    _ran(story, h, old.id, "migrated from v1")
    _refused(story, h, damaged.id, "integrity hash mismatch", "its integrity hash does not match")

    # 2. The same v1 checkpoint, no migration registered.
    wl = _workload("checkpoint-v2-no-migration", [migrated], Policy(), {old.id: v1_row})
    h = story.run(session, config(target, seed, store, workload=wl.name, workload_spec=wl,
                                  **one),
                  "2. v2 code, no migration registered: order-2 stored by v1", [(old.id, STEP)]).history
    _refused(story, h, old.id, "no migration is registered", "its definition is one this code cannot read")

    # 3. A deployment with an HMAC key; order-4 forged with a valid plain hash.
    forged_row = forge(forged)
    loose = checkpoint.verify(forged_row, forged, Policy())
    story.say()
    story.say(f"Without a key, order-4's forged checkpoint (amount lowered to 0.01 EUR, plain hash "
              f"recomputed) would pass: {loose.outcome}{' (' + loose.reason + ')' if loose.reason else ''}.")
    story.expect(loose.ok, "the forged checkpoint passes a plain-hash check (a hash is not authentication)",
                 f"{loose.outcome}: {loose.reason}")
    wl = _workload("checkpoint-v2-hmac", [current, forged], Policy(hmac_key=key), {forged.id: forged_row})
    h = story.run(session, config(target, seed, store, workload=wl.name, workload_spec=wl,
                                  **one),
                  "3. v2 code with an HMAC key: order-1 (authenticated), order-4 (forged, plain hash)",
                  [(current.id, STEP), (forged.id, STEP)]).history
    _ran(story, h, current.id, "authenticated with the key")
    _refused(story, h, forged.id, "not authenticated", "it carries no valid HMAC")

    story.say()
    story.say("What happens to a checkpoint whose definition version the code cannot read:")
    for line in version_answer(seed):
        story.say(f"  {line}")
    story.conclude("intact checkpoints ran, the v1 one through its migration; the damaged, the "
                   "unreadable and the forged ones went to manual review with their reasons, and "
                   "none of them reached the payment provider.")
    return story
