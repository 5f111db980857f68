"""The run clock: database time plus the run's offset, waits the harness can see, and autojump.

The store tests run on both backends; the jump tests drive the harness's side (RunClock) by hand
against real threads waiting through the worker's side (Clock); the end-to-end tests run the real
loop with production-like timings and compare the virtual clock with ``--real-time``.
"""

from __future__ import annotations

import contextlib

import json
import threading
import time

import pytest

from killpoint import chaos
from killpoint.harness import states
from killpoint.harness.cli import main
from killpoint.harness.clock import BUSY, FREE, WAIT, RunClock
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.store import open_store
from killpoint.harness.worker import _EXPIRY_MARGIN_S, REAL_TIME_TIMING, Timing
from hang import HANG_S

INSTANCES = [{"id": "order-1", "format_version": 1, "fingerprint": "fp", "data": "{}", "integrity": "ih",
              "steps": ["charge"]}]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    spec = request.getfixturevalue("pg_dsn") if request.param == "postgres" else "sqlite"
    s = open_store(spec, str(tmp_path), "clock")
    s.setup(INSTANCES)
    yield s
    s.drop()


def test_store_time_is_database_time_plus_the_run_offset_and_leases_expire_by_it(store):
    before = store.now()
    row = store.steps()[0]
    a = store.claim("order-1", "charge", "A", expected_state_version=row["state_version"],
                    from_state=states.PENDING, to_state=states.RUNNING, ttl_ms=30_000.0)
    assert a is not None
    row = store.steps()[0]
    # Within its lease, B cannot take the step ...
    assert store.claim("order-1", "charge", "B", expected_state_version=row["state_version"],
                       from_state=states.RUNNING, to_state=states.RUNNING, ttl_ms=30_000.0) is None
    store.set_clock(3600.0)
    assert 3599.0 < store.now() - before < 3700.0
    # ... an hour of the run's time later it can: the same statement compared the moved time.
    b = store.claim("order-1", "charge", "B", expected_state_version=row["state_version"],
                    from_state=states.RUNNING, to_state=states.RUNNING, ttl_ms=30_000.0)
    assert b is not None and b.fence == a.fence + 1
    assert store.steps()[0]["expires_at"] > before + 3600.0


