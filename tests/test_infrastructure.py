"""When the infrastructure breaks, or the command is told to stop: DESIGN section 10.

A store lost mid-run, a full disk, a dead downstream: exit 3 with the JSON object printed and the
cause in ``unknown_reasons``, never exit 1 and never a bare traceback. SIGTERM ends like Ctrl-C:
exit 143, every process, run folder and PostgreSQL schema gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from killpoint import chaos
from killpoint.harness.run import RunConfig, Session

from test_processes import ROOT, children_of, wait_until_gone
from hang import HANG_S


def _cli(*argv: str, marker: str, tmpdir: str) -> subprocess.Popen:
    env = {**os.environ, "KILLPOINT_TEST_MARK": marker, "PYTHONPATH": ROOT, "TMPDIR": tmpdir}
    return subprocess.Popen([sys.executable, "-m", "killpoint.harness.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)


def _schemas_of(pg_dsn: str, pid: int) -> list[str]:
    from killpoint.harness.store.postgres import connect

    with connect(pg_dsn) as admin:
        return [r[0] for r in admin.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"killpoint\\_%\\_p{pid}\\_%",))]


def _wait(predicate, seconds: float, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(f"never saw {what} (exit {proc.returncode}): {err.decode(errors='replace')[-2000:]}")


def test_a_store_lost_mid_run_is_exit_3_with_the_json_and_the_cause_and_no_traceback(pg_dsn, tmp_path):
    from killpoint.harness.store.postgres import connect

    marker = f"kp-{uuid.uuid4().hex}"
    cli = _cli("matrix", "--steps", "charge", "--store", pg_dsn, "--json", "--jobs", "1", marker=marker,
               tmpdir=str(tmp_path))
    schema = _wait(lambda: _schemas_of(pg_dsn, cli.pid), 60, "a run's schema", cli)[0]
    # The store goes away under the run: every session of its schema ended, the schema dropped.
    with connect(pg_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE application_name = %s", (f"killpoint {schema}"[:63],))
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    out, err = cli.communicate(timeout=HANG_S)
    text = err.decode(errors="replace")
    assert cli.returncode == 3, text[-3000:]
    report = json.loads(out)
    assert report["valid"] is None and report["violations"] == []
    assert any("infrastructure failure" in r for r in report["unknown_reasons"]), report["unknown_reasons"]
    # No traceback of the command's own. (A worker whose store vanished under it dies of the error,
    # and a worker's crash is the target's finding, reported with its traceback.)
    assert text.count("Traceback") == text.count("Process killpoint-worker-"), text[-3000:]
    assert _schemas_of(pg_dsn, cli.pid) == [] and wait_until_gone(marker) == []


def test_a_dead_downstream_makes_the_run_unknown_with_its_cause_never_an_exception():
    with Session() as session:
        os.kill(session.downstream.pid, signal.SIGKILL)
        result = session.run(RunConfig(schedule=chaos.parse("A@charge.after_call:kill")))
    assert result.valid is None and result.verdict.violations == ()
    (reason,) = result.verdict.unknown_reasons
    assert reason.startswith("infrastructure failure while configuring the downstream"), reason


def test_a_worker_that_cannot_be_started_makes_the_run_unknown_naming_it(monkeypatch):
    """The machine refuses another process (fork fails with EAGAIN, as at a process limit): each run
    is unknown, naming the worker it could not start, never a violation and never an exception;
    in a batch too (``--jobs 1`` prepares the next run and forks its first worker ahead)."""
    import errno

    def refused() -> int:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    configs = [RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single")] * 2
    with Session() as session:
        before = set(children_of(os.getpid()))
        monkeypatch.setattr(os, "fork", refused)
        results = [session.run(configs[0]), *session.run_many(configs, jobs=1)]
        monkeypatch.undo()
        assert set(children_of(os.getpid())) == before
    for result in results:
        assert result.valid is None and result.verdict.violations == ()
        (reason,) = result.verdict.unknown_reasons
        assert "cannot start worker A: BlockingIOError" in reason, reason


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 600 kB filesystem (tmpfs): the run's folder fills it up."""
    where = tmp_path / "tiny"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(where)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_is_exit_3_naming_it_with_the_json_and_no_traceback(tiny_disk):
    marker = f"kp-{uuid.uuid4().hex}"
    cli = _cli("replay", "A@charge.after_call:kill", "--json", marker=marker, tmpdir=tiny_disk)
    out, err = cli.communicate(timeout=HANG_S)
    text = err.decode(errors="replace")
    assert cli.returncode == 3, text[-3000:]
    report = json.loads(out)
    assert report["valid"] is None
    assert any("No space left on device" in r for r in report["unknown_reasons"]), report
    # None of the command's own; a worker the full disk failed ends quietly, but one whose
    # downstream answered 500 (its ledger shares the disk) dies of it, with its traceback.
    assert text.count("Traceback") == text.count("Process killpoint-worker-"), text[-3000:]
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize("where", ["while the next run is prepared", "while the run before is judged"])
def test_an_interruption_as_a_run_finishes_its_meanwhile_leaves_no_schema_or_worker(pg_dsn, monkeypatch, where):
    """Protects: with ``--jobs 1`` a run, its own workers ended, finishes the next run's preparation
    and the run before's judging (``Meanwhile.finish``). A Ctrl-C or SIGTERM landing there left the
    run's schema behind: it was neither living (its cleanup is in ``live``) nor yet among the runs
    to judge (CI caught it once, in the SIGTERM test below)."""
    from killpoint.harness import run as run_module

    real_finish = run_module.Meanwhile.finish
    calls = []

    def interrupted(self):
        calls.append(self)
        if len(calls) == (1 if where == "while the next run is prepared" else 2):
            real_finish(self)  # the next run prepared (its schema made): then the signal
            raise KeyboardInterrupt()
        return real_finish(self)

    monkeypatch.setattr(run_module.Meanwhile, "finish", interrupted)
    configs = [RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), store=pg_dsn, workload="single")
               for _ in range(4)]
    with Session() as session:
        with pytest.raises(KeyboardInterrupt):
            for _ in session.run_in_turn(configs):
                pass
        assert not session._live, "a worker process outlived the interruption"
    assert _schemas_of(pg_dsn, os.getpid()) == []


