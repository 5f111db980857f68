"""Generate a large, valid history and time the checkers on it.

The history is what a long run of the reference worker records, repeated over many instances: each
step is claimed, called, its receipt recorded and committed by one worker; every 7th step is taken
over after its first worker was killed after its call (a stale commit refused, the receipt found at
the downstream); every 23rd step hangs with its heartbeat alive and is flagged within the bound;
every 31st instance holds a checkpoint that had to be refused (its first step goes to manual review);
every 11th instance reuses a key with another intent and gets 422. So every checker has something to
judge, and a valid history makes each of them walk all of it.

    python benchmarks/large_history.py [--events 1000000] [--repeat 1]

Prints the events generated, the time to build the History, the time each checker takes, the total
(wall and CPU time: on a shared machine the CPU time is the steadier figure), and the peak resident
memory of the process (``ru_maxrss``) after building and after judging.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import resource
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from killpoint.harness.checkers import ALL, check_all  # noqa: E402
from killpoint.harness.history import History, StepConfig, build  # noqa: E402

STEPS = ("reserve", "charge", "ship")
RESOURCES = {"reserve": "inventory", "charge": "payment", "ship": "shipping"}
MS = 1_000_000
STUCK_BOUND_MS = 60_000.0


def generate(events: int) -> History:
    """A valid history of about ``events`` events (a whole number of instances)."""
    raw: list[tuple[int, str, str, str, dict[str, Any]]] = []
    steps: list[StepConfig] = []
    final: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    t = 0
    n = 0
    op = 0
    spawned = 0

    def add(process: str, kind: str, type_: str, **data: Any) -> None:
        nonlocal t
        t += 1000  # one microsecond apart
        raw.append((t, process, kind, type_, data))

    def worker_op(w: str, kind: str, ok: str = "ok", **data: Any) -> None:
        nonlocal op
        op += 1
        add(w, kind, "invoke", op=op, **data)
        add(w, kind, ok, op=op, **data)

    while len(raw) < events:
        n += 1
        inst = f"order-{n}"
        refused = n % 31 == 0
        checkpoints.append({"instance": inst, "outcome": "refused" if refused else "ok",
                            "reason": "integrity hash mismatch" if refused else None})
        for step in STEPS:
            resource = RESOURCES[step]
            key = f"{inst}:{step}:{resource}-v1"
            steps.append(StepConfig(inst, step, resource, key, max_attempts=3))
            add("store", "created", "event", instance=inst, step=step, to_state="pending",
                state_version=1, lease_version=0, attempt=0)
        for idx, step in enumerate(STEPS):
            resource = RESOURCES[step]
            key = f"{inst}:{step}:{resource}-v1"
            sid = {"instance": inst, "step": step}
            n_step = n * len(STEPS) + idx
            a = f"W{spawned % 4}"
            add("store", "claimed", "event", **sid, worker=a, from_state="pending", to_state="running",
                state_version=2, fence=1, lease_version=1, attempt=1)
            worker_op(a, "claim", **sid, fence=1)
            if refused:
                add("store", "committed", "event", **sid, worker=a, from_state="running",
                    to_state="manual_intervention", state_version=3, fence=1, lease_version=1, attempt=1)
                final.append({**sid, "state": "manual_intervention", "state_version": 3, "attempt": 1,
                              "lease_version": 1, "owner_worker": None})
                break  # nothing after a step in manual review runs
            meta = {**sid, "worker": a, "attempt": 1, "direction": "forward"}
            ihash = f"h{n_step}"
            if n_step % 23 == 0:  # a hang with the heartbeat alive, flagged within the bound
                add(a, "point", "event", point="before_call", **sid, hit=1, action="hang")
                t += int(STUCK_BOUND_MS * MS)
                add("store", "stuck_flagged", "event", **sid, worker="W9", state_version=2,
                    lease_version=1, from_state="running", stuck_owner=a, idle_ms=STUCK_BOUND_MS)
                add("harness", "kill", "event", worker=a, pid=spawned, signal="SIGKILL", reason="quiescent")
                spawned += 1
                b = f"W{spawned % 4}"
                add("store", "claimed", "event", **sid, worker=b, from_state="running", to_state="running",
                    state_version=3, fence=2, lease_version=2, attempt=2)
                worker_op(b, "claim", **sid, fence=2)
                meta = {**sid, "worker": b, "attempt": 2, "direction": "forward"}
                worker_op(b, "call", **sid, resource=resource, key=key, intent_hash=ihash, fence=2,
                          attempt=2, direction="forward")
                add("downstream", "request", "event", seq=len(raw), resource=resource, key=key,
                    scope=f"{inst}:{step}", fence=2, intent_hash=ihash, params={"n": n_step}, meta=meta,
                    status=200, outcome="applied", applied=True)
                fence, sv, w, attempt = 2, 3, b, 2
            elif n_step % 7 == 0:  # killed after its call; B takes over and finds the receipt
                worker_op(a, "call", **sid, resource=resource, key=key, intent_hash=ihash, fence=1,
                          attempt=1, direction="forward")
                add("downstream", "request", "event", seq=len(raw), resource=resource, key=key,
                    scope=f"{inst}:{step}", fence=1, intent_hash=ihash, params={"n": n_step}, meta=meta,
                    status=200, outcome="applied", applied=True)
                add(a, "point", "event", point="after_call", **sid, hit=1, action="kill")
                add("harness", "exit", "event", worker=a, pid=spawned, code=-9, signal="SIGKILL")
                spawned += 1
                b = f"W{spawned % 4}"
                add("store", "claimed", "event", **sid, worker=b, from_state="running", to_state="running",
                    state_version=3, fence=2, lease_version=2, attempt=2)
                worker_op(b, "claim", **sid, fence=2)
                add(b, "recover", "event", **sid, fence=2, source="downstream", receipt="succeeded",
                    action="record_completion")
                add("store", "commit_rejected", "event", **sid, worker=a, from_state="running",
                    to_state="succeeded", state_version=3, fence=1, lease_version=2, attempt=1)
                fence, sv, w, attempt = 2, 3, b, 2
            else:
                worker_op(a, "call", **sid, resource=resource, key=key, intent_hash=ihash, fence=1,
                          attempt=1, direction="forward")
                add("downstream", "request", "event", seq=len(raw), resource=resource, key=key,
                    scope=f"{inst}:{step}", fence=1, intent_hash=ihash, params={"n": n_step}, meta=meta,
                    status=200, outcome="applied", applied=True)
                if n % 11 == 0 and idx == 0:  # the same key with another intent: 422
                    add("downstream", "request", "event", seq=len(raw), resource=resource, key=key,
                        scope=f"{inst}:{step}", fence=1, intent_hash=ihash + "x", params={"n": -1},
                        meta=meta, status=422, outcome="conflict", applied=False)
                fence, sv, w, attempt = 1, 2, a, 1
            worker_op(w, "receipt", **sid, key=key, status="succeeded")
            add("store", "receipt_recorded", "event", **sid, worker=w, fence=fence, key=key,
                status="succeeded")
            worker_op(w, "commit", **sid, to_state="succeeded", fence=fence)
            add("store", "committed", "event", **sid, worker=w, from_state="running", to_state="succeeded",
                state_version=sv + 1, fence=fence, lease_version=fence, attempt=attempt)
            final.append({**sid, "state": "succeeded", "state_version": sv + 1, "attempt": attempt,
                          "lease_version": fence, "owner_worker": None})
        if refused:  # the steps after the refused one stay pending, held by manual review
            for step in STEPS[1:]:
                final.append({"instance": inst, "step": step, "state": "pending", "state_version": 1,
                              "attempt": 0, "lease_version": 0, "owner_worker": None})
    return build(raw, steps=tuple(steps), final=tuple(final), checkpoints=tuple(checkpoints),
                 schedule="generated", quiescent=True, stuck_bound_ms=STUCK_BOUND_MS,
                 stuck_slack_ms=40_000.0)


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="judge the same history this many times")
    args = parser.parse_args()
    if args.events < 1:
        print(f"--events: {args.events}: must be at least 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    history = generate(args.events)
    t_build = time.perf_counter() - t0
    built_peak = _max_rss_mib()
    gc.collect()
    print(f"history: {len(history.events)} events, {len(history.steps)} steps; generated and built "
          f"in {t_build:.2f} s")
    best: dict[str, float] = {}
    total_best = float("inf")
    for _ in range(args.repeat):
        round_total = 0.0
        for name, checker in ALL.items():
            t = time.perf_counter()
            result = checker(history)
            dt = time.perf_counter() - t
            round_total += dt
            best[name] = min(best.get(name, float("inf")), dt)
            if result.valid is not True:
                print(f"{name} did not find the generated history valid: {result.detail} "
                      f"{[v.detail for v in result.violations[:3]]}", file=sys.stderr)
                return 1
        total_best = min(total_best, round_total)
    t, cpu = time.perf_counter(), time.process_time()
    verdict = check_all(history)
    t_all, cpu_all = time.perf_counter() - t, time.process_time() - cpu
    if verdict.valid is not True:
        print(f"check_all: {verdict.unknown_reasons or verdict.violations[:3]}", file=sys.stderr)
        return 1
    for name, dt in best.items():
        print(f"  {name:<24} {dt * 1000:9.1f} ms")
    print(f"check_all: {t_all:.2f} s wall, {cpu_all:.2f} s CPU, "
          f"{len(history.events) / t_all / 1e6:.2f} M events/s (sum of the best checker times "
          f"{total_best:.2f} s)")
    print(f"peak resident memory: {built_peak:.0f} MiB after building, {_max_rss_mib():.0f} MiB after "
          f"judging")
    return 0


if __name__ == "__main__":
    sys.exit(main())
