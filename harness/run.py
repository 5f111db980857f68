"""One run: a store, the downstream, N worker processes forked from this warm parent, a schedule.

A :class:`Session` holds what many runs share (the downstream process, a folder); :meth:`Session.run`
takes a :class:`RunConfig` and gives a :class:`RunResult`. The run is three jobs, each in a module of
its own: :mod:`killpoint.harness.supervise` starts, pauses, resumes and ends the worker processes
(the only place that starts them), :mod:`killpoint.harness.messages` is the protocol the workers
speak to the harness, and :mod:`killpoint.harness.judge` turns what happened into a verdict.

The configuration (:class:`RunConfig`) lives in :mod:`killpoint.harness.run_config` and one run's
life (:class:`RunResult` and the run itself) in :mod:`killpoint.harness.lifecycle`; both are
re-exported here, the module users import them from.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import Any, Callable, Iterator, Sequence

from killpoint.errors import KillpointWarning
from killpoint.harness import downstream as ds
from killpoint.harness import signals
from killpoint.harness.lifecycle import Meanwhile, Run, RunResult, Settling
from killpoint.harness.run_config import RunConfig
from killpoint.harness.starts import WorkerProcess, kill

__all__ = ["RunConfig", "RunResult", "Session", "run_files_dir"]


# A folder in memory for run files, when the machine has one with room to spare (Linux's /dev/shm).
_SHM = "/dev/shm"
_SHM_MIN_FREE = 1 << 30


def run_files_dir() -> str | None:
    """Where a session that keeps nothing puts its run files: memory (``/dev/shm``) when it is there,
    writable and has a GiB free, unless ``TMPDIR`` names a place; else None (the temporary folder).

    A run's store, journals and the downstream's ledger are written and thrown away in milliseconds.
    On a disk every SQLite file created, checkpointed and deleted costs fsyncs and the file system's
    own journal: measured here, 50 write transactions took 37 ms on a disk against 9 ms in memory.
    Runs kill processes, never the machine, so what a killed process wrote survives in memory as
    it would on a disk: the verdicts are the same."""
    if os.environ.get("TMPDIR") or os.environ.get("KILLPOINT_NO_SHM"):
        return None
    try:
        if not (os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK)):
            return None
        st = os.statvfs(_SHM)
    except OSError:
        return None
    return _SHM if st.f_bavail * st.f_frsize >= _SHM_MIN_FREE else None


class Session:
    """Services shared by many runs: the downstream process and a folder for run files.

    Use it as a context manager: leaving it ends every process it started.
    """

    def __init__(self, base_dir: str | None = None, *, keep: bool = False, real_time: bool = False,
                 downstream: "ds.DownstreamProcess | None" = None):
        self.real_time = real_time  # every run with the clock off (--real-time), whatever its config
        self._own_dir = base_dir is None
        # Held while made: a signal raised inside mkdtemp (or inside the first gettempdir()'s probe
        # file) would leave what it made without a name to remove it by; from then on, any failure
        # to start the session removes the folder.
        self.base_dir = base_dir or ""
        try:
            with signals.sigint_deferred():  # a signal held here is raised inside the try
                self.base_dir = base_dir or tempfile.mkdtemp(prefix="killpoint-",
                                                             dir=None if keep else run_files_dir())
            os.makedirs(self.base_dir, exist_ok=True)
            self.keep = keep
            # A downstream given is borrowed (a --jobs runner shares its parent's): never stopped here.
            self._own_downstream = downstream is None
            self._runs = 0
            self._live: dict[int, WorkerProcess] = {}
            self._client: ds.DownstreamClient | None = None  # the harness's connections, for every run
            self.downstream = downstream or ds.start(os.path.join(self.base_dir,
                                                                  "downstream-ledger.sqlite"))
        except BaseException:
            if self._own_dir and self.base_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)
            raise

    def client_for(self, run_id: str) -> ds.DownstreamClient:
        """The harness's client of ``run_id``, over the session's connection to the downstream."""
        if self._client is None or self._client.url != self.downstream.url:
            if self._client is not None:
                self._client.close()
            self._client = ds.DownstreamClient(self.downstream.url, "session")
        return self._client.for_run(run_id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        # Signals held until the session is gone: one raised halfway (a Ctrl-C as a matrix ends)
        # skipped the rest, and the session's folder stayed. It is raised once everything is ended.
        with signals.sigint_deferred():
            try:
                for w in list(self._live.values()):
                    kill(w)
                self._live.clear()
                if self._client is not None:
                    self._client.close()
                    self._client = None
                if self._own_downstream:
                    self.downstream.stop()
            finally:
                if self._own_dir and not self.keep:
                    shutil.rmtree(self.base_dir, ignore_errors=True)
            signals.drop_repeats()

    def run(self, config: RunConfig, *, number: int | None = None) -> RunResult:
        """Run ``config``; ``number`` is the run's number in its id (default: the next of this
        session's), given by a ``--jobs`` runner so that ids stay unique across runners."""
        _warn_before_runs([config])
        return self._new_run(config, number).execute()

    def reserve(self, count: int) -> int:
        """Take ``count`` run numbers for runs made elsewhere (``--jobs`` runners); returns the
        number before the first of them."""
        base = self._runs
        self._runs += count
        return base

    def _new_run(self, config: RunConfig, number: int | None = None) -> "Run":
        signals.check()  # a Ctrl-C swallowed where it landed ends the session before another run
        if self.real_time:
            config = config.with_clock(False)
        if number is None:
            self._runs += 1
            number = self._runs
        # Numbered for people, with a random tail so that no other process can guess a live run's id.
        run_id = f"run{number:04d}-s{config.seed}-{secrets.token_hex(4)}"
        return Run(self, config, run_id)

    def run_in_turn(self, configs: "Sequence[RunConfig]") -> "Iterator[RunResult]":
        """Run ``configs`` one at a time and yield their results in order. While a run's workers
        need nothing of the harness, the harness judges the run before it and prepares the run
        after it (its folder, store, downstream configuration and first worker process): gathering
        and judging a history, and setting a run up, take the harness milliseconds that the
        workers of the run going need no harness for. Only for targets without hooks, whose runs
        share nothing in this process (a hook's teardown would otherwise come after the next run's
        setup); the others run one after the other, as :meth:`run`."""
        _warn_before_runs(configs)
        unsettled: list[Run] = []  # lived, not judged yet
        ahead: Run | None = None  # the next run, made (and prepared) while this one goes
        going: Run | None = None  # the run living now, until it is among the unsettled or judged
        try:
            for i, config in enumerate(configs):
                run = going = ahead if ahead is not None else self._new_run(config)
                ahead = None
                before = Settling(unsettled.pop(0)) if unsettled else None
                try:
                    if run.deferrable():
                        if i + 1 < len(configs):
                            try:
                                ahead = self._new_run(configs[i + 1])
                            except Exception:  # noqa: BLE001 - raised again in its turn, after this run
                                ahead = None
                        run.live(Meanwhile(before.step if before is not None else None,
                                           _unless_broken(run, ahead.prepare_step)
                                           if ahead is not None and ahead.deferrable() else None))
                        going = None
                        if run.broke:
                            # Its infrastructure failed (the store or downstream silent, the disk
                            # full): its result is in hand, said now, and the run after is not set
                            # up against the same failure (each piece would wait out its own bound).
                            result = run.settle()
                            if ahead is not None:
                                ahead.cleanup()
                                ahead = None
                        else:
                            unsettled.append(run)
                            result = None
                    else:
                        if before is not None:
                            before.finish()
                        result = run.execute()
                        going = None
                finally:
                    if before is not None and before.result is None:
                        unsettled.insert(0, before.run)  # cut short: cleaned up below
                if before is not None:
                    assert before.result is not None
                    yield before.result
                if result is not None:
                    yield result
            while unsettled:
                yield unsettled.pop(0).settle()
        finally:
            # Interrupted, or the caller stopped asking: the runs not judged, the one living (an
            # interruption while it finished the next run's preparation, after its own workers
            # ended, once left its tables behind) and the one prepared ahead.
            for run in unsettled:
                run.cleanup()
            if going is not None:
                going.cleanup()
            if ahead is not None:
                ahead.cleanup()

    def run_many(self, configs: "Sequence[RunConfig]", *, jobs: int = 1) -> "Iterator[RunResult]":
        """Run independent configurations, ``jobs`` at a time (each job a process of its own);
        yields their results in the order of ``configs``."""
        from killpoint.harness.jobs import run_many

        _warn_before_runs(configs)  # here, not in the runner processes, whose warnings nobody catches
        return run_many(self, configs, jobs)


def _unless_broken(run: "Run", prepare_step: "Callable[[], bool]") -> "Callable[[], bool]":
    """``prepare_step`` (the next run's preparation, done while ``run`` goes), done with nothing
    more once ``run`` broke: the next run would meet the same failure."""
    return lambda: run.broke or prepare_step()


def _warn_before_runs(configs: "Sequence[RunConfig]") -> None:
    """A :class:`KillpointWarning` for each of :meth:`RunConfig.warnings` of ``configs`` (a stall
    that races the stuck monitor, a heartbeat not shorter than the lease). Always from this line,
    so that Python's filter shows a given one once however many entry points a batch of runs goes
    through."""
    import warnings

    for line in dict.fromkeys(line for config in configs for line in config.warnings()):
        # stacklevel 1: always this line, so the default filter shows each warning once however many
        # entry points a batch of runs goes through
        warnings.warn(line, KillpointWarning, stacklevel=1)
