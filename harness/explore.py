"""Exploration: search schedules with Hypothesis, far beyond the single-crash matrix.

Each example is a schedule of one to a few faults (kills anywhere, including inside the call,
pauses past the lease, hangs, short sleeps), plus the rule for restarting killed workers (under a
fresh identity, or under their own). A run whose verdict is invalid is a counterexample; Hypothesis
shrinks it, and the smallest counterexamples are then *confirmed* (:mod:`killpoint.harness.confirm`):
replayed five times, shrunk further one fault at a time; only a schedule that failed every replay is
the confirmed counterexample. Stalls are drawn relative to the run's lease TTL and stuck bound, below
and well past them. :func:`explore` returns what the search found as an
:class:`Exploration`; the ``killpoint explore`` command prints it and the pytest plugin's
``killpoint.explore()`` turns it into a verdict.

Every draw flows from the seed. Hypothesis keeps what it found in ``database`` (a folder laid out as
pytest's ``.hypothesis/``, a Redis server, or nothing: :mod:`killpoint.harness.examples_db`), so the
same search again, in this process or any other that names the same database, starts from the last
counterexample.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from killpoint.harness.examples_db import DEFAULT_DATABASE, DatabaseSpec, opened, parse_database
from killpoint.harness.exercise import NOT_EXERCISED, Tally, matrix_reasons, total
from killpoint.harness.history import History
from killpoint.harness.run import RunConfig, RunResult, Session
from killpoint.harness.stats import PointStats

__all__ = ["DEFAULT_DATABASE", "Counterexample", "Exploration", "Experiment", "SAME_IDENTITY", "explore"]

# Restart rules a run can draw, simplest first: the default mix, always the same identity, never.
SAME_IDENTITY = (0.5, 1.0, 0.0)


@dataclass(frozen=True)
class Experiment:
    """One example: a schedule and the chance that a killed worker keeps its identity."""

    schedule: Any  # chaos.Schedule
    same_identity: float = 0.5


CANDIDATES = 4  # the smallest distinct counterexamples a search hands to confirmation


@dataclass(frozen=True)
class Counterexample:
    """A run that violated an invariant, and how its replays went.

    Confirmed: the schedule failed every one of its ``replays`` (``result`` is its last failing
    run). Not confirmed: no candidate failed every replay (its outcome depends on timing);
    ``result`` is then the smallest failing run seen, and ``replays``/``replays_failed`` those of
    the candidate that failed most often.
    """

    experiment: Experiment
    result: RunResult
    confirmed: bool = False
    replays: int = 0
    replays_failed: int = 0

    @property
    def flaky(self) -> bool:
        return not self.confirmed

    @property
    def schedule(self) -> str:
        return str(self.experiment.schedule)

    @property
    def violated(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.invariant for v in self.result.verdict.violations))

    @property
    def reproduce(self) -> str:
        return self.result.config.reproduce_command()


@dataclass(frozen=True)
class Exploration:
    """What a search saw: run counts, runs that could not be judged, the minimal counterexample."""

    config: RunConfig  # the base configuration every drawn schedule ran with
    budget: int
    seed: int
    runs: int
    valid_runs: int
    unfired: int  # runs unknown only because a drawn fault never fired
    unknown: tuple[RunResult, ...]  # runs unknown for another reason
    failures: int  # counterexamples seen, shrinking included
    minimal: Counterexample | None
    invariants: dict[str, dict[str, int]]
    duration_s: float
    seen: tuple[RunResult, ...] = ()  # every run in the order run, without its history (for JUnit)
    points: PointStats = field(default_factory=PointStats)  # crash points reached and fired, all runs
    # Runs unknown only because a drawn pause or hang provoked no takeover (and faults never fired):
    # like an unfired fault, such a draw tested nothing, and is counted, never judged valid.
    not_exercised: int = 0

    @property
    def exercise(self) -> Tally:
        """What the drawn faults provoked, over every run (:mod:`killpoint.harness.exercise`)."""
        return total(r.exercise for r in self.seen)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why the search is unknown as a whole: no drawn pause exercised a takeover, or an
        expectation (killpoint.sometimes) was never reached."""
        return matrix_reasons(self.exercise)

    @property
    def valid(self) -> bool | None:
        """False with a counterexample; None when some run could not be judged, or the search as a
        whole exercised nothing it had to (:attr:`reasons`); else True."""
        if self.minimal is not None:
            return False
        return None if self.unknown or self.reasons else True


