"""The verdicts of killpoint's own targets, one line a run, to compare two builds: a change made for
speed must leave every schedule, seed, verdict and fired fault as it was.

Each line is what a run decided, never how long it took or how often a point was merely passed
(those move with the machine): the command, the schedule, the verdict, each fault's fire count, the
unfired faults, how many workers the run started, which worker fired which action at which point,
and the invariants violated (with their instance and step).

    python benchmarks/fingerprint.py [--only selftest,orders,...] [--killpoint PATH] > before.txt
    ... change the code ...
    python benchmarks/fingerprint.py > after.txt && diff before.txt after.txt

``--killpoint`` is the console script to run (default: this interpreter's killpoint). The PostgreSQL
runs need ``--pg`` (default the local server); the library targets their libraries installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commands(pg: str) -> dict[str, tuple[list[str], str | None]]:
    """label -> (killpoint arguments, an examples folder to put on the path)."""
    c: dict[str, tuple[list[str], str | None]] = {
        "selftest": (["selftest", "--jobs", "2"], None),
        "orders": (["matrix", "--jobs", "2"], None),
        "single": (["matrix", "--workload", "single", "--jobs", "1"], None),
        "depth2": (["matrix", "--depth", "2", "--jobs", "2"], None),
        "depth2-small": (["matrix", "--depth", "2", "--steps", "charge", "--points",
                          "after_claim,after_call,before_commit", "--jobs", "2"], None),
        "seed7": (["matrix", "--seed", "7", "--jobs", "2"], None),
        "mutant": (["matrix", "--target", "mutant:no-fence-check", "--jobs", "2"], None),
        "pg": (["matrix", "--store", pg, "--actions", "kill,pause,terminate", "--jobs", "2"], None),
        "pg-selftest": (["selftest", "--store", pg, "--jobs", "2"], None),
        "pg-single": (["matrix", "--store", pg, "--workload", "single", "--actions", "kill,pause,terminate",
                       "--jobs", "2"], None),
        "outbox": (["matrix", "--target", "outbox_worker:worker", "--jobs", "2"], "sqlite_outbox"),
        "outbox-bad": (["matrix", "--target", "outbox_worker:worker_new_key_per_delivery", "--jobs", "2"],
                       "sqlite_outbox"),
        "queue": (["matrix", "--target", "queue_worker:worker", "--jobs", "2"], "pg_queue"),
        "queue-bad": (["matrix", "--target", "queue_worker:worker_new_key_per_attempt", "--jobs", "2"],
                      "pg_queue"),
        "shop": (["matrix", "--target", "shop_worker:run", "--jobs", "2"], "user_worker"),
        "shop-bad": (["matrix", "--target", "shop_worker:run_without_fencing", "--jobs", "2"], "user_worker"),
    }
    for lib in ("dbos", "langgraph", "procrastinate"):
        for kind in ("naive", "keyed"):
            c[f"{lib}:{kind}"] = (["matrix", "--target", f"{lib}:{kind}", "--jobs", "2"], None)
    return c


def run_lines(label: str, result: dict) -> list[str]:
    fired = result.get("points", {}).get("fired", {})
    return [f"{label} | {result['schedule']} | valid={result['valid']} | fired={json.dumps(result['fired'], sort_keys=True)}"
            f" | unfired={result['unfired']} | spawned={result['workers_spawned']}"
            f" | points={json.dumps(fired, sort_keys=True)}"]


def fingerprint(label: str, out: dict) -> list[str]:
    lines = [f"{label} | valid={out.get('valid')} | runs={out.get('runs')}"]
    for v in out.get("violations", []):
        lines.append(f"{label} | violation {v['invariant']} | {v.get('schedule')} | {v.get('instance')} | {v.get('step')}")
    for r in out.get("results", []):
        lines += run_lines(label, r)
    for m in out.get("mutants", []):
        lines.append(f"{label} | mutant {m['name']} | {m['schedule']} | caught={m['caught']} by {m['caught_by']}"
                     f" | valid={m['valid']} | violated={m['violated']}"
                     f" | points={json.dumps(m.get('points', {}).get('fired', {}), sort_keys=True)}")
    ref = out.get("reference")
    if ref:
        lines.append(f"{label} | reference | valid={ref['valid']} | runs={ref['runs']} | unknown={len(ref['unknown'])}"
                     f" | points={json.dumps(ref.get('points', {}).get('fired', {}), sort_keys=True)}")
        for v in ref.get("violations", []):
            lines.append(f"{label} | reference violation {v['invariant']} | {v.get('schedule')}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--killpoint", default=os.path.join(os.path.dirname(sys.executable), "killpoint"))
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    chosen = [x.strip() for x in args.only.split(",") if x.strip()]
    for label, (argv, example) in commands(args.pg).items():
        if chosen and label not in chosen:
            continue
        env = {**os.environ, "KILLPOINT_PG_DSN": args.pg}
        if example:
            env["PYTHONPATH"] = os.path.join(ROOT, "examples", example)
        quiet = ["--json", "-q"] + ([] if argv[0] == "selftest" else ["--report", "never"])
        done = subprocess.run([args.killpoint, *argv, *quiet],
                              capture_output=True, text=True, env=env)
        if done.returncode not in (0, 1):
            print(f"{label} | exit {done.returncode} | {done.stderr.strip().splitlines()[-1:]}")
            continue
        for line in fingerprint(label, json.loads(done.stdout)):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
