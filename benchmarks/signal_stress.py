"""Signals at random moments: does anything outlive the command?

Starts ``killpoint matrix`` again and again (one job and ``--jobs 2``, SQLite and PostgreSQL when a
server is reachable), sends it SIGINT, SIGTERM or SIGHUP at a random moment (from its imports to its
last runs), and checks, once it has exited, that nothing it started is left: no process carrying
its marker in the environment (workers, the downstream, runners), no folder in its TMPDIR, no
PostgreSQL schema named with its PID. Prints one line a trial and a summary: the exit codes, the
time from the signal to the exit, and every survivor. Bounded: ``--trials N`` (default 20).

``--plugin`` runs a pytest session instead (a test of ``killpoint.matrix()`` and one of a single
crash, one process or ``-n 2`` under pytest-xdist, on SQLite or PostgreSQL), signalled the same
way: it must exit with pytest's interrupted code (2), or 0 when it finished first, and leave
nothing, as the command does.

    python benchmarks/signal_stress.py --trials 40 --seed 1 [--store postgresql://...] [--plugin]

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

def _default_signals() -> None:
    """In the command's child, before it runs: the three signals at their defaults, as a CI runner
    starts a job. Started from ``nohup`` or as a shell's background job, this script would pass
    on an ignored SIGHUP or SIGINT, which the command rightly keeps ignoring."""
    for sig in EXPECTED:
        signal.signal(sig, signal.SIG_DFL)


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
    """killpoint's schemas made by the process ``pid``."""
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


PLUGIN_TESTS = '''
def test_a_matrix(killpoint):
    killpoint.matrix(steps=["charge"]).assert_valid()


def test_one_crash(killpoint):
    killpoint.run("A@charge.after_call:kill").assert_valid()
'''


def trial(n: int, rng: random.Random, store: str | None, plugin: bool = False, max_delay: float = 6.0) -> dict:
    marker = f"kp-stress-{uuid.uuid4().hex}"
    tmp = tempfile.mkdtemp(prefix="kp-stress-")
    pg = store is not None and rng.random() < 0.5
    if plugin:
        project = tempfile.mkdtemp(prefix="kp-stress-project-")
        with open(os.path.join(project, "test_stress.py"), "w") as fh:
            fh.write(PLUGIN_TESTS)
        argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                *rng.choice([[], ["-n", "2"]]), *(["--killpoint-store", store] if pg else []), "test_stress.py"]
        cwd, expected = project, {signal.SIGINT: 2, signal.SIGTERM: 2, signal.SIGHUP: 2}
    else:
        project = None
        argv = ["-c", "import sys; from killpoint._main import main; sys.exit(main())",  # the console script's
                "matrix", "--steps", "charge", "-q", "--jobs", rng.choice(["1", "2"]),
                *(["--store", store] if pg else [])]
        cwd, expected = ROOT, EXPECTED
    sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    delay = rng.uniform(0.05, max_delay)
    env = {**os.environ, "KILLPOINT_TEST_MARK": marker, "PYTHONPATH": ROOT, "TMPDIR": tmp}
    proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, preexec_fn=_default_signals,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(delay)
    owners = {proc.pid, *marked(marker)}  # whose PID a schema of this trial's runs may carry (xdist's workers)
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
    folders = [f for f in os.listdir(tmp) if not f.startswith("pytest-of-")]  # pytest's own basetemp
    # what each folder left holds, for the report: which part of the command wrote it
    folders = [f + "/{" + ", ".join(sorted(os.path.relpath(os.path.join(d, n), os.path.join(tmp, f))
                                           for d, _, names in os.walk(os.path.join(tmp, f)) for n in names)) + "}"
               for f in folders]
    shutil.rmtree(tmp, ignore_errors=True)
    if project is not None:
        shutil.rmtree(project, ignore_errors=True)
    schemas: list[str] = []
    if pg:
        # a schema carries the PID of the process that ran its run: the command, or a pytest process
        schemas = [s for pid in sorted(owners) for s in schemas_of(store, pid)]  # type: ignore[arg-type]
        drop(store, schemas)  # type: ignore[arg-type]
    text = err.decode(errors="replace")
    shown = " ".join(a for a in argv if not a.startswith("import sys")).replace(store or "\0", "PG")
    # Ended by the signal itself: it landed where Python's default acts -- before killpoint's first
    # line ran (the interpreter's start and imports; for pytest, before the plugin loaded), or after
    # the command put the defaults back on its way out; nothing of killpoint's was running, and the
    # checks above still hold it to leaving nothing.
    early = proc.returncode == -sig
    if early:
        expected = {sig: -sig}
    return {"n": n, "argv": shown, "signal": signal.Signals(sig).name,
            "delay": delay, "code": proc.returncode, "expected": 0 if exited_first else expected[sig],
            "took": took, "hung": hung, "survivors": survivors, "folders": folders, "schemas": schemas,
            "tracebacks": text.count("Traceback"), "finished_first": exited_first, "err": text, "early": early}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default=os.environ.get("KILLPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--plugin", action="store_true", help="signal a pytest session using the plugin instead")
    p.add_argument("--show", action="store_true", help="print the end of a bad trial's output")
    p.add_argument("--max-delay", type=float, default=6.0, help="latest moment a signal is sent, in seconds")
    args = p.parse_args()
    store = args.store if pg_reachable(args.store) else None
    rng = random.Random(args.seed)
    results = []
    for n in range(1, args.trials + 1):
        r = trial(n, rng, store, args.plugin, args.max_delay)
        results.append(r)
        bad = r["hung"] or r["survivors"] or r["folders"] or r["schemas"] or r["code"] != r["expected"]
        print(f"{n:>3} {r['signal']:<7} at {r['delay']:4.1f} s  {r['argv']:<52} exit {r['code']:>3} "
              f"in {r['took']:5.2f} s{'  (finished first)' if r['finished_first'] else ''}"
              f"{'  (outside killpoint: the signal default)' if r['early'] else ''}"
              f"{'  tracebacks ' + str(r['tracebacks']) if r['tracebacks'] else ''}"
              f"{'  BAD: ' + str({k: r[k] for k in BAD_KEYS}) if bad else ''}",
              flush=True)
        if (bad or r["tracebacks"]) and args.show:
            print("      " + r["err"][-1500:].replace("\n", "\n      "), flush=True)
    took = [r["took"] for r in results if not r["finished_first"]]
    survivors = sum(len(r["survivors"]) for r in results)
    left = sum(len(r["folders"]) + len(r["schemas"]) for r in results)
    wrong = sum(1 for r in results if r["code"] != r["expected"] or r["hung"])
    print(f"\n{len(results)} trials: {survivors} surviving processes, {left} folders or schemas left, "
          f"{wrong} wrong exit codes or hangs, {sum(r['tracebacks'] > 0 for r in results)} with a traceback "
          f"({sum(r['early'] for r in results)} ended by the signal's default, outside killpoint's code); "
          f"signal to exit: median {statistics.median(took) if took else 0:.2f} s, max {max(took, default=0):.2f} s")
    return 0 if survivors == left == wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