@dataclass
class _Search:
    runs: int = 0
    valid: int = 0
    unfired: int = 0
    not_exercised: int = 0
    unknown: list[RunResult] = field(default_factory=list)
    failures: int = 0
    last: tuple[Experiment, RunResult] | None = None  # Hypothesis's final one: the shrunk counterexample
    smallest: tuple[Experiment, RunResult] | None = None  # the fallback when the last did not reproduce
    invariants: dict[str, dict[str, int]] = field(default_factory=dict)
    seen: list[RunResult] = field(default_factory=list)
    failing: list[Experiment] = field(default_factory=list)  # every counterexample, in order
    points: PointStats = field(default_factory=PointStats)

    def failed(self, experiment: Experiment, result: RunResult) -> None:
        self.failures += 1
        self.failing.append(experiment)
        self.last = (experiment, result)
        if self.smallest is None or _size(experiment) < _size(self.smallest[0]):
            self.smallest = self.last

    def record(self, result: RunResult) -> None:
        self.runs += 1
        self.seen.append(dataclasses.replace(result, history=History(())))
        self.points = self.points + PointStats.of(result.history)
        for res in result.verdict.results:
            counts = self.invariants.setdefault(res.invariant, {"checked": 0, "violated": 0})
            counts["checked"] += res.checked
            counts["violated"] += res.valid is False
        if result.valid is True:
            self.valid += 1
        elif result.valid is None:
            reasons = result.verdict.unknown_reasons
            if all("never fired" in reason for reason in reasons):
                self.unfired += 1
            elif all("never fired" in reason or NOT_EXERCISED in reason for reason in reasons):
                self.not_exercised += 1
            else:
                self.unknown.append(result)


def _size(experiment: Experiment) -> tuple[int, int]:
    return len(experiment.schedule.faults), len(str(experiment.schedule))


class _Found(Exception):
    """Raised inside the Hypothesis test to mark a counterexample (Hypothesis then shrinks it)."""


class _Broken(BaseException):
    """Raised inside the Hypothesis test when a run's infrastructure failed (the store, the
    downstream, the disk): every run after it would meet the same failure, each after its own
    bound, so the search ends there. Not an Exception: Hypothesis neither shrinks nor keeps it."""


def database_key(config: RunConfig, max_faults: int, steps: Sequence[str], points: Sequence[str]) -> bytes:
    """Examples are kept per search space: the same target, workload and shape of schedule."""
    text = json.dumps([config.target_name, config.workload_name, config.workers, max_faults, list(steps),
                       list(points)])
    return hashlib.sha256(text.encode()).digest()


def explore(config: RunConfig, *, steps: Sequence[str], points: Sequence[str], budget: int = 100,
            seed: int = 0, max_faults: int = 3, database: str | DatabaseSpec | None = DEFAULT_DATABASE,
            session: Session | None = None,
            on_run: Callable[[str, RunResult | None], None] | None = None, jobs: int = 1) -> Exploration:
    """Draw up to ``budget`` schedules over ``steps`` x ``points`` from ``seed``, run each with
    ``config`` (its schedule and restart rule replaced), and shrink the first counterexample.

    ``database`` is where Hypothesis keeps the search's examples: a folder, a ``redis://`` URL,
    ``"none"`` or None (keep nothing, write nothing), or a parsed spec; ``session`` the
    session to run in (default: a new one, closed at the end); ``on_run(schedule, result)`` is
    called before each run (``result`` None) and after it, for progress. ``jobs`` > 1 runs the
    schedules drawn before the first failure, and the confirming replays, that many side by side
    (:mod:`killpoint.harness.lookahead`); the same seed explores the same schedules with any ``jobs``.
    """
    from hypothesis.database import ReadOnlyDatabase
    from hypothesis.errors import Flaky

    from killpoint.harness.lookahead import Lookahead, drawn

    if budget < 1:
        raise ValueError(f"budget {budget}: use a whole number of at least 1")
    if max_faults < 1:
        raise ValueError(f"max_faults {max_faults}: use a whole number of at least 1")
    if jobs < 1:
        raise ValueError(f"jobs {jobs}: use a whole number of at least 1")
    experiments = _experiments(config, steps, points, max_faults)
    spec = database if isinstance(database, DatabaseSpec) else parse_database(database or "none")
    search = _Search()
    started = time.monotonic()
    note = on_run or (lambda schedule, result: None)

    key = database_key(config, max_faults, steps, points)

    def hypothesis_test(body: Callable[[Experiment], None], db: Any) -> Callable[[], None]:
        """The search as a Hypothesis test of ``body``: the same settings, seed and key for the
        real search and for the dry pass that plans what it draws."""
        return _hypothesis_test(body, db, experiments, budget=budget, seed=seed, key=key)

    with contextlib.ExitStack() as stack:
        examples, home = stack.enter_context(opened(spec))
        if session is None:
            session = stack.enter_context(Session())
        run = session.run
        ahead = None
        if jobs > 1:
            with _hypothesis_home(home):
                plan = drawn(lambda body: hypothesis_test(
                    body, None if examples is None else ReadOnlyDatabase(examples))())
            ahead = Lookahead(session, config, plan, jobs)

        def trial(experiment: Experiment) -> None:
            run_config = dataclasses.replace(config, schedule=experiment.schedule,
                                             same_identity=experiment.same_identity)
            note(str(experiment.schedule), None)
            result = ahead.take(experiment) if ahead is not None else None
            if result is None:
                result = run(run_config)
            search.record(result)
            note(str(experiment.schedule), result)
            if result.infrastructure is not None:
                if ahead is not None:
                    ahead.leave()
                raise _Broken
            if result.valid is False:
                if ahead is not None:
                    ahead.leave()  # Hypothesis shrinks from here, each step decided by the last
                search.failed(experiment, result)
                raise _Found

        flaky = broken = False
        with _hypothesis_home(home):
            try:
                hypothesis_test(trial, examples)()
            except _Found:
                pass
            except Flaky:
                flaky = True  # the shrunk example did not fail again: confirmation decides
            except _Broken:
                broken = True  # the run's infrastructure failed: no further run, no replay
        many = None if jobs == 1 else (lambda configs: session.run_many(configs, jobs=jobs))
        confirmed, tried = (None, []) if broken else _confirm(run, config, search, many)
    minimal = _minimal(search.smallest if flaky else search.last, confirmed, tried)
    return Exploration(config, budget, seed, search.runs, search.valid, search.unfired,
                       tuple(search.unknown), search.failures, minimal, search.invariants,
                       time.monotonic() - started, tuple(search.seen), search.points, search.not_exercised)


