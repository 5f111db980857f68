"""--jobs N: independent runs side by side in runner processes, results in schedule order."""

from __future__ import annotations

import os

import pytest

from killpoint import chaos
from killpoint.harness.cli import main
from killpoint.harness.jobs import JobFailed
from killpoint.harness.run import RunConfig, Session
from hang import HANG_S

SCHEDULES = ["A@charge.after_call:kill", "A@charge.before_claim:kill", "A@charge.after_claim:1*pause",
             "A@charge.before_commit:kill", "A@charge.after_commit:kill"]


def test_run_many_on_two_jobs_gives_every_result_in_schedule_order_and_leaves_no_process(children):
    configs = [RunConfig(schedule=chaos.parse(s), workload="single") for s in SCHEDULES]
    with Session() as session:
        before = children()
        results = list(session.run_many(configs, jobs=2))
        assert children() == before  # every runner and every worker ended
    assert [str(r.config.schedule) for r in results] == SCHEDULES
    assert [r.config for r in results] == configs
    assert all(r.valid is True and not r.unfired for r in results), [r.verdict for r in results]
    # The runs really ran in two other processes: their workers' parents were not this one.
    spawns = {e.get("pid") for r in results for e in r.history.of("harness", "spawn")}
    assert len(spawns) >= 2 * len(SCHEDULES)


def test_a_run_that_raises_in_a_runner_is_an_error_here_not_a_verdict():
    configs = [RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single"),
               RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="no-such-workload")]
    with Session() as session, pytest.raises(JobFailed, match="no-such-workload"):
        list(session.run_many(configs, jobs=2))


def test_matrix_refuses_a_jobs_count_below_one(capsys):
    assert main(["matrix", "--jobs", "0"]) == 2
    assert "--jobs '0': give a whole number of at least 1" in capsys.readouterr().err


def test_a_result_travels_by_the_standard_pickle_and_anything_else_by_dill():
    """Protects: --jobs throughput and generality. A run's result crosses from its runner in the
    standard pickle (dill took 20 ms a result, a quarter of a run's CPU); a value only dill knows (a
    lambda a target left in its history) still travels, and both read back with pickle.loads."""
    import pickle

    from killpoint.harness.jobs import _dumps

    with Session() as session:
        result = session.run(RunConfig(schedule=chaos.parse(SCHEDULES[0]), workload="single"))
    payload = (0, {"history": result.history, "verdict": result.verdict}, None)
    data = _dumps(payload)
    assert data == pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)  # the fast path
    back = pickle.loads(data)
    assert back[1]["history"].events == result.history.events
    assert back[1]["verdict"].valid == result.verdict.valid
    odd = _dumps((1, {"note": lambda: 42}, None))
    assert pickle.loads(odd)[1]["note"]() == 42


def _store_files(session: Session) -> list[str]:
    return [name for _, _, files in os.walk(session.base_dir) for name in files if ".sqlite" in name
            and not name.startswith("downstream-ledger")]


def _seen(result) -> tuple:
    return (str(result.config.schedule), result.config.target, result.valid, result.fired,
            sorted(v.invariant for v in result.verdict.violations))


def test_one_job_judges_a_run_while_the_next_starts_and_gives_what_runs_one_at_a_time_give(children):
    """Protects ``--jobs 1`` (Session.run_in_turn): while a run's workers go, the run before is
    judged and the run after is prepared (its store, its downstream configuration, its first worker
    process). A user sees the same verdicts, violations and fired faults in the same order as runs
    made one at a time, every run's store dropped and no process left; stopped half way (a Ctrl-C,
    a caller that stops asking), neither the run lived but not judged yet nor the run prepared but
    not started leaves a file or a process."""
    configs = [RunConfig(schedule=chaos.parse(s), workload="single") for s in SCHEDULES[:3]]
    configs.insert(1, RunConfig(schedule=chaos.parse("A@charge.after_call:1*pause"), workload="single",
                                target="mutant:no-fence-check"))
    with Session() as session:
        before = children()
        in_turn = list(session.run_many(configs, jobs=1))
        alone = [session.run(c) for c in configs]
        assert [_seen(r) for r in in_turn] == [_seen(r) for r in alone]
        assert [r.valid for r in in_turn] == [True, False, True, True]
        assert _store_files(session) == [] and children() == before
        stopped = session.run_many(configs, jobs=1)
        assert next(stopped).valid is True  # the second run has lived by now, not been judged
        assert _store_files(session) != []
        stopped.close()
        assert _store_files(session) == [] and children() == before


def test_one_job_runs_a_target_with_hooks_strictly_one_after_the_other(tmp_path):
    """A hook's teardown must come before the next run's setup (they may share the target's own
    state): such a target's runs are not judged while the next starts."""
    import killpoint
    from killpoint.harness.worker import reference

    log = tmp_path / "hooks.log"

    def note(what):
        return lambda run: log.open("a").write(f"{what} {run.run_id.split('-')[0]}\n")

    @killpoint.target(setup=note("setup"), teardown=note("teardown"))
    def target(ctx):
        reference(ctx)

    configs = [RunConfig(schedule=chaos.parse(s), workload="single", target=target) for s in SCHEDULES[:3]]
    with Session() as session:
        results = list(session.run_many(configs, jobs=1))
    assert [r.valid for r in results] == [True, True, True], [r.verdict for r in results]
    lines = log.read_text().split("\n")[:-1]
    assert [line.split()[0] for line in lines] == ["setup", "teardown"] * 3, lines


