"""The dangerous window: the side effect committed, the local state did not.

Worker A claims the charge of order-1 (fence 1) and sends it to the payment provider with the
step's idempotency key K = ``order-1:charge:payment-v1``. The provider charges the card and answers;
A is killed (SIGKILL) right after, before it wrote a receipt or the step's new state. Looking only
at the workflow's state, the step is unfinished: ``running``, under a lease nobody renews.

One worker, B, replaces A (one at a time, so the story is the same on every run). Once A's lease
has expired B claims the step with fence 2 and, before doing anything, establishes what happened:
no local receipt, so it asks the provider for the receipt stored under K. The provider has one
(the charge succeeded), so recovery's decision table answers ``record_completion``: B records the
receipt and commits ``succeeded`` with fence 2, without calling again.

What this shows is not exactly-once delivery but no duplicate of one logical side effect, within
the provider's durable idempotency records: the key is stable across retries (never a random
request id), and the provider keeps the intent's hash and its outcome under it.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.events import PointHit, Request, StoreEvent, WorkerEvent
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.workload import WORKLOADS
from killpoint.scenarios._story import Story, config, typed, who

INSTANCE, STEP = "order-1", "charge"


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("dangerous_window")
    key = WORKLOADS["single"](seed).instance(INSTANCE).step(STEP).key(INSTANCE)
    result = story.run(session, config(target, seed, store, f"A@{STEP}.after_call:kill",
                                       workload="single", workers=1, same_identity=0.0),
                       f"A charges order-1 with key {key} and is killed before it records anything; "
                       f"B recovers", [(INSTANCE, STEP)])
    h = result.history

    first = [e for e in typed(h.requests(key=key), Request) if e.meta.worker == "A"]
    story.expect(len(first) == 1 and first[0].applied and first[0].fence == 1,
                 f"A's call with key {key} and fence 1 applied the charge",
                 who(first, "status", "outcome", "fence"))
    a_writes = [e for e in typed(h.store_events(INSTANCE, STEP, vocab.RECEIPT_RECORDED, vocab.COMMITTED,
                                              "commit_rejected"), StoreEvent) if e.worker == "A"]
    kill = [e for e in typed(h.worker_events(vocab.POINT, process="A", step=STEP), PointHit)
            if e.action == vocab.KILL]
    story.expect(kill and kill[0].point == "after_call" and not a_writes,
                 "A was killed after the call, before it wrote a receipt or a commit",
                 who([*kill, *a_writes], "point", "worker", "fence"))
    claims = typed(h.store_events(INSTANCE, STEP, vocab.CLAIMED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in claims] == [("A", 1), ("B", 2)],
                 "A claimed with fence 1, then B with fence 2", who(claims, "worker", "fence"))
    evidence = typed(h.worker_events(vocab.RECOVER, process="B", step=STEP), WorkerEvent)
    story.expect(len(evidence) == 1 and evidence[0].source == "downstream"
                 and evidence[0].receipt == "succeeded"
                 and evidence[0].action == "record_completion",
                 "B found the receipt under the key at the downstream and chose record_completion",
                 who(evidence, "source", "receipt", "action"))
    b_calls = h.worker_events(vocab.CALL, process="B", type="invoke", step=STEP)
    story.expect(not b_calls, "B did not call the provider again", who(b_calls, "key", "fence"))
    commits = typed(h.store_events(INSTANCE, STEP, vocab.COMMITTED), StoreEvent)
    story.expect([(c.worker, c.fence, c.to_state) for c in commits]
                 == [("B", 2, "succeeded")],
                 "B's commit with fence 2 (succeeded) was accepted",
                 who(commits, "worker", "fence", "to_state"))
    effects = typed(h.applied(instance=INSTANCE, step=STEP), Request)
    story.expect(len(effects) == 1 and effects[0].key == key,
                 f"exactly one applied effect for the charge, under {key}",
                 f"{len(effects)} applied: " + who(effects, "key", "fence"))
    story.conclude(f"{INSTANCE}:{STEP} ended {h.final_state(INSTANCE, STEP)} with one applied effect: "
                   f"recovery recorded the outcome it found under the key; it did not redo it.")
    return story