def _experiments(config: RunConfig, steps: Sequence[str], points: Sequence[str], max_faults: int) -> Any:
    """The Hypothesis strategy :func:`explore` draws from: a schedule of up to ``max_faults`` faults
    over ``steps`` x ``points`` by the config's workers, and a restart rule."""
    from hypothesis import strategies as st

    from killpoint.chaos.strategies import schedules, stall_durations

    workers = [chr(ord("A") + i) for i in range(config.workers)]
    stalls = stall_durations(config.timing.lease_ttl_ms, config.timing.stuck_bound_ms)
    # A drawn pause may also come back in the takeover window (the target's claim point) or once
    # its lease lapsed, as the matrix's pauses do.
    from killpoint.chaos.actions import LAPSE
    from killpoint.harness.targets import declared

    claim = declared(config.target).claim_point
    moments = ((claim,) if claim is not None else ()) + (LAPSE,)
    return st.builds(Experiment, schedules(workers, tuple(steps), points=tuple(points),
                                           max_faults=max_faults, stalls_ms=stalls, moments=moments),
                     st.sampled_from(SAME_IDENTITY))


def _hypothesis_test(body: Callable[[Experiment], None], db: Any, experiments: Any, *, budget: int, seed: int,
                     key: bytes) -> Callable[[], None]:
    """``body`` as a Hypothesis test drawing ``experiments``, with the search's settings, seed and
    database key."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed

    test = settings(database=db, max_examples=budget, deadline=None,
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                    report_multiple_bugs=False, derandomize=False, print_blob=False)(
        hypothesis_seed(seed)(given(experiments)(body)))
    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    return test  # type: ignore[no-any-return]


def _minimal(found: Any, confirmed: Any, tried: list[Any]) -> "Counterexample | None":
    """The counterexample the search reports: the confirmed one, else the failure it found (with
    the best replay record of those tried), else None."""
    if confirmed is not None:
        return Counterexample(Experiment(confirmed.config.schedule, confirmed.config.same_identity),
                              confirmed.result, True, confirmed.replays, confirmed.failed)
    if found is not None:
        best = max(tried, key=lambda t: t.failed / t.replays, default=None)
        return Counterexample(found[0], found[1], False, best.replays if best else 0,
                              best.failed if best else 0)
    return None


def _confirm(run: Callable[[RunConfig], RunResult], config: RunConfig, search: _Search,
             run_many: Callable[[Sequence[RunConfig]], Iterator[RunResult]] | None = None
             ) -> tuple[Any, list[Any]]:
    """Replay the smallest counterexamples seen (see :mod:`killpoint.harness.confirm`), side by
    side with ``run_many``."""
    from killpoint.harness.confirm import confirm

    if not search.failing:
        return None, []
    distinct = {(str(e.schedule), e.same_identity): e for e in search.failing}
    smallest = sorted(distinct.values(), key=_size)[:CANDIDATES]
    configs = [dataclasses.replace(config, schedule=e.schedule, same_identity=e.same_identity)
               for e in smallest]
    return confirm(run, configs, run_many=run_many)


@contextlib.contextmanager
def _hypothesis_home(path: str) -> Iterator[None]:
    """Point Hypothesis's own files (its caches) at ``path`` for the search, not ``./.hypothesis``.

    The setting is process-wide, so the previous one comes back afterwards (a test suite that
    calls ``explore`` keeps its own Hypothesis folder).
    """
    from hypothesis import configuration

    previous = configuration.storage_directory(intent_to_write=False).home_directory
    configuration.set_hypothesis_home_dir(path)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(previous)
