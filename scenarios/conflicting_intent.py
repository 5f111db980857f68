"""The same key with another amount: a conflict, never the old result dressed up as success.

order-3 of the order workload charges the customer with the step's key
K = ``order-3:charge:payment-v1``. Then the order is amended to a higher amount, and the amendment
step, wrongly, reuses the charge's key and intent version. The payment provider keeps, under K,
the hash of the intent it applied: the amendment's parameters hash differently, so it answers
422 ``intent_conflict`` and applies nothing. Answering with the stored result instead would tell
the worker its new charge happened when the provider really did something else.

1. No crash: the worker takes the 422 as a permanent failure and commits the amendment ``failed``
   with the reason ``intent_conflict`` recorded.
2. The worker is killed right after the 422 reached it, before it recorded anything. The worker
   that recovers the amendment finds a receipt under K, but it is the charge's, for another
   intent: it must not take it as its own. Recovery records the failure; the amendment never
   shows up as succeeded.

Either way the provider applied exactly one effect under K: the original charge.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.events import Request, StoreEvent, WorkerEvent
from killpoint.harness.history import History
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.workload import WORKLOADS
from killpoint.scenarios._story import Story, config, typed, who

CHARGE, AMEND = "charge", "amend"


def _amended(seed: int) -> tuple[str, str]:
    """The id of the amended order and its charge's key."""
    inst = next(i for i in WORKLOADS["orders"](seed).instances if i.data.get("kind") == "amended")
    return inst.id, inst.step(CHARGE).key(inst.id) or ""


def _common(story: Story, h: History, instance: str, key: str) -> None:
    charge = [e for e in typed(h.applied(key=key), Request) if e.meta.step == CHARGE]
    story.expect(len(charge) == 1, f"the charge was applied once under {key}",
                 who(h.requests(key=key), "status", "outcome"))
    asks = typed(h.requests(instance=instance, step=AMEND), Request)
    story.expect(asks and all(e.key == key for e in asks)
                 and {e.intent_hash for e in asks}.isdisjoint({e.intent_hash for e in charge}),
                 "the amendment was sent under the same key with another intent (amount)",
                 who(asks, "key", "intent_hash"))
    story.expect(asks and all(e.status == 422 and e.outcome == "conflict" for e in asks),
                 "every amendment request got 422 intent_conflict, never a success or the old result",
                 who(asks, "status", "outcome"))
    effects = h.applied(key=key)
    story.expect(len(effects) == 1, f"exactly one applied effect under {key}",
                 f"{len(effects)}: " + who(effects, "outcome"))


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("conflicting_intent")
    instance, key = _amended(seed)
    steps = [(instance, CHARGE), (instance, AMEND)]

    h = story.run(session, config(target, seed, store, ""),
                  f"1. {instance} is charged, then amended under the charge's key", steps).history
    _common(story, h, instance, key)
    ends = [e for e in typed(h.store_events(instance, AMEND, vocab.COMMITTED), StoreEvent) if e.to_state == "failed"]
    story.expect(h.final_state(instance, AMEND) == "failed" and ends
                 and ends[-1].reason == "intent_conflict",
                 "the amendment ended failed, with the reason intent_conflict recorded",
                 f"final {h.final_state(instance, AMEND)}; " + who(ends, "to_state", "reason"))

    h = story.run(session, config(target, seed, store, f"A@{AMEND}.after_call:kill"),
                  "2. the worker is killed right after the 422, before it records it", steps).history
    _common(story, h, instance, key)
    evidence = typed(h.worker_events(vocab.RECOVER, instance=instance, step=AMEND), WorkerEvent)
    story.expect(evidence and evidence[-1].receipt == "failed_permanent"
                 and evidence[-1].action == "record_failure",
                 "recovery found the charge's receipt under the key, for another intent, and "
                 "recorded a failure instead of taking it as its own",
                 who(evidence, "source", "receipt", "action"))
    story.expect(h.final_state(instance, AMEND) == "failed",
                 "the amendment ended failed, never succeeded", f"final {h.final_state(instance, AMEND)}")
    story.conclude("a reused key with another amount is a conflict: the provider answered 422 and "
                   "kept its one effect; the workflow recorded a failure, before and after a crash.")
    return story
