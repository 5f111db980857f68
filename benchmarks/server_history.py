"""What reading the server's own record costs a run of a Temporal or Restate target.

    python benchmarks/server_history.py --target restate:keyed [--runs N]
    KILLPOINT_TEMPORAL_ADDRESS=127.0.0.1:7233 python benchmarks/server_history.py --target temporal:keyed

Runs ``A@charge.after_call:kill`` (``run_after_call`` on Restate) N times and prints, per run, the
CPU time of the target's ``history()`` and ``final_states()`` hooks in the harness, and the CPU the
other side spent while they ran: the ``restate-server`` process answering their SQL queries, or
the helper process that holds the Temporal client (which answers from ``done()``'s last reading
once every workflow has closed, so usually nothing). For Temporal it also prints what turning one
``done()`` answer into events costs the helper (each ``done()`` reads every workflow's history;
``--runs`` runs make about 45 calls each), beside what the plain ``done()`` computed from the same
histories before. Process CPU is read from ``/proc`` in clock ticks (10 ms), so the server's figure
is a mean over the runs. The whole run's CPU (harness and reaped children) is printed for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import resource
import statistics
import time
from typing import Any

from killpoint.chaos.points import POINTS as BUILTIN
from killpoint.chaos.schedule import parse
from killpoint.harness.declaration import Target
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.targets import declared


def proc_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="restate:keyed", choices=("restate:keyed", "temporal:keyed"))
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    temporal = args.target.startswith("temporal")
    if temporal:
        from killpoint.harness.servers import temporal_server as module
    else:
        from killpoint.harness.servers import restate as module  # type: ignore[no-redef]
    base = declared(args.target)
    per_run: dict[str, Any] = {"done": 0, "hooks": 0.0, "other": 0.0}
    runs: list[dict[str, Any]] = []

    def other_pid(run: Any) -> int | None:
        if temporal:
            querier = module._querier  # type: ignore[attr-defined]
            return querier[1].proc.pid if querier else None
        return int(run.state["restate"].proc.pid)

    def timed(fn: Any) -> Any:
        def hook(run: Any) -> Any:
            pid = other_pid(run)
            c0, o0 = time.process_time(), proc_cpu(pid) if pid else 0.0
            try:
                return fn(run)
            finally:
                per_run["hooks"] += time.process_time() - c0
                per_run["other"] += (proc_cpu(pid) if pid else 0.0) - o0
        return hook

    def counted_done(run: Any) -> bool:
        per_run["done"] += 1
        return bool(module.done(run))

    hooks = {name: base.hook(name) for name in ("setup", "teardown", "restart")}
    target = Target(base.fn, points=base.points, owns_state=True, workload="plain", name=args.target,
                    done=counted_done, history=timed(module.history), final_states=timed(module.final_states),
                    **{k: v for k, v in hooks.items() if v is not None})
    point = "charge.run_after_call" if not temporal else "charge.after_call"
    schedule = parse(f"A@{point}:kill", points=frozenset(BUILTIN) | frozenset(base.points))
    with Session() as session:
        for _ in range(args.runs):
            per_run.update(done=0, hooks=0.0, other=0.0)
            before = tree_cpu()
            r = session.run(RunConfig(schedule=schedule, target=target))
            if r.valid is not True:
                print(f"run not valid: {r.verdict.unknown_reasons}")
                return 1
            runs.append({**per_run, "run": tree_cpu() - before})
    print(f"{args.runs} runs of {schedule} on {args.target}, load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"history() + final_states(): {statistics.median(r['hooks'] for r in runs) * 1000:.1f} ms in the "
          f"harness (median), {statistics.mean(r['other'] for r in runs) * 1000:.1f} ms in the "
          f"{'Temporal helper' if temporal else 'restate-server'} (mean); a run: "
          f"{statistics.median(r['run'] for r in runs):.2f} s of CPU (harness and reaped children, median)")
    if temporal:
        print(f"done() calls per run: {statistics.median(r['done'] for r in runs):.0f} (median)")
        asyncio.run(_compaction(module))
    return 0


async def _compaction(module: Any) -> None:
    """One done() answer's events for the last run's three workflows: the helper's added work."""
    from temporalio.client import Client

    from killpoint.harness.servers.temporal_server import address

    client = await Client.connect(address())
    ids = [w.id async for w in client.list_workflows("WorkflowType='order'", limit=3)]
    read = [(await client.get_workflow_handle(w).fetch_history(), await client.get_workflow_handle(w).describe())
            for w in ids]

    def events() -> Any:
        return [module._compact(h, d) for h, d in read]

    def completed() -> Any:  # what done() computed from the same histories before history() existed
        out = []
        for history, _ in read:
            scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_id
                         for e in history.events if e.HasField("activity_task_scheduled_event_attributes")}
            out.append([scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
                        for e in history.events if e.HasField("activity_task_completed_event_attributes")])
        return out

    for name, fn in (("events for history()", events), ("completed activity ids (before)", completed)):
        start = time.process_time()
        for _ in range(1000):
            pickle.loads(pickle.dumps(fn()))  # the answer crosses a pipe
        print(f"one done() answer, {name}: {(time.process_time() - start) * 1000:.0f} us "
              f"({sum(len(h.events) for h, _ in read)} history events)")


if __name__ == "__main__":
    raise SystemExit(main())
