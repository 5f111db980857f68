"""What HTML reports cost: the CPU and the bytes of a matrix's reports, against the matrix alone.

Runs the default ``killpoint matrix`` (122 runs on the reference's ``orders`` workload: every hit
a fault-free run reaches, each point killed and paused) as a command, with and without ``--report
always --report-dir``, in turns, and prints per target: the CPU time of each command's process
tree (user + system of the command and every process it reaped: its workers, the downstream, its
runners) and the difference the reports make to it; the CPU the command's own process spent writing
reports, and its share of the runs' CPU; the command's peak RSS without and with reports (kept
histories make every forked worker dearer); the report folder's size, its pages, a page's size (the
folder less its index, over the pages) and the folder scaled to 68 runs. CPU, not wall time: on a
shared machine wall time is mostly other people's load; and on a loaded one even the difference
of two trees' CPU moves by a fifth from one round to the next, which the reports' own CPU does not.

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


def _tree_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# The command, run in a process that also times the reports' own part of its CPU: write_html (the
# pages written after the runs, and the index) and, where the build has it, PagesAsTheyCome.add (the
# pages a matrix writes as its runs come). It writes that CPU and its peak RSS to the file in argv[1].
_TIMED = r"""
import resource, sys, time
spent = [0.0]
def timed(owner, name):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        started = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - started
    setattr(owner, name, wrapper)
try:
    from killpoint.harness.commands import output as commands  # where finish() calls write_html
except ImportError:  # a build before the commands' split
    from killpoint.harness.commands import common as commands
timed(commands, "write_html")
try:
    from killpoint.reports.folder import PagesAsTheyCome
    timed(PagesAsTheyCome, "add")
except ImportError:
    pass
from killpoint.harness.cli import main
code = 1
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as fh:
        fh.write(f"{spent[0]} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
sys.exit(code)
"""


def run(argv: list[str], cwd: str) -> tuple[int, float, float, float]:
    """One command, as its own process: its exit code, the CPU of its process tree, the CPU its
    process spent writing reports, and its peak RSS in MiB."""
    before = _tree_cpu()
    out = os.path.join(cwd, "timed.txt")
    done = subprocess.run([sys.executable, "-c", _TIMED, out, *argv], cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out, encoding="utf-8") as fh:
        own, rss = fh.read().split()
    return done.returncode, _tree_cpu() - before, float(own), int(rss) / 1024


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
        print("| target | runs' CPU | with reports | difference | reports' own CPU | peak RSS | folder | pages "
              "| a page | 68 runs' worth |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for target in args.targets.split(","):
            plain, reported, own, sizes, pages, rss = [], [], [], [], 0, ([], [])
            base = ["matrix", "--target", target, "--jobs", args.jobs, "--quiet"]
            for n in range(args.rounds):  # in turns, so that both see the same minutes of the machine
                code, cpu, _, peak = run(base + ["--report", "never"], work)
                plain.append(cpu)
                rss[0].append(peak)
                where = os.path.join(work, f"report-{n}")
                code, cpu, spent, peak = run(base + ["--report", "always", "--report-dir", where], work)
                reported.append(cpu)
                own.append(spent)
                rss[1].append(peak)
                sizes.append(folder_bytes(where))
                pages = page_count(where)
                index = os.path.getsize(os.path.join(where, "index.html"))
                shutil.rmtree(where)
            runs, both, mine = statistics.median(plain), statistics.median(reported), statistics.median(own)
            size = statistics.median(sizes)
            # difference: the whole trees' (noisy on a loaded machine); own: the CPU the command's
            # process spent writing reports, over the runs' CPU (what the pages cost, without the
            # noise, though not what a bigger process costs the workers forked from it: see RSS).
            # a page: the folder less its index, over the pages (the shared files spread over them)
            print(f"| `{target}` | {runs:.2f} s | {both:.2f} s | {100 * (both - runs) / runs:+.0f}% | "
                  f"{mine:.2f} s, {100 * mine / runs:.1f}% | {statistics.median(rss[0]):.0f} / "
                  f"{statistics.median(rss[1]):.0f} MiB | {size / 1e6:.2f} MB | {pages} | "
                  f"{(size - index) / max(1, pages) / 1e3:.1f} kB | {size * 68 / max(1, pages) / 1e6:.2f} MB |")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
