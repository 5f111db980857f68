"""The default matrix's time per run against the floor of its own workload, in one run.

For each workload asked (``single``: one charge step, 17 runs; ``orders``: the default workload, 68
runs), rounds alternate: one pass of the matrix (every point of every step killed, and paused past
the lease where a lease is held, as ``killpoint matrix`` runs it), then as many floor rounds, so that
a load drift lands on both sides. Each matrix pass is timed four ways: on the virtual run clock and
with ``--real-time``, each with ``--jobs 1`` and ``--jobs N`` (N the cores).

The floor is what any run of that workload cannot avoid: two forks from this warm process (one
SIGKILLed) and their reaps, the workload's store set-up, one claim, receipt and commit per step on
a fresh store, the reads, the drop, and one loopback HTTP call per step plus the ledger read.

    python benchmarks/matrix.py [--workloads single,orders] [--rounds 2] [--modes virtual,real]
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
from killpoint.chaos.generator import single_fault_schedules  # noqa: E402
from killpoint.harness.jobs import default_jobs  # noqa: E402
from killpoint.harness.run import RunConfig, Session  # noqa: E402
from killpoint.harness.store import open_store  # noqa: E402
from killpoint.harness.workload import WORKLOADS  # noqa: E402

FORK = multiprocess.get_context("fork")


def _suicide() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _exit() -> None:
    os._exit(0)


def floor_once(workload: str, base: str, n: int, url: str) -> float:
    """What one run of ``workload`` cannot avoid (see the module docstring)."""
    wl = WORKLOADS[workload](0)
    t = time.perf_counter()
    for fn in (_suicide, _exit):
        p = FORK.Process(target=fn)
        p.start()
        p.join()
    store = open_store("sqlite", base, f"floor-{n}")
    store.setup(wl.checkpoints())
    client = ds.DownstreamClient(url, f"floor-{workload}-{n}")
    client.configure(wl.downstream_config())
    for row in store.steps():
        claim = store.claim(row["instance"], row["step"], "A", expected_state_version=row["state_version"],
                            from_state=row["state"], to_state="running", ttl_ms=1000)
        if claim is None:
            continue
        spec = wl.instance(row["instance"]).step(row["step"])
        key = spec.key(row["instance"]) or f"{row['instance']}:{row['step']}:floor"
        if spec.resource is not None:
            client.call(spec.resource, key=spec.key(row["instance"]), params=dict(spec.params),
                        meta={"instance": row["instance"], "step": row["step"]})
        store.record_receipt(claim, key, "h", "succeeded", {})
        store.commit(claim, "succeeded")
    store.events()
    store.steps()
    client.ledger()
    client.close()
    store.close()
    store.drop()
    return time.perf_counter() - t


def cpu_seconds(downstream_pid: int) -> float:
    """CPU time so far of this process, its reaped children (workers, runners) and the downstream:
    a pass's CPU, unlike its wall time, hardly moves with the machine's speed drifts and load."""
    t = os.times()
    try:
        with open(f"/proc/{downstream_pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, IndexError, ValueError):
        ticks = 0.0
    return t.user + t.system + t.children_user + t.children_system + ticks


def matrix_configs(workload: str, virtual: bool) -> list[RunConfig]:
    steps = WORKLOADS[workload](0).step_names
    points = chaos.DEFAULT_POINTS
    schedules = single_fault_schedules(steps, points, ("kill", "pause"), points)
    return [RunConfig(schedule=s, workload=workload, virtual_time=virtual) for s in schedules]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="single,orders")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="virtual,real", help="virtual, real or both")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="N for the --jobs N passes")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    jobs = sorted({1, max(1, args.jobs)})
    print(f"matrix per run against the floor of its workload; {args.rounds} interleaved rounds; "
          f"jobs {', '.join(map(str, jobs))} on {default_jobs()} cores")
    print(f"{'workload':<9} {'clock':<8} {'jobs':>4} {'runs':>5} {'pass':>8} {'per run':>9} "
          f"{'floor':>8} {'ratio':>6} {'cpu/run':>8}  verdict")
    # The floor's files go where the runs' go (the session's folder: memory when the machine has it).
    with Session() as session, tempfile.TemporaryDirectory(dir=session.base_dir) as base:
        url = session.downstream.url
        for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
            floor_once(workload, base, -1, url)  # warm up
            times: dict[tuple[str, int], list[float]] = {}
            cpus: dict[tuple[str, int], list[float]] = {}
            floors: list[float] = []
            verdicts: dict[tuple[str, int], set] = {}
            n = 0
            for _ in range(args.rounds):
                for mode in modes:
                    configs = matrix_configs(workload, mode == "virtual")
                    for j in jobs:
                        c, t = cpu_seconds(session.downstream.pid), time.perf_counter()
                        results = list(session.run_many(configs, jobs=j))
                        times.setdefault((mode, j), []).append(time.perf_counter() - t)
                        cpus.setdefault((mode, j), []).append(cpu_seconds(session.downstream.pid) - c)
                        verdicts.setdefault((mode, j), set()).update(r.valid for r in results)
                        for _ in configs:  # as many floor rounds as runs, interleaved with the passes
                            n += 1
                            floors.append(floor_once(workload, base, n, url))
            floor = statistics.median(floors)
            runs = len(matrix_configs(workload, True))
            for (mode, j), ts in times.items():
                best = min(ts)
                word = "valid" if verdicts[(mode, j)] == {True} else f"{sorted(map(str, verdicts[(mode, j)]))}"
                cpu = statistics.median(cpus[(mode, j)]) / runs
                print(f"{workload:<9} {mode:<8} {j:>4} {runs:>5} {best:7.2f}s {best / runs * 1000:7.1f}ms "
                      f"{floor * 1000:6.1f}ms {best / runs / floor:5.1f}x {cpu * 1000:6.1f}ms  {word}")
    print("pass: the fastest of the rounds for the whole matrix; per run: pass / runs; floor: median; "
          "cpu/run: the median pass's CPU time (harness, workers, runners, downstream) / runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
