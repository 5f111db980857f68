"""Measure a single-crash scenario against its floor on this machine, in one run.

The scenario: one order with one charge step, worker A killed at ``charge.after_call``, worker B
recovering it (lease takeover, receipt lookup, commit), then the whole history judged.

The floor is what such a scenario cannot avoid: two forks from this warm process with a SIGKILL and
reaps, the scenario's SQLite transactions on a fresh WAL file, and its loopback HTTP calls. The
scenario also waits for A's lease to expire (database time), so its lease is set short here.

    python benchmarks/bench.py [--runs 40] [--pg postgresql://postgres@127.0.0.1:5432/test]

It measures on SQLite and, when the PostgreSQL server answers (``--pg``, default the local one),
on PostgreSQL beside it, each against its own floor.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import multiprocess  # noqa: E402

from killpoint import chaos  # noqa: E402
from killpoint.harness import downstream as ds  # noqa: E402
from killpoint.harness.run import RunConfig, Session  # noqa: E402
from killpoint.harness.store import InvalidStore, check_store, open_store  # noqa: E402
from killpoint.harness.worker import Timing  # noqa: E402
from killpoint.harness.workload import single_step_workload  # noqa: E402

FORK = multiprocess.get_context("fork")
TIMING = Timing(lease_ttl_ms=8.0, heartbeat_ms=3.0, stuck_bound_ms=300.0, poll_ms=1.0)


def _suicide() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _exit() -> None:
    os._exit(0)


def floor_once(base: str, n: int, url: str, store_spec: str) -> float:
    """Two forks (one SIGKILLed), the scenario's store transactions and HTTP calls."""
    t = time.perf_counter()
    for fn in (_suicide, _exit):
        p = FORK.Process(target=fn)
        p.start()
        p.join()
    store = open_store(store_spec, base, f"floor-{n}")
    store.setup(single_step_workload(0).checkpoints())
    row = store.steps()[0]
    a = store.claim("order-1", "charge", "A", expected_state_version=row["state_version"],
                    from_state="pending", to_state="running", ttl_ms=0)
    b = store.claim("order-1", "charge", "B", expected_state_version=a.state_version,
                    from_state="running", to_state="running", ttl_ms=1000) or a
    store.record_receipt(b, "k", "h", "succeeded", {})
    store.commit(b, "succeeded")
    store.events()
    store.steps()
    store.close()
    store.drop()
    client = ds.DownstreamClient(url, f"floor-{n}-{store_spec[:8]}")
    client.configure({"resources": {"payment": {"legacy": False, "fencing": True}}})
    client.call("payment", key="k", params={"amount": 1}, meta={"instance": "order-1", "step": "charge"},
                fence=1, fence_scope="order-1:charge")
    client.receipt("k")
    client.ledger()
    client.close()
    return time.perf_counter() - t


def measure(store: str, runs: int) -> tuple[list[float], list[float], int]:
    schedule = chaos.parse("A@charge.after_call:kill")
    config = RunConfig(schedule=schedule, workload="single", workers=2, store=store, timing=TIMING,
                       same_identity=0.0)
    with Session() as session, tempfile.TemporaryDirectory(dir=session.base_dir) as base:
        for n in range(3):  # warm up
            session.run(config)
            floor_once(base, -1 - n, session.downstream.url, store)
        times, fired = [], 0
        for _ in range(runs):
            t = time.perf_counter()
            result = session.run(config)
            times.append(time.perf_counter() - t)
            if result.valid is not True:
                raise SystemExit(f"run {result.run_id} on {store} was not valid: "
                                 f"{result.verdict.unknown_reasons or result.verdict.violations}")
            fired += result.fired[str(schedule)]
        floors = [floor_once(base, n, session.downstream.url, store) for n in range(runs)]
    return times, floors, fired


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="a PostgreSQL URL to measure beside SQLite ('' to skip)")
    args = parser.parse_args()
    stores = ["sqlite"]
    if args.pg:
        try:
            check_store(args.pg)
            stores.append(args.pg)
        except InvalidStore as exc:
            print(f"skipping PostgreSQL: {exc}", file=sys.stderr)
    print(f"single-crash scenario (one charge, A killed at after_call, B recovers; lease ttl "
          f"{TIMING.lease_ttl_ms:g} ms), {args.runs} runs per store")
    print(f"{'store':<12} {'scenario':>10} {'p90':>8} {'floor':>8} {'ratio':>7} {'fired':>7}")
    for store in stores:
        times, floors, fired = measure(store, args.runs)
        scenario, floor = statistics.median(times), statistics.median(floors)
        p90 = sorted(times)[int(0.9 * len(times))]
        name = "sqlite" if store == "sqlite" else "postgresql"
        print(f"{name:<12} {scenario * 1000:8.1f}ms {p90 * 1000:6.1f}ms {floor * 1000:6.1f}ms "
              f"{scenario / floor:6.2f}x {fired:>3}/{args.runs}")
    print("floor: two forks with a SIGKILL and reaps, the scenario's store transactions (set-up, two "
          "claims, receipt, commit, reads, drop) and its loopback HTTP calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
