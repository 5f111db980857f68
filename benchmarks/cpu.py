"""The CPU a matrix run costs (user + system of the whole process tree) against the CPU of its floor.

CPU, not wall time, is what this measures: on a shared or loaded machine a run's wall time moves
with everybody else's work, its CPU much less. Every figure is ``getrusage`` of this process
(RUSAGE_SELF, the harness) plus RUSAGE_CHILDREN (every process it reaped: the workers, their spares,
``--jobs`` runners and the downstream's server), as deltas across a pass. Each pass opens its own
session and closes it, so the downstream (both sides of every HTTP call) is started, stopped and
reaped inside the pass; this process is made a child subreaper, so a process that escaped its
parent would be reaped here at the end of the pass, counted, and named in the output.

Passes, interleaved round by round so that a drift of the machine lands on every side:

- ``session``: a session opened and closed with no run in it (the downstream's start and stop),
  subtracted from the other passes below, whose per-run figures are then (pass - session) / runs;
- ``matrix``: ``killpoint matrix --workload W`` (every point of every step killed, and paused past
  the lease where a lease is held) in one session, ``--jobs`` runs at a time;
- ``floor``: as many rounds as the matrix has runs of what one run of ``single`` cannot avoid: two
  forks from this warm process (``os.fork``), one SIGKILLed, both reaped; the scenario's SQLite
  transactions on a fresh store (set-up, two claims, receipt, commit, reads, drop: 12); its four
  loopback HTTP calls to the session's downstream (configure, call, receipt, ledger), both sides;
- ``command`` (``--command``): the ``killpoint matrix`` command line itself, as a child process,
  Python's start and imports included, divided by the runs.

    python benchmarks/cpu.py [--workloads single] [--rounds 5] [--jobs 1] [--depth 2] [--command]

Prints one line per pass kind and workload: the median CPU per run over the rounds, the spread
(lowest to highest), the harness's and the children's shares, the wall time, and the ratio of the
medians to the floor's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from killpoint import chaos  # noqa: E402
from killpoint.chaos import generator  # noqa: E402
from killpoint.harness import downstream as ds  # noqa: E402
from killpoint.harness.run import RunConfig, Session, run_files_dir  # noqa: E402
from killpoint.harness.targets import declared  # noqa: E402
from killpoint.harness.store import open_store  # noqa: E402
from killpoint.harness.workload import WORKLOADS, single_step_workload  # noqa: E402

_PR_SET_CHILD_SUBREAPER = 36


def cpu() -> tuple[float, float]:
    """(this process's CPU, its reaped children's CPU) so far, user + system, in seconds."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def reap_strays() -> list[int]:
    """Reap whatever child is left (a process that outlived its parent is ours, as a subreaper):
    its CPU joins RUSAGE_CHILDREN; the pids are returned to be named."""
    strays = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return strays
        if pid == 0:
            break
        strays.append(pid)
    # Alive still: a process the pass left running (not counted, and a leak): name it, end it.
    for pid in live_children():
        strays.append(pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return strays


def live_children() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me:
            found.append(int(entry))
    return found


class Pass:
    """One measured pass: CPU (harness, children) and wall time, and the strays it left."""

    def __init__(self, fn: Callable[[], object]) -> None:
        s0, c0 = cpu()
        t0 = time.perf_counter()
        self.value = fn()
        self.strays = reap_strays()
        self.wall = time.perf_counter() - t0
        s1, c1 = cpu()
        self.harness, self.children = s1 - s0, c1 - c0

    @property
    def total(self) -> float:
        return self.harness + self.children


def matrix_configs(workload: str, depth: int, store: str) -> list[RunConfig]:
    """The runs ``killpoint matrix --workload W [--depth 2]`` makes for the reference target."""
    wl = WORKLOADS[workload](0)
    points = chaos.DEFAULT_POINTS
    if depth == 2:
        plans = generator.matrix(generator.repeated_steps(wl), points, depth=2,
                                 order=declared("reference").points)
    else:
        plans = generator.matrix(wl.step_names, points, depth=1, actions=("kill", "pause"),
                                 terminate_points=points)
    return [RunConfig(schedule=p.schedule, workload=workload, store=store, **p.overrides()) for p in plans]


def matrix_pass(configs: list[RunConfig], jobs: int) -> list[bool | None]:
    with Session() as session:
        return [r.valid for r in session.run_many(configs, jobs=jobs)]


def session_pass() -> None:
    with Session():
        pass


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def floor_once(base: str, n: int, url: str, store_spec: str) -> None:
    """What one ``single`` run cannot avoid: two forks (one SIGKILLed) and their reaps, the
    scenario's 12 store transactions, its 4 loopback HTTP calls."""
    for killed in (True, False):
        pid = os.fork()
        if pid == 0:
            if killed:
                _killed()
            os._exit(0)
        os.waitpid(pid, 0)
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
    client = ds.DownstreamClient(url, f"floor-{n}")
    client.configure({"resources": {"payment": {"legacy": False, "fencing": True}}})
    client.call("payment", key="k", params={"amount": 1}, meta={"instance": "order-1", "step": "charge"},
                fence=1, fence_scope="order-1:charge")
    client.receipt("k")
    client.ledger()
    client.close()


def floor_pass(runs: int, store: str) -> None:
    with Session() as session, tempfile.TemporaryDirectory(dir=session.base_dir) as base:
        for n in range(runs):
            floor_once(base, n, session.downstream.url, store)


def command_pass(workload: str, jobs: int, depth: int, store: str) -> None:
    cmd = [sys.executable, "-c", "import sys; from killpoint._main import main; sys.exit(main())", "matrix", "--workload", workload, "--jobs", str(jobs),
           "-q", "--report", "never", "--store", store] + (["--depth", "2"] if depth == 2 else [])
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} exited {done.returncode}: {done.stderr.strip()[-300:]}")


