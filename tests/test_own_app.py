"""A user's own task-queue app as a target, run as it is: ``celery:PKG.MODULE:NAME`` and
``rq:PKG.MODULE:NAME`` on the worked examples in examples/celery_app and examples/rq_app.

Each example ships its tasks as written (a new request id on every delivery) and fixed (the order's
key): through the CLI, as a user runs it from the example's folder, the first's matrix exits 1 on
``no_duplicate_effects`` alone and the second's exits 0 with every declared point fired (Celery's
signals', RQ's worker's, and the user's own ``killpoint.point`` calls); through the pytest plugin,
each example's own test file passes. Every run leaves nothing in Redis.

As test_queues.py: a library that is not installed skips (``KILLPOINT_REQUIRE_LIBS=1`` fails), and
so does a Redis that is not running (``KILLPOINT_REQUIRE_BROKERS=1`` fails).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hang import HANG_S
from test_libs import assert_naive_caught, fired_points, need
from test_queues import _broker_sockets, _redis, assert_nothing_left, assert_rq_history_judged, namespaces

pytest_plugins = ["pytester"]

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
CELERY, CELERY_FIXED = "celery:shop.tasks:order_flow", "celery:shop.tasks_fixed:order_flow"
RQ, RQ_FIXED = "rq:orders.jobs:place_order", "rq:orders.jobs_fixed:place_order"


@pytest.fixture
def redis_client():
    return _redis()


def killpoint(folder: str, *args: str) -> subprocess.CompletedProcess:
    """``killpoint ARGS`` in the example's folder, as a user runs it there."""
    return subprocess.run([sys.executable, "-m", "killpoint.harness.cli", *args], cwd=os.path.join(EXAMPLES, folder),
                          capture_output=True, text=True, timeout=HANG_S)


def matrix(folder: str, target: str, *more: str) -> tuple[int, dict]:
    done = killpoint(folder, "matrix", "--target", target, "--json", *more)
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def declared_points(folder: str, target: str) -> set[str]:
    code = f"from killpoint.harness.targets import declared; print(','.join(declared({target!r}).points))"
    found = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(EXAMPLES, folder), capture_output=True,
                           text=True, timeout=HANG_S)
    assert found.returncode == 0, found.stderr[-2000:]
    return set(found.stdout.strip().split(","))


def assert_fixed_valid_everywhere(folder: str, target: str, code: int, out: dict) -> None:
    assert (code, out["valid"], out["unknown"]) == (0, True, []), (out["unknown"], out["violations"])
    assert all(not r["unfired"] for r in out["results"])
    assert fired_points(out) == declared_points(folder, target)  # every declared point fired, no other
    assert out["invariants"]["no_duplicate_effects"]["checked"] == out["runs"]


# -- Celery -----------------------------------------------------------------------------------------


def test_celery_app_as_written_is_caught_by_no_duplicate_effects_and_its_fix_is_valid_at_every_point(redis_client):
    need("celery")
    assert declared_points("celery_app", CELERY_FIXED) == {"received", "prerun", "stored", "acked"}
    code, out = matrix("celery_app", CELERY)
    assert_naive_caught(code, out, same_step=False)
    # delivered again after its result was stored, or while frozen past the visibility timeout
    assert {"A@charge_card.stored:kill", "A@charge_card.prerun:1*pause"} <= {v["schedule"] for v in out["violations"]}
    assert_nothing_left(redis_client, out)
    code, out = matrix("celery_app", CELERY_FIXED)
    assert_fixed_valid_everywhere("celery_app", CELERY_FIXED, code, out)
    assert_nothing_left(redis_client, out)


