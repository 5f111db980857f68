"""What HTML reports cost: the CPU and the bytes of a matrix's reports, against the matrix alone.

Runs the default ``killpoint matrix`` (122 runs on the reference's ``orders`` workload: every hit
a fault-free run reaches, each point killed and paused) as a command, with and without ``--report
always --report-dir``, in turns, and prints per target: the CPU time of each command's process
tree (user + system of the command and every process it reaped: its workers, the downstream, its
runners), the share of it the reports add, the report folder's size, its pages, a page's size (the
folder less its index, over the pages) and the folder scaled to 68 runs. CPU, not wall time: on a
shared machine wall time is mostly other people's load.

    python benchmarks/reports.py [--rounds 3] [--targets reference,mutant:no-fence-check] [--jobs 1]

The goals (issue 29): reports cost at most 10% of the runs' CPU, and a 68-run matrix's folder is at
most 2 MB.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _tree_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], cwd: str) -> tuple[int, float, float]:
    """One command, as its own process: its exit code, the CPU of its process tree, its wall time."""
    before, started = _tree_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", *argv], cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return done.returncode, _tree_cpu() - before, time.monotonic() - started


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))


def page_count(path: str) -> int:
    """The run pages (every .html but the index; named run-0001.html or after their run ids)."""
    return sum(1 for name in os.listdir(path) if name.endswith(".html") and name != "index.html")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default="reference,mutant:no-fence-check")
    parser.add_argument("--jobs", default="1")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="killpoint-bench-reports-")
    try:
        print(f"load average at start: {os.getloadavg()[0]:.1f}")
        print("| target | runs' CPU (median) | with reports (median) | reports' share | folder | pages "
              "| a page | 68 runs' worth |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for target in args.targets.split(","):
            plain, reported, sizes, pages = [], [], [], 0
            base = ["matrix", "--target", target, "--jobs", args.jobs, "--quiet"]
            for n in range(args.rounds):  # in turns, so that both see the same minutes of the machine
                code, cpu, _ = run(base + ["--report", "never"], work)
                plain.append(cpu)
                where = os.path.join(work, f"report-{n}")
                code, cpu, _ = run(base + ["--report", "always", "--report-dir", where], work)
                reported.append(cpu)
                sizes.append(folder_bytes(where))
                pages = page_count(where)
                index = os.path.getsize(os.path.join(where, "index.html"))
                shutil.rmtree(where)
            runs, both = statistics.median(plain), statistics.median(reported)
            size = statistics.median(sizes)
            # a page: the folder less its index, over the pages (the shared files spread over them)
            print(f"| `{target}` | {runs:.2f} s | {both:.2f} s | {100 * (both - runs) / runs:.0f}% | "
                  f"{size / 1e6:.2f} MB | {pages} | {(size - index) / max(1, pages) / 1e3:.1f} kB | "
                  f"{size * 68 / max(1, pages) / 1e6:.2f} MB |")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