def _waiter(clock, seconds: float, seen: dict) -> threading.Thread:
    def body() -> None:
        start = clock.now()
        clock.sleep(seconds)
        seen["waited"] = clock.now() - start
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def _serve(run_clock: RunClock, index: int, until, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not until():
        assert time.monotonic() < deadline, "the wait did not end"
        run_clock.notices()
        timeout = run_clock.service([index], False, quiet=lambda: True)
        time.sleep(min(timeout, 0.005))


@contextlib.contextmanager
def _clocked(tmp_path, name: str, *, virtual: bool):
    """A run's store and its run clock (two worker blocks), both ended afterwards."""
    store = open_store("sqlite", str(tmp_path), name)
    store.setup(INSTANCES)
    run_clock = RunClock(virtual=virtual, capacity=2, set_store_offset=store.set_clock)
    try:
        yield store, run_clock
    finally:
        run_clock.close()
        store.drop()


def test_autojump_ends_a_30_s_wait_without_waiting_it_out_and_moves_the_store_with_it(tmp_path):
    with _clocked(tmp_path, "jump", virtual=True) as (store, run_clock):
        index = run_clock.add_worker()
        run_clock.board.set(index, 0, FREE)  # no business thread here: only the waiter below
        clock = run_clock.worker_clock(index)
        seen: dict = {}
        db_before, wall = store.now(), time.monotonic()
        t = _waiter(clock, 30.0, seen)
        _serve(run_clock, index, lambda: not t.is_alive())
        assert seen["waited"] >= 30.0
        assert time.monotonic() - wall < 30.0  # not waited out (autojump), however loaded the machine
        # The store's time moved with the offset, to within its clock's resolution (SQLite's
        # julianday('now') ticks in milliseconds and a double of days holds tens of microseconds).
        assert store.now() - db_before >= 30.0 - _EXPIRY_MARGIN_S
        assert run_clock.jumps and run_clock.virtual_ns(time.monotonic_ns()) > time.monotonic_ns() + 29e9


def test_a_busy_thread_holds_the_run_clock_and_real_time_still_flows(tmp_path):
    with _clocked(tmp_path, "busy", virtual=True) as (store, run_clock):
        index = run_clock.add_worker()  # slot 0 stays BUSY: the business thread is working
        clock = run_clock.worker_clock(index)
        seen: dict = {}
        t = _waiter(clock, 0.3, seen)
        _serve(run_clock, index, lambda: not t.is_alive())
        assert run_clock.jumps == [] and run_clock.offset_s() == 0.0
        assert seen["waited"] >= 0.3  # it waited out its 0.3 s in real time
        assert run_clock.board.state(index, 0)[0] == BUSY


def test_the_real_time_clock_never_jumps_even_when_every_thread_waits(tmp_path):
    with _clocked(tmp_path, "real", virtual=False) as (store, run_clock):
        index = run_clock.add_worker()
        run_clock.board.set(index, 0, FREE)
        clock = run_clock.worker_clock(index)
        seen: dict = {}
        t = _waiter(clock, 0.2, seen)
        _serve(run_clock, index, lambda: not t.is_alive())
        assert run_clock.jumps == [] and seen["waited"] >= 0.2


def test_a_clock_event_wakes_its_waiter_and_marks_it_busy_first(tmp_path):
    with _clocked(tmp_path, "event", virtual=True) as (store, run_clock):
        index = run_clock.add_worker()
        clock = run_clock.worker_clock(index)
        event = clock.event()
        got: dict = {}
        t = threading.Thread(target=lambda: got.setdefault("set", event.wait()), daemon=True)
        t.start()
        deadline = time.monotonic() + HANG_S
        while run_clock.board.state(index, 1)[0] != WAIT:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        wakes = run_clock.board.wakes(index)
        event.set()
        # The setter marked the waiter busy and counted a wake before the waiter ran: a harness
        # reading the slots around it cannot see every thread waiting at once.
        assert run_clock.board.wakes(index) == wakes + 1
        t.join(10)
        assert got == {"set": True}
        assert run_clock.board.state(index, 1)[0] == BUSY


def test_a_hang_with_production_timings_is_flagged_in_run_time_at_no_wall_cost():
    # Stuck bound 60 s, heartbeat 10 s, lease 30 s: the run's time passes the bound, the wall does not.
    with Session() as session:
        config = RunConfig(schedule=chaos.parse("A@charge.before_call:hang"), workload="single")
        assert config.timing == Timing() and config.timing.stuck_bound_ms == 60_000.0
        wall = time.monotonic()
        result = session.run(config)
        wall = time.monotonic() - wall
    assert result.valid is True, result.verdict
    stuck = next(r for r in result.verdict.results if r.invariant == "stuck_detected")
    assert stuck.checked and stuck.valid
    flags = result.history.of("store", "stuck_flagged")
    hang = next(e for e in result.history.of("A", "point") if e.get("action") == "hang")
    assert flags and 60e9 <= flags[0].time - hang.time <= 100e9  # flagged past the bound, in time
    assert wall < 60.0  # less than the minute of the bound: it was never waited out


def test_real_time_runs_use_the_short_timings_and_take_over_in_real_time():
    config = RunConfig(virtual_time=False)
    assert config.timing == REAL_TIME_TIMING
    assert RunConfig().with_clock(False).timing == REAL_TIME_TIMING
    custom = Timing(lease_ttl_ms=50.0)
    assert RunConfig(timing=custom).with_clock(False).timing == custom  # a chosen timing stays
    with Session(real_time=True) as session:
        result = session.run(RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), workload="single"))
    assert result.valid is True and result.config.virtual_time is False
    claims = result.history.of("store", "claimed")
    # The takeover waited out the real 120 ms lease: no offset moved the history's times.
    assert len(claims) == 2 and 0.1e9 <= claims[1].time - claims[0].time < 30e9


