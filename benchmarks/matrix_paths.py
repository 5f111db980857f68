"""What path exploration costs the default matrix: first hits only against paths, in the same minutes.

Rounds alternate ``killpoint matrix --hits first`` (the matrix as it was: the first hit of each point
of each step) and ``killpoint matrix`` (the default, ``--hits paths``: a fault-free run with worker A
alone, then a kill at each later hit that ends a new path), so that a drift of the machine's load
lands on both sides; ``--recovery`` adds one ``--recovery-paths`` run at the end. For each command:
its runs (and the hits it explored), its wall time, and its CPU time (user + system of the command
and every process it waited for: its job runners, their workers, the downstream), which is what a
shared machine's load does not inflate.

``--before PYTHON`` adds, in the same turns, the default matrix as an earlier checkout runs it
(``PYTHON`` is the interpreter of a virtualenv where that checkout is installed), so a change's
cost is measured before and after in the same minutes.

    python benchmarks/matrix_paths.py [--rounds 2] [--recovery] [--target reference] [--before PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

KILLPOINT = [sys.executable, "-m", "killpoint.harness.cli"]


def once(extra: list[str], target: str, python: str = sys.executable) -> dict[str, float]:
    """One matrix command: its runs, explored hits, wall seconds and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([python, *KILLPOINT[1:], "matrix", "--target", target, "--json", "-q", *extra],
                          capture_output=True, text=True, check=False, cwd=os.path.expanduser("~"))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"killpoint matrix {' '.join(extra)} exited {done.returncode}: {done.stderr[-400:]}")
    report = json.loads(done.stdout)
    hits = report.get("hits") or {}
    return {"runs": report["runs"] + (hits.get("discovery_valid") is True), "explored": hits.get("explored", 0),
            "valid": report["valid"], "wall": wall,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--recovery", action="store_true", help="also time one --recovery-paths matrix")
    p.add_argument("--target", default="reference")
    p.add_argument("--before", metavar="PYTHON", help="an earlier checkout's interpreter: its default matrix too")
    args = p.parse_args()
    modes = {"first hits (--hits first)": ([], ["--hits", "first"]), "paths (default)": ([], [])}
    if args.before:
        modes["the earlier checkout's default"] = ([args.before], [])
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, (python, extra) in modes.items():
            seen[name].append(once(extra, args.target, *python))
    if args.recovery:
        seen["paths and recovery paths (--recovery-paths)"] = [once(["--recovery-paths"], args.target)]
    base = statistics.median(r["cpu"] for r in seen["first hits (--hits first)"])
    print(f"killpoint matrix --target {args.target}, {args.rounds} round(s), load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for name, rows in seen.items():
        cpu = statistics.median(r["cpu"] for r in rows)
        wall = statistics.median(r["wall"] for r in rows)
        print(f"  {name:<46} runs {int(rows[0]['runs']):>4} (later hits {int(rows[0]['explored'])}), "
              f"CPU {cpu:6.1f} s ({cpu / base:.2f}x), wall {wall:6.1f} s, valid {rows[0]['valid']}")


if __name__ == "__main__":
    main()
