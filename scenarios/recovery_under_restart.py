"""Recovery under restarts: the store and the payment provider go down while a crash is recovered.

Three orders, each ``reserve`` then ``charge``. Worker A works through them alone; on order-3 it
charges the card (key K3 = ``order-3:charge:payment-v1``, fence 1) and is killed before it can
write the receipt: the dangerous window, with one step to recover. One worker at a time replaces
the last, so every run tells the same story.

1. B replaces A. Once A's lease has expired B claims order-3's charge (fence 2), and at that very
   moment the store restarts. What a restart does to its clients is cut every connection, and
   that is what happens, on either store, by ending every process that holds one (SQLite has no
   server process: it lives inside its clients, and recovers from its write-ahead log when the
   harness reopens its handle; a PostgreSQL server is shared with others and stays up, its
   committed rows as a restart would leave them). B is killed in the middle of its recovery,
   holding a lease, and the harness closes and reopens its own handle.
2. C replaces B. B's claim survived the restart (it was committed), so C must wait for B's lease
   and then claims with fence 3. At that moment the payment provider restarts: its process is
   killed and a new one, on the same durable ledger, listens on the same port.
3. C asks the restarted provider what happened under K3, over a connection to the address it was
   given at its start. The ledger survived, so the answer is the charge A made: C records the
   completion and commits with fence 3. No charge is repeated, and every order ends ``succeeded``.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.events import DownstreamRestart, Request, StoreEvent, StoreRestart, WorkerEvent
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.workload import InstanceSpec, Workload, default_workload
from killpoint.scenarios._story import Story, config, typed, who

STEP = "charge"
STORE_RESTART = f"B@{STEP}.after_claim:1*pause"
DOWNSTREAM_RESTART = f"C@{STEP}.after_claim:1*pause"


def workload(seed: int) -> Workload:
    """Three orders with the default workload's data, each ``reserve`` then ``charge``."""
    base = default_workload(seed)
    picked = [i for i in base.instances if i.data.get("kind") != "declined"][:3]
    instances = tuple(InstanceSpec(f"order-{n}", (i.step("reserve"), i.step(STEP)), i.data)
                      for n, i in enumerate(picked, start=1))
    return Workload("three-orders", instances, {"inventory": {"legacy": False, "fencing": True},
                                                "payment": {"legacy": False, "fencing": True}})


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("recovery_under_restart")
    wl = workload(seed)
    last = wl.instances[-1]
    key = last.step(STEP).key(last.id)
    schedule = f"A@{STEP}.after_call#{len(wl.instances)}:kill,{STORE_RESTART},{DOWNSTREAM_RESTART}"
    url, address = session.downstream.url, session.downstream.address
    h = story.run(session, config(target, seed, store, schedule, workload=wl.name, workload_spec=wl,
                                  workers=1, same_identity=0.0,
                                  restarts={STORE_RESTART: ("store",), DOWNSTREAM_RESTART: ("downstream",)}),
                  f"A is killed in {last.id}'s dangerous window; the store restarts under B, the "
                  f"provider under C", [(last.id, STEP)]).history

    first = [e for e in typed(h.requests(key=key), Request) if e.meta.worker == "A"]
    story.expect(len(first) == 1 and first[0].applied and first[0].fence == 1,
                 f"A's charge of {last.id} (fence 1) was applied before A was killed",
                 who(first, "status", "outcome", "fence"))
    restarts = typed(h.harness_events(vocab.STORE_RESTART), StoreRestart)
    story.expect(len(restarts) == 1 and restarts[0].killed == ["B"],
                 "the store restarted right after B's claim, cutting B (and its connections) off",
                 who(restarts, "killed"))
    claims = typed(h.store_events(last.id, STEP, vocab.CLAIMED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in claims] == [("A", 1), ("B", 2), ("C", 3)],
                 "B's claim (fence 2) survived the restart: C had to claim with fence 3",
                 who(claims, "worker", "fence"))
    moved = typed(h.harness_events(vocab.DOWNSTREAM_RESTART), DownstreamRestart)
    story.expect(len(moved) == 1 and moved[0].pid != moved[0].pid_before
                 and moved[0].address == address and session.downstream.address == address
                 and session.downstream.url == url,
                 "the provider restarted as a new process on the same address",
                 who(moved, "pid_before", "pid", "address"))
    evidence = typed(h.worker_events(vocab.RECOVER, process="C", step=STEP), WorkerEvent)
    story.expect(len(evidence) == 1 and moved and evidence[0].time > moved[0].time
                 and evidence[0].source == "downstream" and evidence[0].receipt == "succeeded"
                 and evidence[0].action == "record_completion",
                 "C got A's charge from the restarted provider, by its key, and recorded completion",
                 who(evidence, "source", "receipt", "action"))
    commits = typed(h.store_events(last.id, STEP, vocab.COMMITTED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in commits] == [("C", 3)],
                 "C's commit with fence 3 was accepted", who(commits, "worker", "fence"))
    stranded = [f"{r['instance']}:{r['step']} {r['state']}" for r in h.final if r["state"] != "succeeded"]
    story.expect(not stranded, "no instance stranded: every step of every order succeeded",
                 ", ".join(stranded))
    per_step = {(i.id, s.name): len(h.applied(instance=i.id, step=s.name))
                for i in wl.instances for s in i.steps}
    twice = {f"{i}:{s}": n for (i, s), n in per_step.items() if n != 1}
    story.expect(not twice, "nothing duplicated: exactly one applied effect per step",
                 ", ".join(f"{k} x{n}" for k, n in twice.items()))
    story.conclude("restarts of the store and of the provider cut a recovery short twice; the "
                   "durable lease, the durable ledger and the stable key let the next worker finish it "
                   "with one charge.")
    return story