def test_one_job_judges_each_run_on_its_own_ledger():
    """A false valid the in-turn judging could make: run N judged on run N+1's ledger (one shared
    connection serves every run). A mutant whose duplicate charge only the ledger shows must be
    caught on each of its runs, with a valid reference run between them."""
    configs = [RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single", target=t)
               for t in ("mutant:random-request-id", "reference", "mutant:random-request-id")]
    with Session() as session:
        results = list(session.run_many(configs, jobs=1))
    assert [r.valid for r in results] == [False, True, False], [r.verdict for r in results]
    for r in (results[0], results[2]):
        assert "no_duplicate_effects" in {v.invariant for v in r.verdict.violations}
    # Each run's ledger is its own: two charges where the key changed, one for the reference.
    assert [len(r.history.applied()) for r in results] == [2, 1, 2]


def test_a_run_prepared_while_a_long_one_went_has_its_whole_bound():
    """Protects the bound of a run prepared ahead (``--jobs 1``): it is prepared while the run before
    goes, but its bound counts from its own start. Counted from its preparation, a run after one
    that took longer than the bound would be cut off at once and reported unknown (bound hit)."""
    # The quick run's bound is 100 times what it needs on a quiet machine (a loaded one has room),
    # and still shorter than the slow run it is prepared beside.
    slow = RunConfig(schedule=chaos.parse("A@charge.after_call:sleep(5000)"), workload="single",
                     virtual_time=False)  # 5 s of real time, whatever the clock
    quick = RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single", bound_s=4.0)
    with Session() as session:
        first, second = session.run_many([slow, quick], jobs=1)
    assert first.duration_s >= 5.0
    assert second.valid is True and not second.history.bound_hit, second.verdict


@pytest.mark.parametrize("second", ["to the command", "to its group"])
def test_a_second_sigterm_to_a_two_job_matrix_ends_it_quietly_and_every_process_with_it(tmp_path, second):
    """Protects the end of a --jobs matrix told to stop twice (timeout sends SIGTERM to the command
    and then to its whole group; a supervisor may repeat itself): the second signal landed in the
    ending of the runners and cut it short, so the command said every process was ended while its
    runners went on, finished their run and died on a broken pipe, a traceback each on stderr. Now
    the ending runs to its end (exit 143), a runner whose parent is gone ends quietly, and nothing
    is left. Each run waits out a 3 s lease, so the second signal, 0.3 s after the first, lands
    while the runners are being ended, however slow the machine."""
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from test_processes import ROOT, children_of, wait_until_gone

    marker = f"kp-{uuid.uuid4().hex}"
    env = {**os.environ, "KILLPOINT_TEST_MARK": marker, "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)}
    cli = subprocess.Popen([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--jobs", "2", "-q",
                            "--workload", "single", "--steps", "charge", "--points", "after_call,before_commit",
                            "--actions", "pause", "--real-time", "--timing", "lease-ttl-ms=3000,stuck-bound-ms=6000"],
                           env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)  # its own group, as under timeout
    try:
        deadline = time.monotonic() + HANG_S
        while sum(1 for c in children_of(cli.pid) if children_of(c)) < 2:  # both runners running
            assert cli.poll() is None and time.monotonic() < deadline, cli.stderr.read().decode()[-2000:]
            time.sleep(0.01)
        cli.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        if second == "to the command":
            cli.send_signal(signal.SIGTERM)
        else:
            os.killpg(cli.pid, signal.SIGTERM)
        err = cli.communicate(timeout=HANG_S)[1].decode(errors="replace")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert "every process it started has been ended" in err
    assert wait_until_gone(marker) == []
    assert os.listdir(tmp_path) == []  # the session's folder too


@pytest.mark.parametrize("gone", ["before asking", "before the result"])
def test_a_runner_whose_parent_is_gone_ends_quietly(capfd, gone):
    """Protects stderr when a runner's parent is gone: an EOF on its channel (nothing more will be
    asked) or a broken pipe as it sends a result (no one will read it) ended the runner with a
    traceback multiprocess printed after the command's last line. Now it ends quietly, exit 0."""
    import multiprocess

    from killpoint.harness.jobs import _runner

    fork = multiprocess.get_context("fork")
    configs = [RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single")]
    with Session() as session:
        parent, child = fork.Pipe()
        runner = fork.Process(target=_runner, args=(session, configs, child, os.getpid(), [parent]))
        runner.start()
        child.close()
        if gone == "before the result":
            parent.send(0)  # a run to make; its result finds the channel closed
        parent.close()
        runner.join(30)
    assert runner.exitcode == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err
