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
    assert report["invariants"]["no_duplicate_effects"]["checked"] == report["runs"]
    assert report["invariants"]["effects_accounted"]["checked"] == report["runs"]


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