def _selftest(*extra: str, capsys) -> dict:
    code = main(["selftest", "--quick", "--json", *extra])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    return report


def test_selftest_gives_the_same_verdicts_on_the_virtual_clock_and_in_real_time(capsys):
    virtual = _selftest(capsys=capsys)
    real = _selftest("--real-time", capsys=capsys)

    def verdicts(report: dict) -> list:
        return [(m["name"], m["caught"], sorted(m["violated"])) for m in report["mutants"]]
    assert verdicts(virtual) == verdicts(real)
    assert virtual["reference"]["valid"] is True and real["reference"]["valid"] is True
    assert virtual["score"] == real["score"]


# -- stalls against the stuck monitor ------------------------------------------------------------
@pytest.mark.parametrize("virtual", [True, False], ids=["virtual", "real-time"])
def test_stalls_clear_of_the_warned_window_are_flagged_or_not_the_same_way_every_run(virtual):
    """What the warning about a racy stall promises: below its window a stall is never flagged,
    above it always is (here with two workers, so one is left to run the monitor), on both clocks.
    Three seeds each; a stall's verdict stays valid on the reference either way."""
    timing = Timing() if virtual else REAL_TIME_TIMING
    lo, hi = timing.stuck_race_ms
    outcomes = {}
    with Session() as session:
        for ms, label in ((int(lo * 0.9), "short"), (int(hi * 1.2), "long")):
            configs = [RunConfig(schedule=chaos.parse(f"A@charge.after_call:1*sleep({ms})"), seed=seed,
                                 virtual_time=virtual) for seed in range(3)]
            results = list(session.run_in_turn(configs))
            assert all(r.valid is True for r in results), [r.verdict.violations for r in results]
            outcomes[label] = [any(e.kind == "stuck_flagged" for e in r.history.events) for r in results]
    assert outcomes == {"short": [False] * 3, "long": [True] * 3}


def test_a_stall_is_warned_about_only_where_it_races_the_stuck_monitor_holding_a_lease():
    """The window runs from just short of the stuck bound to a check period (a quarter of the
    bound) past it, on the timing the run uses; only a point where a lease is held (or a target's
    own point, which may hold one) can race."""
    def warned(text, **kw):
        return RunConfig(schedule=chaos.parse(text, points=chaos.POINTS | {"own_point"}), **kw).racy_stalls()

    assert Timing().stuck_race_ms == (57_000.0, 78_000.0)
    assert REAL_TIME_TIMING.stuck_race_ms == (285.0, 390.0)
    (line,) = warned("A@charge.after_call:1*sleep(60000)")
    assert "sleep(60000)" in line and "A@charge.after_call:1*sleep(60000)" in line
    assert "57000 to 78000 ms" in line and "60000 ms stuck bound" in line
    assert warned("A@charge.after_call:1*sleep(45000)") == ()  # short of it: never flagged
    assert warned("A@charge.after_call:1*sleep(90000)") == ()  # past it: flagged every time
    assert warned("A@charge.before_claim:1*sleep(60000)") == ()  # no lease held there
    assert len(warned("A@own_point:1*sleep(60000)")) == 1
    assert len(warned("A@charge.after_claim:1*sleep(300),B@charge.before_commit:sleep(350)",
                      virtual_time=False)) == 2
    assert warned("A@charge.after_claim:1*sleep(60000)", virtual_time=False) == ()
    custom = Timing(stuck_bound_ms=10_000.0)
    assert len(warned("A@charge.after_call:1*sleep(11000)", timing=custom)) == 1
    # What explore draws keeps clear of it, on both clocks.
    from killpoint.chaos.strategies import stall_durations

    for timing in (Timing(), REAL_TIME_TIMING, custom):
        lo, hi = timing.stuck_race_ms
        assert not [ms for ms in stall_durations(timing.lease_ttl_ms, timing.stuck_bound_ms) if lo <= ms <= hi]
