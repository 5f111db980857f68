"""Restate: the order as a Restate workflow on a real server, crashed inside and around ``ctx.run``.

Needs the SDK (``pip install 'killpoint[restate]'``) and the server binary (the npm package
``@restatedev/restate-server-linux-x64``; see the README). Without them these tests skip and say
what is missing; with ``KILLPOINT_REQUIRE_SERVERS=1`` (CI sets it) they fail instead.
"""

from __future__ import annotations

import json
import os

import pytest

from killpoint.harness.cli import main


@pytest.fixture(scope="module")
def restate_server():
    from killpoint.harness.servers import SdkMissing
    from killpoint.harness.servers import restate as r

    try:
        r.sdk()
        return r.server_binary()
    except SdkMissing as exc:
        if os.environ.get("KILLPOINT_REQUIRE_SERVERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_SERVERS=1 but Restate is missing: {exc}", pytrace=False)
        pytest.skip(f"Restate is not installed: {exc}")


def run_json(capsys, *argv):
    code = main(list(argv) + ["--json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


# ---------------------------------------------------------------------------------------------
# the journal as store events (server_history.restate_events), on hand-written journals


def entry(index, at, lite):
    return {"index": index, "at": f"2026-12-07T08:53:{at:06.3f}Z", "lite": json.dumps(lite)}


def run_cmd(index, at, cid, name):
    return entry(index, at, {"Command": {"Run": {"completion_id": cid, "name": name}}})


def run_note(index, at, cid, result="Success"):
    return entry(index, at, {"Notification": {"ty": {"Completion": "Run"}, "id": {"CompletionId": cid},
                                              "result": result}})


INPUT = entry(0, 34.2, {"Command": {"Input": {}}})
OUTPUT = entry(5, 34.9, {"Command": {"Output": {"result": "Success"}}})


def restate_history(journal, errors=(), steps=("reserve", "charge")):
    """The mapping's rows through the parse boundary a target's history() goes through, merged into
    a history as the run loop merges them."""
    from killpoint.harness.events import parse_store_row
    from killpoint.harness.history import merge
    from killpoint.harness.hooks import history_problem
    from killpoint.harness.servers.server_history import restate_events

    rows = restate_events("order-1", journal, steps=list(steps), offset_ns=0, errors=errors)
    for n, row in enumerate(rows):
        parse_store_row(row, index=n)
        assert history_problem(row) is None, row
    return rows, merge({}, rows, [], [], owns_state=True)


def restate_chain(rows, step):
    return [(r["kind"], r.get("from_state"), r["to_state"], r["state_version"]) for r in rows if r["step"] == step]


def test_restate_journal_maps_each_run_to_one_chain_and_counts_the_failures_while_it_was_open():
    """The invocation failed once while charge's ``Run`` was journaled and its result was not: a fact
    about that step (Restate records no attempt per step and drops a repeat of the same error)."""
    from killpoint.harness.checkers import check_all

    error = {"after": 3, "at": "2026-12-07T08:53:34.500Z",
             "json": json.dumps({"ty": "TransientError", "error_message": "stream closed because of a broken pipe"})}
    before = {"after": 2, "at": "2026-12-07T08:53:34.300Z", "json": json.dumps({"error_message": "reset"})}
    rows, h = restate_history([INPUT, run_cmd(1, 34.3, 1, "reserve"), run_note(2, 34.3, 1),
                               run_cmd(3, 34.4, 2, "charge"), run_note(4, 34.8, 2), OUTPUT],
                              errors=[before, error])
    for step in ("reserve", "charge"):
        assert restate_chain(rows, step) == [("created", None, "pending", 1), ("claimed", "pending", "running", 2),
                                             ("committed", "running", "succeeded", 3)]
    assert not any("worker" in r or "attempt" in r or "fence" in r for r in rows)  # Restate records none
    charge = [r for r in rows if r["step"] == "charge"][-1]
    assert (charge["transient_errors"], charge["last_error"]) == (1, "stream closed because of a broken pipe")
    assert not any("transient_errors" in r for r in rows if r["step"] == "reserve")  # failed between steps
    times = [r["t"] for r in rows if r["step"] == "reserve"]
    assert times == sorted(set(times))  # two entries in one millisecond keep their order
    results = {r.invariant: r for r in check_all(h).results}
    for name in ("version_chain", "legal_transitions"):
        assert (results[name].valid, results[name].judged) == (True, True), results[name]


def test_restate_journal_maps_a_refused_step_and_cancels_the_steps_its_invocation_never_ran():
    from killpoint.harness.servers.server_history import final_states_of

    rows, _ = restate_history([INPUT, run_cmd(1, 34.3, 1, "reserve"), run_note(2, 34.4, 1, result="Failure"),
                               OUTPUT])
    assert restate_chain(rows, "reserve")[-1] == ("committed", "running", "failed", 3)
    assert restate_chain(rows, "charge") == [("created", None, "pending", 1), ("committed", "pending", "cancelled", 2)]
    assert final_states_of(rows, [("order-1", "reserve"), ("order-1", "charge")]) == {
        ("order-1", "reserve"): "failed", ("order-1", "charge"): "cancelled"}


def test_restate_journal_that_runs_a_step_twice_is_a_fork_and_an_unmatched_completion_an_error():
    from killpoint.harness.checkers import version_chain
    from killpoint.harness.servers.server_history import restate_events

    _, h = restate_history([INPUT, run_cmd(1, 34.3, 1, "charge"), run_cmd(2, 34.4, 2, "charge")])
    r = version_chain(h)
    assert r.valid is False and "both accepted at state_version 2: a fork" in r.violations[0].detail
    with pytest.raises(ValueError, match="completes Run 7, which the journal does not have"):
        restate_events("order-1", [INPUT, run_note(1, 34.3, 7)], steps=["charge"], offset_ns=0)
    with pytest.raises(ValueError, match="with 'Suspended', neither Success nor Failure"):
        restate_events("order-1", [INPUT, run_cmd(1, 34.3, 1, "charge"), run_note(2, 34.4, 1, result="Suspended")],
                       steps=["charge"], offset_ns=0)


def test_server_config_listens_on_loopback_only_without_telemetry_and_keeps_data_in_its_folder(
        restate_server, tmp_path):
    from killpoint.harness.servers.restate import RestateServer

    server = RestateServer(str(tmp_path / "restate"), binary=restate_server)
    text = open(server.config_path).read()
    for line in ('bind-ip = "127.0.0.1"', 'listen-mode = "tcp"', "disable-telemetry = true",
                 f'base-dir = "{tmp_path / "restate" / "data"}"', 'initial-interval = "50ms"'):
        assert line in text, line
    server.start()
    try:
        assert server.query("SELECT 1 AS one") == [{"one": 1}]
        assert os.path.isdir(tmp_path / "restate" / "data")
        # Each port it listens on is bound to 127.0.0.1 (hex 0100007F in /proc/net/tcp).
        listening = set()
        for line in open("/proc/net/tcp").read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                listening.add(local)
        for port in (server.ingress_port, server.admin_port, server.node_port):
            assert f"0100007F:{port:04X}" in listening
            assert f"00000000:{port:04X}" not in listening
    finally:
        server.kill()


def test_a_runs_service_port_is_held_for_its_workers_and_for_nobody_else():
    """Protects: the port a run's workers listen on is held by the run (bound with SO_REUSEPORT)
    from its setup to its teardown. A port only looked up was free again at once, so another run of
    a ``--jobs`` batch could be handed it while a killed worker's replacement had not bound yet,
    and that run's workers would then have taken this run's invocations."""
    import errno
    import socket

    from killpoint.harness.servers.restate import _listening_socket, reserve_port

    held = reserve_port()
    port = held.getsockname()[1]
    try:
        plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with pytest.raises(OSError) as err:  # what free_port() and a server's own bind do
            plain.bind(("127.0.0.1", port))
        assert err.value.errno == errno.EADDRINUSE
        plain.close()
        worker = _listening_socket(port)  # a worker still binds and serves it
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn, _ = worker.accept()
        for s in (conn, client, worker):
            s.close()
    finally:
        held.close()


def test_restate_naive_matrix_exits_1_with_duplicate_effects_only(restate_server, capsys):
    code, report = run_json(capsys, "matrix", "--target", "restate:naive")
    assert code == 1 and report["valid"] is False
    assert {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}
    duplicated = {r["schedule"] for r in report["results"] if r["valid"] is False}
    # A kill inside ctx.run once the request was applied: Restate retries the run, a new key.
    assert {"A@charge.run_in_call:kill", "A@charge.run_after_call:kill"} <= duplicated
    unfired = [(r["schedule"], r["unfired"], r["valid"]) for r in report["results"] if r["unfired"]]
    assert unfired == [], (unfired, report["unknown"], report["unknown_reasons"])


@pytest.mark.parametrize("point", ["before_run", "run_before_call", "after_run"])
def test_restate_naive_kill_outside_the_call_never_duplicates_the_faulted_step_itself(restate_server, point):
    # The other orders run in the same process at the same time, so the kill may land inside one
    # of their ctx.run closures and duplicate that one; the step the fault was placed on is never
    # duplicated: before its call nothing happened, after ctx.run returned the server has its result.
    from killpoint.chaos.points import POINTS as BUILTIN
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.servers.restate import POINTS

    schedule = parse(f"A@charge.{point}:kill", points=frozenset(BUILTIN) | frozenset(POINTS))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="restate:naive"))
    faulted = [(e.get("instance"), e.get("step")) for e in r.history.events
               if e.kind == "point" and e.get("action") == "kill"]
    assert len(faulted) == 1 and r.unfired == ()
    assert faulted[0] not in {(v.instance, v.step) for v in r.verdict.violations}
    assert {v.invariant for v in r.verdict.violations} <= {"no_duplicate_effects"}


