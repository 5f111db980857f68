"""What one run is: :class:`RunConfig`, checked when it is made, and the one line that replays it.

Its own room because a configuration is a value, made and checked long before any process starts
(by the commands, the pytest plugin, exploration), and read by everything that runs one. Users import
it from :mod:`killpoint.harness.run` (or as ``killpoint.RunConfig``), which re-exports it.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from killpoint.chaos.schedule import Schedule
from killpoint.errors import InvalidConfig
from killpoint.harness import downstream as ds
from killpoint.harness.redact import redact
from killpoint.harness.settings import Settings, find, load
from killpoint.harness.store.base import Store
from killpoint.harness.targets import WorkerFn, declared
from killpoint.harness.worker import REAL_TIME_TIMING, Timing
from killpoint.harness.workload import Workload

__all__ = ["RunConfig", "off_the_run_clock"]


def _owns_state(target: Any) -> bool:
    """Whether ``target`` declares that it keeps its state in a system of its own."""
    if isinstance(target, str) and (target == "reference" or target.startswith("mutant:")):
        return False
    try:
        return bool(declared(target).owns_state)
    except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
        return False


def off_the_run_clock(target: Any) -> bool:
    """Whether ``target`` keeps its state, and its leases' times, in a system of its own whose clock
    the run clock cannot move: it owns its state and does not declare ``run_clock=True``."""
    if not _owns_state(target):
        return False
    try:
        return not declared(target).run_clock
    except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
        return True


@dataclass(frozen=True)
class RunConfig:
    schedule: Schedule = field(default_factory=Schedule)
    target: "str | WorkerFn" = "reference"
    # A built-in name or pkg.module:function; None: the target's own (orders for the reference and
    # the mutants, plain for a user's target unless it declares one).
    # (A killpoint.Workload built in code is taken too: it becomes workload_spec, this its name.)
    workload: str | None = None
    workers: int = 2
    seed: int = 0
    store: str = "sqlite"
    # None: the default for the clock -- production-like (Timing()) on the virtual clock,
    # REAL_TIME_TIMING with it off. Always a Timing once the config is made.
    timing: Timing = None  # type: ignore[assignment]  # resolved in __post_init__
    bound_s: float = 30.0  # wall seconds; the run's own time is bounded too (virtual_bound_s)
    # The run clock (harness.clock): True moves the run's time past waits when every worker waits,
    # so leases and bounds cost no wall time; False (--real-time) is plain real time.
    virtual_time: bool = True
    same_identity: float = 0.5  # chance that a killed worker comes back under its own identity
    # Merged over the workload's downstream configuration, e.g. {"ignore_intent": True}; a
    # ``mutant:NAME`` target's own downstream overrides are applied first.
    downstream_overrides: Mapping[str, Any] = field(default_factory=dict)
    # A workload built in code (a scenario's own); ``workload`` is then only its name.
    workload_spec: Workload | None = None
    # Called once the run is quiescent, before judging: an outside actor (an operator resolving a
    # step in manual review) acts on the store or the downstream, and the history records it.
    after_quiescent: "Callable[[Store, ds.DownstreamClient], None] | None" = None
    # What the harness restarts when a fault fires, by the fault's text: ``target`` (the target's own
    # server, through its restart() hook), ``downstream`` (same
    # ledger, same port) and/or ``store`` (every connection to it cut: the live workers are killed
    # and replaced, the harness reopens its handle). A worker paused by that fault is released at
    # once, without SIGSTOP: it only waited for the restart.
    restarts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check()
        if self.timing is None:
            # A mutant whose bug shows only with one period short next to a step's work brings its
            # own timings, wherever it runs (matrix, replay, explore, the plugin), on either clock.
            if isinstance(self.target, str) and self.target.startswith("mutant:"):
                from killpoint.harness.mutants import timing_for

                object.__setattr__(self, "timing", timing_for(self.target))
        if self.timing is None:
            # A target that owns its state keeps its leases and heartbeats in its own system, on that
            # system's clock, which the run clock cannot move: it runs in real time, with the short
            # timings, unless it declares that it reads its time from ctx.clock (run_clock=True).
            if self.virtual_time and off_the_run_clock(self.target):
                object.__setattr__(self, "virtual_time", False)
            object.__setattr__(self, "timing", Timing() if self.virtual_time else REAL_TIME_TIMING)

    def _check(self) -> None:
        """Refuse a field no run can have, naming it (:class:`InvalidConfig`, exit 2 in the CLI)."""
        def bad(name: str, why: str) -> InvalidConfig:
            return InvalidConfig(f"RunConfig({name}={getattr(self, name)!r}): {why}")

        from killpoint.harness import inputs  # the words the command line and the plugin use

        if (isinstance(self.workers, bool) or not isinstance(self.workers, numbers.Integral)
                or not 1 <= self.workers <= inputs.MAX_WORKERS):
            raise bad("workers", inputs.WORKERS_WORDS)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise bad("seed", inputs.SEED_WORDS)
        if (isinstance(self.bound_s, bool) or not isinstance(self.bound_s, (int, float))
                or not 0 < self.bound_s <= 86_400):
            raise bad("bound_s", "give a number of seconds above 0 and at most 86400 (a day)")
        if (isinstance(self.same_identity, bool) or not isinstance(self.same_identity, (int, float))
                or not 0 <= self.same_identity <= 1):
            raise bad("same_identity", "give a probability from 0 to 1")
        if self.timing is not None and not isinstance(self.timing, Timing):
            raise bad("timing", "give a killpoint.Timing (its fields in milliseconds)")
        if isinstance(self.workload, Workload):
            # A workload built in code, as the fixture's ``workload=`` takes one: it is the run's
            # workload_spec, and ``workload`` its name.
            if self.workload_spec is not None and self.workload_spec is not self.workload:
                raise bad("workload", "give a workload built in code as workload or as workload_spec, not both")
            object.__setattr__(self, "workload_spec", self.workload)
            object.__setattr__(self, "workload", self.workload.name)
        if self.workload is not None and not isinstance(self.workload, str):
            raise bad("workload", "give a built-in name, 'pkg.module:function' or a killpoint.Workload")
        if self.workload_spec is not None and not isinstance(self.workload_spec, Workload):
            raise bad("workload_spec", "give a killpoint.Workload")
        if self.schedule is None:  # no faults (a template config, its schedules set later)
            object.__setattr__(self, "schedule", Schedule())
        if not isinstance(self.schedule, Schedule):
            raise bad("schedule", "give a Schedule (killpoint.parse_schedule(text))")

    def with_clock(self, virtual: bool) -> "RunConfig":
        """The same run on the virtual clock or off it; a default timing follows the clock."""
        if virtual == self.virtual_time:
            return self
        timing = self.timing
        if timing == (Timing() if self.virtual_time else REAL_TIME_TIMING):
            timing = Timing() if virtual else REAL_TIME_TIMING
        return dataclasses.replace(self, virtual_time=virtual, timing=timing)

    def warnings(self) -> tuple[str, ...]:
        """What to warn about before the run, one line each: a stall that races the stuck monitor
        (:meth:`racy_stalls`), and a heartbeat not shorter than the lease (a live worker then loses
        its lease between two renewals, and every step longer than the lease is taken over)."""
        lines = list(self.racy_stalls())
        timing = self.timing
        if timing.heartbeat_ms >= timing.lease_ttl_ms:
            lines.append(f"timing heartbeat-ms {timing.heartbeat_ms:g} is not shorter than lease-ttl-ms "
                         f"{timing.lease_ttl_ms:g}: a live worker's lease runs out between two renewals, "
                         f"so any step longer than the lease is taken over from a healthy worker; "
                         f"give a heartbeat a third of the lease or less")
        return tuple(lines)

    def racy_stalls(self) -> tuple[str, ...]:
        """What to warn about in the schedule: a ``sleep`` whose end races the stuck monitor
        (:attr:`Timing.stuck_race_ms`) where a lease is held (a point of the protocol that holds
        one, or a point of the target's own, which may), one line each, naming the value."""
        from killpoint.chaos.generator import LEASE_HELD
        from killpoint.chaos.points import POINTS

        lo, hi = self.timing.stuck_race_ms
        lines = []
        for fault in self.schedule.faults:
            if fault.point in POINTS and fault.point not in LEASE_HELD:
                continue
            for term in fault.actions.terms:
                if term.action == "sleep" and term.arg is not None and lo <= term.arg <= hi:
                    lines.append(
                        f"sleep({term.arg}) in {fault} ends where the stuck monitor's flag races it "
                        f"({lo:.0f} to {hi:.0f} ms with a {self.timing.stuck_bound_ms:.0f} ms stuck "
                        f"bound): whether the lease is flagged, and so the verdict, can differ between "
                        f"runs of the same seed; keep a stall below {lo:.0f} ms or above {hi:.0f} ms")
        return tuple(lines)

    @property
    def virtual_bound_s(self) -> float:
        """The most run time (database time) a run may take: ``bound_s`` counted in stuck windows
        (bound plus slack) as the real-time timings have them, so a run that waits for ever on
        the virtual clock ends after as many windows as it would in real time, in about as many
        jumps, and a hang nobody flags is still judged."""
        t, real = self.timing, REAL_TIME_TIMING
        window = (t.stuck_bound_ms + t.stuck_slack_ms) / (real.stuck_bound_ms + real.stuck_slack_ms)
        return self.bound_s * max(1.0, window)

    @property
    def io_bound_s(self) -> float:
        """The most any one wait on a service over the network may last, in real seconds: connecting
        to the PostgreSQL store, a statement's answer, COMMIT's. A third of the run's bound, from 5
        to 30 s (10 s for the default 30 s bound): far above what a statement takes on a loaded
        machine, short enough that a partition ends the run well inside its bound."""
        return min(30.0, max(5.0, self.bound_s / 3))

    @property
    def workload_name(self) -> str:
        """The workload the run uses: ``workload``, or the target's default."""
        from killpoint.harness.workload import default_for

        if self.workload_spec is not None:
            return self.workload_spec.name
        if self.workload:
            return self.workload
        try:
            own = declared(self.target)
        except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
            own = None
        return default_for(self.target, own)

    @property
    def target_name(self) -> str:
        t = self.target
        return t if isinstance(t, str) else f"{getattr(t, '__module__', '?')}:{getattr(t, '__qualname__', '?')}"

    def reproduce_command(self) -> str:
        """The one ``killpoint replay`` line that runs this configuration again: shell-quoted, the
        store's password hidden (:func:`killpoint.harness.redact.redact`)."""
        # A setting is named when it is not killpoint's default, or when the [tool.killpoint] table
        # a replay started here would read sets it (the table would otherwise give its own value).
        table = _project_table()
        parts = ["killpoint", "replay", str(self.schedule), "--target", self.target_name,
                 "--seed", str(self.seed)]
        if self.workers != 2 or "workers" in table.values:
            parts += ["--workers", str(self.workers)]
        built = self.workload_spec is not None and not _named_as(self.workload_spec, self.seed)
        if built or self.workload_name != RunConfig(target=self.target).workload_name \
                or "workload" in table.values:
            parts += ["--workload", self.workload_name]
        if self.store != "sqlite" or "store" in table.values:
            parts += ["--store", redact(self.store)]  # before quoting: '***' must be quoted
        if self.same_identity != 0.5:  # the restart rule decides who recovers: it is part of the run
            parts += ["--same-identity", f"{self.same_identity:g}"]
        if not self.virtual_time:  # the clock is part of the run too
            parts += ["--real-time"]
        elif "real_time" in table.values:
            parts += ["--no-real-time"]
        default = Timing() if self.virtual_time else REAL_TIME_TIMING
        named = [f.name for f in dataclasses.fields(Timing)
                 if getattr(self.timing, f.name) != getattr(default, f.name) or f.name in table.timing]
        if named:  # --timing replaces the table's timings whole: the others take the clock's default
            parts += ["--timing", ",".join(f"{n.replace('_', '-')}={getattr(self.timing, n):g}" for n in named)]
        line = " ".join(shlex.quote(p) for p in parts)
        # What a command line cannot name: said after the command, so that the line does not pass
        # for a replay of this run (it would fail to import the target, or run another workload).
        notes = []
        if not isinstance(self.target, str) and "<" in self.target_name:
            notes.append(f"the target {self.target_name} is defined inside a function")
        if built:
            notes.append(f"the workload {self.workload_name} was built in code")
        if notes:
            line += f"  # {' and '.join(notes)}: give it as pkg.module:function to replay this run"
        return redact(line)


def _project_table() -> Settings:
    """The ``[tool.killpoint]`` table a ``killpoint replay`` started in this directory would read
    (empty when there is none, or it cannot be read: the replay then says why itself)."""
    try:
        path = find()
        stamp = os.stat(path).st_mtime_ns if path is not None else 0
    except OSError:
        return Settings()
    return _table_at(path, stamp) if path is not None else Settings()


@functools.lru_cache(maxsize=8)
def _table_at(path: str, stamp: int) -> Settings:
    try:
        return load(path=path)
    except Exception:  # noqa: BLE001 - a broken table is the replay's to report
        return Settings()


def _named_as(workload: Workload, seed: int) -> bool:
    """Whether ``workload`` is what its name resolves to (a built-in name or pkg.module:function
    giving the same instances), so that ``--workload NAME`` replays it."""
    from killpoint.harness.workload import resolve_workload

    try:
        return resolve_workload(workload.name, seed) == workload
    except Exception:  # noqa: BLE001 - InvalidWorkload, or a user's function that fails: names nothing
        return False