def spread(values: list[float]) -> str:
    return f"{min(values) * 1000:.1f}-{max(values) * 1000:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="single", help="comma-separated: single, orders")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--depth", type=int, choices=(1, 2), default=1)
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--command", action="store_true", help="also time the command line")
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    print(f"CPU per run (user + system, harness and every process reaped), {args.rounds} interleaved "
          f"rounds, --jobs {args.jobs}, depth {args.depth}, store {args.store.split(':')[0]}, run files in "
          f"{run_files_dir() or tempfile.gettempdir()}, load {os.getloadavg()[0]:.1f}")
    print(f"{'workload':<9} {'pass':<8} {'runs':>5} {'cpu/run':>8} {'spread':>12} {'harness':>8} "
          f"{'children':>8} {'wall/run':>9} {'ratio':>6}")
    strays: list[int] = []
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        configs = matrix_configs(workload, args.depth, args.store)
        runs = len(configs)
        passes: dict[str, list[Pass]] = {"session": [], "matrix": [], "floor": [], "command": []}
        verdicts: set[bool | None] = set()
        matrix_pass(configs[:2], args.jobs)  # warm up: caches (the workload's data), the page cache
        for _ in range(args.rounds):
            passes["session"].append(Pass(session_pass))
            p = Pass(lambda: matrix_pass(configs, args.jobs))
            verdicts.update(p.value)  # type: ignore[arg-type]
            passes["matrix"].append(p)
            passes["floor"].append(Pass(lambda: floor_pass(runs, args.store)))
            if args.command:
                passes["command"].append(Pass(lambda: command_pass(workload, args.jobs, args.depth, args.store)))
        for p in (q for ps in passes.values() for q in ps):
            strays += p.strays
        empty = statistics.median(p.total for p in passes["session"])
        empty_h = statistics.median(p.harness for p in passes["session"])
        per_run: dict[str, list[float]] = {}
        for kind in ("matrix", "floor", "command"):
            ps = passes[kind]
            if not ps:
                continue
            sub, sub_h = (0.0, 0.0) if kind == "command" else (empty, empty_h)
            per_run[kind] = [(p.total - sub) / runs for p in ps]
        floor = statistics.median(per_run["floor"])
        s = passes["session"]
        print(f"{workload:<9} {'session':<8} {'':>5} {statistics.median(p.total for p in s) * 1000:7.1f}ms "
              f"{spread([p.total for p in s]):>12} {statistics.median(p.harness for p in s) * 1000:7.1f}ms "
              f"{statistics.median(p.children for p in s) * 1000:7.1f}ms "
              f"{statistics.median(p.wall for p in s) * 1000:8.1f}ms {'':>6}  (one session, whole)")
        for kind, values in per_run.items():
            ps = passes[kind]
            sub_h = 0.0 if kind == "command" else empty_h
            sub_c = 0.0 if kind == "command" else empty - empty_h
            med = statistics.median(values)
            print(f"{workload:<9} {kind:<8} {runs:>5} {med * 1000:7.1f}ms {spread(values):>12} "
                  f"{statistics.median((p.harness - sub_h) / runs for p in ps) * 1000:7.1f}ms "
                  f"{statistics.median((p.children - sub_c) / runs for p in ps) * 1000:7.1f}ms "
                  f"{statistics.median(p.wall / runs for p in ps) * 1000:8.1f}ms {med / floor:5.2f}x")
        word = "all valid" if verdicts == {True} else f"verdicts {sorted(map(str, verdicts))}"
        print(f"{workload:<9} {word}")
    print("cpu/run: median over the rounds of (pass - an empty session's) / runs (the command: whole / "
          "runs); spread: lowest-highest round; ratio: against the floor's median (the floor is a single "
          "run's, whatever the workload: the goal is set for single)")
    if strays:
        print(f"processes reaped here that their parent left (or left running): {strays}")
    else:
        print("no process escaped its parent: every one was reaped inside its pass and counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