def test_celery_app_settings_are_imposed_for_a_run_and_put_back_after_it(redis_client, monkeypatch):
    """The run's broker, key prefix and visibility timeout while it runs; acks_late and the prefetch
    multiplier stay the app's; the app's own settings are back after teardown, and no connection
    to a broker is left open in the harness (a forked worker would share its socket)."""
    need("celery")
    monkeypatch.chdir(os.path.join(EXAMPLES, "celery_app"))
    monkeypatch.syspath_prepend(os.path.join(EXAMPLES, "celery_app"))
    from killpoint.harness.declaration import TargetRun
    from killpoint.harness.libs import brokers, celery_app

    spec = CELERY_FIXED.partition(":")[2]
    app = celery_app.order(spec).app
    before = {k: app.conf.get(k) for k in ("broker_url", "result_backend", "broker_transport_options")}
    brokers.redis_client(brokers.require_redis())  # this process's own client, connected before
    sockets = _broker_sockets()
    run = TargetRun(run_id="t", run_dir="", namespace=f"kp_test_own_app_{os.getpid()}",
                    workload=celery_app.workload(spec), downstream_url="http://127.0.0.1:1", store="sqlite", seed=0)
    celery_app.setup(run, spec=spec)
    try:
        assert app.conf.broker_url == brokers.redis_url()
        assert app.conf.broker_transport_options["global_keyprefix"] == brokers.redis_prefix(run.namespace)
        assert app.conf.broker_transport_options["visibility_timeout"] < 1
        assert (app.conf.task_acks_late, app.conf.worker_prefetch_multiplier) == (True, 1)  # the app's own
        assert sorted(run.state["tasks"].values()) == [("order-1", "charge_card"), ("order-1", "reserve_stock")]
        assert redis_client.llen(f"{brokers.redis_prefix(run.namespace)}celery") == 1  # the chain's first task
        assert [s for s in _broker_sockets() if s not in sockets] == []
    finally:
        celery_app.teardown(run)
    assert {k: app.conf.get(k) for k in before} == before
    assert list(redis_client.scan_iter(match=f"*{run.namespace}*")) == []


# -- RQ ---------------------------------------------------------------------------------------------


def test_rq_jobs_as_written_are_caught_by_no_duplicate_effects_and_their_fix_is_valid_at_every_point(redis_client):
    need("rq")
    # RQ's moments and the job module's own killpoint.point("after_call")
    assert declared_points("rq_app", RQ_FIXED) == {"started", "after_call", "finished"}
    code, out = matrix("rq_app", RQ)
    assert_naive_caught(code, out)
    caught = {v["schedule"] for v in out["violations"]}
    assert {"A@charge_card.after_call:kill", "A@charge_card.started:1*pause"} <= caught
    assert_rq_history_judged(out)  # RQ's record of the user's jobs, as for rq:*
    assert_nothing_left(redis_client, out)
    code, out = matrix("rq_app", RQ_FIXED)
    assert_fixed_valid_everywhere("rq_app", RQ_FIXED, code, out)
    assert_rq_history_judged(out)
    assert_nothing_left(redis_client, out)
    ours = namespaces(out)
    for global_set in ("rq:workers", "rq:queues"):
        assert not [m for m in redis_client.smembers(global_set) if any(ns in m.decode() for ns in ours)]


# -- through the pytest plugin ----------------------------------------------------------------------


@pytest.mark.parametrize("folder, library", [("celery_app", "celery"), ("rq_app", "rq")])
def test_each_example_suite_passes_through_the_pytest_plugin(pytester, redis_client, folder, library):
    """The example's own test file, run by pytest in a copy of its folder: the marked test's items
    (one per crash point, each valid on the fixed tasks) and the run that catches the tasks as written."""
    need(library)
    before = set(redis_client.scan_iter(match="*killpoint_run*", count=1000))
    shutil.copytree(os.path.join(EXAMPLES, folder), pytester.path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-v",
                                           timeout=HANG_S)
    result.assert_outcomes(passed=6)  # the marked test's 5 items, and the caught run
    result.stdout.fnmatch_lines(["*test_every_crash_of_a_worker_is_recovered_without_a_second_charge?*-pause? PASSED*",
                                 "*6 crash runs in 6 tests: 5 valid, 1 violated, 0 unknown*"])
    # what that session left: keys that stay (another test's run beside it, under pytest -n 2, ends)
    left = set(redis_client.scan_iter(match="*killpoint_run*", count=1000)) - before
    deadline = time.monotonic() + 120
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = {key for key in left if redis_client.exists(key)}
    assert left == set()


