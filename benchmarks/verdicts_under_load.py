"""The same verdicts on a loaded machine: the matrix, its depth-2 pairs and a replayed counterexample,
each run with two CPU-bound busy loops beside it.

A crash-testing tool whose answer changes when CI is busy cannot be trusted. This script starts two
busy loops (separate processes, one per core on a two-core runner), runs each command, ends the
loops by PID, and compares every verdict with the one the command must give:

* ``killpoint matrix`` on the reference: valid (exit 0);
* ``killpoint matrix --depth 2`` on the reference: valid (exit 0);
* ``killpoint replay <no-fence-check's counterexample> --repeat 20``: violated 20 times out of 20,
  by ``stale_writes_rejected`` (exit 1).

    python benchmarks/verdicts_under_load.py [--depth2-steps reserve,charge,notify] [--repeat 20]

Exits 0 when every verdict is the expected one, 1 otherwise; prints what each command gave.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY = "while True:\n    pass\n"


def killpoint(*argv: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", *argv, "--json"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    elapsed = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {"error": proc.stderr[-2000:]}
    return proc.returncode, report, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth2-steps", default=None,
                        help="steps for the depth-2 matrix (default: its own default, 570 runs)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the runs (default 2)")
    args = parser.parse_args()

    from killpoint.harness.mutants import MUTANTS

    mutant = MUTANTS["no-fence-check"]
    depth2 = ["matrix", "--depth", "2"] + (["--steps", args.depth2_steps] if args.depth2_steps else [])
    checks = [
        ("matrix", ["matrix"], 0, lambda r: r.get("valid") is True),
        (" ".join(depth2), depth2, 0, lambda r: r.get("valid") is True),
        (f"replay {mutant.schedule} --target {mutant.target_name} --repeat {args.repeat}",
         ["replay", mutant.schedule, "--target", mutant.target_name, "--repeat", str(args.repeat)], 1,
         lambda r: r.get("agree") is True and len(r.get("verdicts", ())) == args.repeat and all(
             v["valid"] is False and mutant.caught_by in v["violated"] for v in r["verdicts"])),
    ]
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    print(f"{len(loops)} busy loops running beside the commands (PIDs {', '.join(str(p.pid) for p in loops)})")
    failures = 0
    try:
        for name, argv, want_code, expected in checks:
            code, report, elapsed = killpoint(*argv)
            ok = code == want_code and expected(report)
            failures += not ok
            unknown = report.get("unknown_reasons") or [u for x in report.get("unknown", []) for u in x["reasons"]]
            print(f"{'same verdict' if ok else 'DIFFERENT VERDICT'}: killpoint {name}: exit {code} "
                  f"(expected {want_code}), {report.get('runs')} runs, valid={report.get('valid')}, "
                  f"{len(report.get('violations', []))} violation(s), {elapsed:.0f} s"
                  + (f"; unknown: {unknown[:3]}" if unknown else "")
                  + ("" if ok else f"; violations: {[v.get('detail') for v in report.get('violations', [])][:3]}"))
    finally:
        for p in loops:  # ended by PID, the ones this script started
            p.kill()
            p.wait()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