@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             # a closed terminal or SSH session: SIGHUP left the
                                             # run's schemas and folder behind (exit 129 by the signal)
                                             (signal.SIGHUP, 129, "hung up (SIGHUP)")])
def test_sigterm_ends_like_ctrl_c_exit_143_with_no_process_folder_or_schema_left(pg_dsn, tmp_path, sig, code,
                                                                                  said):
    marker = f"kp-{uuid.uuid4().hex}"
    cli = _cli("matrix", "--store", pg_dsn, "--json", "--jobs", "1", marker=marker, tmpdir=str(tmp_path))
    _wait(lambda: len(children_of(cli.pid)) >= 2 and _schemas_of(pg_dsn, cli.pid), 60,
          "a worker and a schema", cli)
    cli.send_signal(sig)
    out, err = cli.communicate(timeout=HANG_S)
    assert cli.returncode == code, err.decode(errors="replace")[-2000:]
    assert said in err.decode()
    assert wait_until_gone(marker) == []
    assert _schemas_of(pg_dsn, cli.pid) == []
    assert os.listdir(tmp_path) == []  # the session's folder (run files, journals, ledger) is gone



class _Proxy:
    """A TCP proxy on loopback in front of the PostgreSQL server: ``cut()`` is the server going away
    (every connection through it closed, no new one accepted), for real, without touching the
    server the other tests share."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list = []
        self._lock = threading.Lock()
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            with self._lock:
                if self._cut:
                    client.close()
                    server.close()
                    return
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._listener.close()
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def test_a_schema_the_run_could_not_drop_is_named_with_the_statement_that_drops_it(pg_dsn):
    """Protects: a PostgreSQL server that went away mid-run left the run's schema in the database
    without a word (the drop failed in a best-effort cleanup). The run is unknown, and its reasons
    and a KillpointWarning name the schema and the statement that drops it."""
    import psycopg

    from killpoint.errors import KillpointWarning
    from killpoint.harness.store.postgres import connect

    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    proxy = _Proxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    from urllib.parse import quote

    password = f":{quote(str(info['password']), safe='')}" if info.get("password") else ""
    through = (f"postgresql://{quote(str(info.get('user') or 'postgres'), safe='')}{password}@127.0.0.1:{proxy.port}/"
               f"{quote(str(info.get('dbname') or 'test'), safe='')}")
    slug = None
    try:
        with Session() as session, pytest.warns(KillpointWarning, match="DROP SCHEMA") as caught:
            result = session.run(RunConfig(workload="single", store=through,
                                           after_quiescent=lambda store, client: proxy.cut()))
            slug = result.run_id.replace("-", "_")
        assert result.valid is None and result.verdict.violations == ()
        [left] = [r for r in result.verdict.unknown_reasons if "left its PostgreSQL schema" in r]
        schema = left.split("left its PostgreSQL schema ", 1)[1].split()[0]
        assert f'DROP SCHEMA "{schema}" CASCADE' in left and result.run_id in left
        assert any(schema in str(w.message) for w in caught)
        with connect(pg_dsn) as admin:  # it is there: the message says what is true
            assert admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()[0] == 1
    finally:  # the schema left, found by this process's id and the run's, also when the test fails
        proxy.cut()
        with connect(pg_dsn, autocommit=True) as admin:
            for name in _schemas_of(pg_dsn, os.getpid()):
                if slug and slug in name:
                    admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')



_LONG_RUNS = """
import sys, time
import killpoint
from killpoint.harness import signals
from killpoint.harness.run import RunConfig, Session