@pytest.mark.parametrize("folder, target", [("celery_app", CELERY_FIXED), ("rq_app", RQ_FIXED)])
def test_an_interrupted_run_of_your_own_app_leaves_nothing_in_redis(redis_client, folder, target):
    """Ctrl-C while a worker is frozen in the order's first task: exit 130, the run's keys gone."""
    need(target.split(":")[0])
    first = "A@reserve_stock.prerun:1*pause" if folder == "celery_app" else "A@reserve_stock.started:1*pause"
    proc = subprocess.Popen([sys.executable, "-m", "killpoint.harness.cli", "replay", first, "--target", target, "-q"],
                            cwd=os.path.join(EXAMPLES, folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        seen: set = set()
        while proc.poll() is None and not seen:  # the run's first keys: it is under way
            seen = set(redis_client.scan_iter(match=f"*killpoint_run*_p{proc.pid}_*", count=1000))
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen, "the run made no key before it ended"
    assert proc.returncode == 130
    spaces = {re.search(r"killpoint_run\w+", k.decode()).group(0) for k in seen}
    assert [k for ns in spaces for k in redis_client.scan_iter(match=f"*{ns}*", count=1000)] == []


def test_the_points_a_module_marks_are_its_literal_killpoint_point_calls_in_source_order(tmp_path, monkeypatch):
    from killpoint.harness.libs import apps

    (tmp_path / "marked_jobs.py").write_text(
        "import killpoint\nfrom killpoint import point as mark\n\n"
        "def job(order_id):\n    killpoint.point('before_call')\n    name = 'built'\n"
        "    killpoint.point(name)\n    mark('after_call')\n    killpoint.point('before_call')\n"
        "    other.point('not_ours')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import marked_jobs

    assert apps.user_points([marked_jobs.job]) == ("before_call", "after_call")
    assert apps.step_names(["shop.tasks.charge", "shop.other.charge", "x.9lives"]) == ["charge", "charge-2", "t9lives"]


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, named", [
    ("celery:pkg.mod:nothing", "'celery:pkg.mod:nothing': cannot import 'pkg.mod'"),
    ("celery:shop.tasks:nothing", "'celery:shop.tasks:nothing': 'shop.tasks' has no 'nothing'"),
    ("celery:shop.celery:app", "'celery:shop.celery:app' is a Celery app: name the function"),
    ("celery:shop.tasks:payments", "'celery:shop.tasks:payments': module is not a function or a task"),
])
def test_a_bad_celery_target_is_one_line_naming_it_exit_2(target, named):
    need("celery")
    done = killpoint("celery_app", "matrix", "--target", target, "-q")
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("killpoint: error:") and named in lines[0], lines


def test_a_bad_rq_target_is_one_line_naming_it_exit_2():
    need("rq")
    for target, named in (("rq:pkg.mod:nothing", "cannot import 'pkg.mod'"),
                          ("rq:orders.jobs:reserve_stock", "calling it with a queue and 'order-1' raised")):
        done = killpoint("rq_app", "replay", "A@after_call:kill", "--target", target, "-q")
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and target in lines[0] and named in lines[0], lines


def test_an_rq_job_whose_module_cannot_be_imported_is_one_line_naming_job_and_module_exit_2(tmp_path):
    """Protects: a job enqueued by name whose module cannot be imported was skipped when the points
    were read, so its own ``killpoint.point`` calls went undeclared and were never crashed (a run
    that looked complete). The target is refused instead, naming the job and its module."""
    need("rq")
    (tmp_path / "broken_orders.py").write_text(
        "def place_order(queue, order_id):\n"
        "    queue.enqueue('no_such_package_kp.jobs.charge', order_id)\n")
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@after_call:kill",
                           "--target", "rq:broken_orders:place_order", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("killpoint: error:"), lines
    assert "'no_such_package_kp.jobs.charge'" in lines[0] and "'no_such_package_kp.jobs'" in lines[0], lines
    assert "cannot be imported" in lines[0], lines
