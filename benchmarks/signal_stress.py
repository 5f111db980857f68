"""Signals at random moments: does anything outlive the command?

Starts ``killpoint matrix`` again and again (one job and ``--jobs 2``, SQLite and PostgreSQL when a
server is reachable), sends it SIGINT, SIGTERM or SIGHUP at a random moment (from its imports to its
last runs), and checks, once it has exited, that nothing it started is left: no process carrying
its marker in the environment (workers, the downstream, runners), no folder in its TMPDIR, no
PostgreSQL schema named with its PID. Prints one line a trial and a summary: the exit codes, the
time from the signal to the exit, and every survivor. Bounded: ``--trials N`` (default 20).

    python benchmarks/signal_stress.py --trials 40 --seed 1 [--store postgresql://...]

Exit status 0 when nothing survived and every command ended, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


BAD_KEYS = ('hung', 'survivors', 'folders', 'schemas', 'code')

def marked(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def schemas_of(dsn: str, pid: int) -> list[str]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        return [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                                           (f"killpoint\\_%\\_p{pid}\\_%",))]


def drop(dsn: str, names: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_reachable(dsn: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except Exception:  # noqa: BLE001 - no server: SQLite trials only
        return False


def trial(n: int, rng: random.Random, store: str | None) -> dict:
    marker = f"kp-stress-{uuid.uuid4().hex}"
    tmp = tempfile.mkdtemp(prefix="kp-stress-")
    argv = ["matrix", "--steps", "charge", "-q", "--jobs", rng.choice(["1", "2"])]
    if store is not None and rng.random() < 0.5:
        argv += ["--store", store]
    sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    delay = rng.uniform(0.05, 6.0)
    env = {**os.environ, "KILLPOINT_TEST_MARK": marker, "PYTHONPATH": ROOT, "TMPDIR": tmp}
    entry = "import sys; from killpoint._main import main; sys.exit(main())"  # the console script's
    proc = subprocess.Popen([sys.executable, "-c", entry, *argv], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(delay)
    sent = time.monotonic()
    exited_first = proc.poll() is not None
    if not exited_first:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
        hung = False
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        took, hung = time.monotonic() - sent, True
    time.sleep(1.0)  # a process still ending (reaped by its own parent) is not a survivor yet
    survivors = marked(marker)
    for pid in survivors:  # never left running past the trial
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    folders = os.listdir(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    schemas: list[str] = []
    if "--store" in argv:
        schemas = schemas_of(store, proc.pid)  # type: ignore[arg-type]
        drop(store, schemas)  # type: ignore[arg-type]
    text = err.decode(errors="replace")
    return {"n": n, "argv": " ".join(argv).replace(store or "\0", "PG"), "signal": signal.Signals(sig).name,
            "delay": delay, "code": proc.returncode, "expected": 0 if exited_first else EXPECTED[sig],
            "took": took, "hung": hung, "survivors": survivors, "folders": folders, "schemas": schemas,
            "tracebacks": text.count("Traceback"), "finished_first": exited_first}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default=os.environ.get("KILLPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    args = p.parse_args()
    store = args.store if pg_reachable(args.store) else None
    rng = random.Random(args.seed)
    results = []
    for n in range(1, args.trials + 1):
        r = trial(n, rng, store)
        results.append(r)
        bad = r["hung"] or r["survivors"] or r["folders"] or r["schemas"] or r["code"] != r["expected"]
        print(f"{n:>3} {r['signal']:<7} at {r['delay']:4.1f} s  {r['argv']:<52} exit {r['code']:>3} "
              f"in {r['took']:5.2f} s{'  (finished first)' if r['finished_first'] else ''}"
              f"{'  tracebacks ' + str(r['tracebacks']) if r['tracebacks'] else ''}"
              f"{'  BAD: ' + str({k: r[k] for k in BAD_KEYS}) if bad else ''}",
              flush=True)
    took = [r["took"] for r in results if not r["finished_first"]]
    survivors = sum(len(r["survivors"]) for r in results)
    left = sum(len(r["folders"]) + len(r["schemas"]) for r in results)
    wrong = sum(1 for r in results if r["code"] != r["expected"] or r["hung"])
    print(f"\n{len(results)} trials: {survivors} surviving processes, {left} folders or schemas left, "
          f"{wrong} wrong exit codes or hangs, {sum(r['tracebacks'] > 0 for r in results)} with a traceback; "
          f"signal to exit: median {statistics.median(took) if took else 0:.2f} s, max {max(took, default=0):.2f} s")
    return 0 if survivors == left == wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