def work(ctx):
    time.sleep(600)  # real time: a run as long as its bound, far past the parent's 10 s wait

target = killpoint.target(work)
signals.install_handlers()  # as the command line does: SIGTERM raises Terminated here
with Session() as session:
    configs = [RunConfig(target=target, workload="single", workers=1, store=sys.argv[1], bound_s=300)
               for _ in range(2)]
    for _ in session.run_many(configs, jobs=2):
        pass
"""


def test_sigterm_ends_jobs_runners_whose_runs_are_long_leaving_no_schema(pg_dsn, tmp_path):
    """Protects: a ``--jobs`` runner ignored SIGTERM and finished its run in hand; a run longer than
    the parent's 10 s wait was SIGKILLed with its runner and left its PostgreSQL schema. Now the
    signal stops the run in hand at its loop's next turn and the run cleans up as an interrupted
    one does. Each run here sleeps in real time far past that wait, so only the signal ends it."""
    marker = f"kp-{uuid.uuid4().hex}"
    script = tmp_path / "long_runs.py"
    script.write_text(_LONG_RUNS)
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    env = {**os.environ, "KILLPOINT_TEST_MARK": marker, "PYTHONPATH": ROOT, "TMPDIR": str(run_dir)}
    proc = subprocess.Popen([sys.executable, str(script), pg_dsn], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    # Both runners' runs under way: each has its schema (the runners are the script's children).
    _wait(lambda: sum(len(_schemas_of(pg_dsn, pid)) for pid in children_of(proc.pid)) >= 2, 60,
          "both runners' schemas", proc)
    runners = children_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=HANG_S)
        text = err.decode(errors="replace")
        assert proc.returncode != 0 and "Terminated" in text, text[-2000:]  # the script's own end
        assert "Process killpoint-runner" not in text, text[-3000:]  # no runner's traceback
        assert wait_until_gone(marker) == []
        assert [s for pid in runners for s in _schemas_of(pg_dsn, pid)] == []
        assert os.listdir(run_dir) == []
    finally:  # what a failure left, gone: the processes by PID, the schemas by their runner's
        proc.kill()
        proc.communicate()
        from killpoint.harness.store.postgres import connect

        with connect(pg_dsn, autocommit=True) as admin:
            for name in [s for pid in runners for s in _schemas_of(pg_dsn, pid)]:
                admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