def test_restate_keyed_matrix_exits_0_with_every_declared_point_fired(restate_server, capsys):
    from killpoint.harness.servers.restate import POINTS

    code, report = run_json(capsys, "matrix", "--target", "restate:keyed")
    assert code == 0 and report["valid"] is True and report["violations"] == []
    assert all(r["unfired"] == [] and all(n >= 1 for n in r["fired"].values()) for r in report["results"]), \
        ([(r["schedule"], r["fired"], r["unfired"]) for r in report["results"]], report["unknown_reasons"])
    fired_points = {s.split(".")[1].split(":")[0].split("#")[0] for r in report["results"] for s in r["fired"]}
    assert fired_points == set(POINTS)
    # The ledger's two and terminates, and from the server's journal (history()) the chain's two.
    for name in ("no_duplicate_effects", "effects_accounted", "terminates", "version_chain", "legal_transitions"):
        assert report["invariants"][name]["checked"] == report["runs"], name
    assert report["judged"] == 5


@pytest.mark.parametrize("policy, valid", [("naive", False), ("keyed", True)])
def test_server_crash_and_restart_inside_ctx_run_duplicates_a_random_key_never_a_stable_one(
        restate_server, policy, valid):
    from killpoint.chaos.points import POINTS as BUILTIN
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.servers.restate import POINTS

    fault = "A@charge.run_after_call:1*pause"  # A waits there while the server is killed and restarted
    with Session() as session:
        r = session.run(RunConfig(schedule=parse(fault, points=frozenset(BUILTIN) | frozenset(POINTS)),
                                  target=f"restate:{policy}", restarts={fault: ("target",)}))
    restarts = [e for e in r.history.events if e.process == "harness" and e.kind == "target_restart"]
    assert len(restarts) == 1 and restarts[0].get("ok") is True
    assert r.unfired == () and r.verdict.valid is valid
    if not valid:
        assert {v.invariant for v in r.verdict.violations} == {"no_duplicate_effects"}


def test_restate_history_is_read_from_the_servers_journal_and_judges_the_chain_invariants(restate_server):
    """Protects: history() maps what the Restate server journaled of a real run, an order's steps
    created with its input, claimed with their ``Run``, committed with its result, so that
    version_chain and legal_transitions judge the server's own record (3 of 15 invariants judged
    without it)."""
    from killpoint.chaos.points import POINTS as BUILTIN
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.servers.restate import POINTS

    schedule = parse("A@charge.run_after_call:kill", points=frozenset(BUILTIN) | frozenset(POINTS))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="restate:keyed"))
    assert r.verdict.valid is True and r.unfired == (), r.verdict.unknown_reasons
    judged = {x.invariant for x in r.verdict.results if x.judged}
    assert judged == {"no_duplicate_effects", "effects_accounted", "terminates", "version_chain",
                      "legal_transitions"}
    store = [e for e in r.history.events if e.process == "store"]
    assert store and all(e.get("source") == "restate" for e in store)
    for inst in ("order-1", "order-2", "order-3"):
        for step in ("reserve", "charge"):
            got = [(e.kind, e.get("to_state")) for e in store if (e.get("instance"), e.get("step")) == (inst, step)]
            assert got == [("created", "pending"), ("claimed", "running"), ("committed", "succeeded")], (inst, step)
