"""What every command shares: options, bad-input errors, the summary, JSON, exit codes, progress."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from killpoint import vocab
from killpoint.chaos.points import DB_POINTS, DEFAULT_POINTS, ORDERED_POINTS, POINTS
from killpoint.errors import SHOWN_LIMIT, BadInput, shown
from killpoint.harness import inputs
from killpoint.harness.colour import Colour
from killpoint.harness.redact import redact  # noqa: F401 (the commands' one redaction)
from killpoint.harness.run import RunConfig, RunResult
from killpoint.harness.stats import PointStats
from killpoint.harness.stats import total as total_stats
from killpoint.harness.worker import REAL_TIME_TIMING, Timing

if TYPE_CHECKING:
    from killpoint.harness.exercise import Tally

EXIT_VALID, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def add_common(p: argparse.ArgumentParser, *, target: bool = True, report: bool = True) -> None:
    """The options every command that runs a target shares; ``report=False`` leaves ``--report``
    to the command (``killpoint report``, which always writes one)."""
    if target:
        p.add_argument("--target", default="reference",
                       help="reference, mutant:NAME or pkg.module:function (default: reference)")
    p.add_argument("--store", default="sqlite", help="sqlite (default) or a postgresql:// URL")
    p.add_argument("--workers", type=whole("--workers"), default=2, metavar="N",
                   help="worker processes per run (default: 2)")
    add_seed(p)
    p.add_argument("--workload", default=None,
                   help="orders, single, plain or pkg.module:function (default: the target's own, else "
                        "orders for reference and mutants, plain for your own target)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--report-dir", default=None, help="where to write HTML reports")
    if report:
        p.add_argument("--report", choices=("always", "on-failure", "never"), default="on-failure",
                       help="when to write HTML reports (default: on-failure)")
    add_jobs(p)
    add_real_time(p, "turn the run clock off: leases and bounds wait in real time, with short "
                     "timings (lease 120 ms), instead of production-like ones (lease 30 s) that "
                     "the virtual clock skips past")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an infrastructure failure (store, downstream, disk)")
    p.add_argument("--timing", type=_timing, default=None, metavar="NAME=MS,...",
                   help="the worker's timings in milliseconds: lease-ttl-ms, heartbeat-ms, "
                        "stuck-bound-ms, poll-ms (default: 30000, 10000, 60000, 1000 on the run clock; "
                        "120, 30, 300, 2 with --real-time)")
    add_output(p)


def add_seed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=_seed, default=0, metavar="N",
                   help="seed for the workload data and every draw (a whole number, negative ones too)")


def _seed(text: str) -> int:
    """A seed in ASCII digits, with an optional leading minus, as a schedule's numbers are: int()
    also reads '\u0663' (an Arabic-Indic 3), '1_000' and ' 3 ', which the reproduce line would then
    give back as another text than the one typed."""
    from killpoint.harness.settings import whole_number

    number = whole_number(text)
    if number is None:  # argparse says "argument --seed: " first
        raise argparse.ArgumentTypeError(f"{shown(text)}: {inputs.bad_seed(text)}")
    return number


def whole(option: str) -> Callable[[str], int]:
    """The ``type=`` of an integer option (``--workers``, ``--budget``, ``--depth``, ``--repeat``,
    ...): read as a seed is (:func:`killpoint.harness.settings.whole_number`), in ASCII digits
    with an optional leading minus, so that ``--workers \u0663`` (an Arabic-Indic 3), ``\uff12``
    (a fullwidth 2), ``+3``, ``3_000``, ``' 3'`` and ``0x10`` are refused naming the value rather
    than read by int() as another number than the reproduce line gives back. The range is the
    command's to check."""
    from killpoint.harness.settings import whole_number

    def parse(text: str) -> int:
        number = whole_number(text)
        if number is None:  # argparse says "argument --workers: " first
            raise argparse.ArgumentTypeError(f"{shown(text)}: give a whole number in ASCII digits")
        return number

    parse.__name__ = option  # what argparse would name in its own messages
    return parse


def fraction(text: str) -> float:
    """The ``type=`` of a non-integer option (``--same-identity``): a number as float() reads it,
    but in ASCII (:func:`killpoint.harness.settings.decimal_number`); the range is the command's."""
    from killpoint.harness.settings import decimal_number

    number = decimal_number(text)
    if number is None:  # argparse says "argument --same-identity: " first
        raise argparse.ArgumentTypeError(f"{shown(text)}: give a number in ASCII digits")
    return number


DEFAULT_SAME_IDENTITY = 0.5


def add_same_identity(p: argparse.ArgumentParser) -> None:
    """``--same-identity P``, for the commands that run one schedule as a reproduce line gives it
    (``replay``, ``report``): a depth-2 or exploration counterexample's line carries it."""
    p.add_argument("--same-identity", type=fraction, default=DEFAULT_SAME_IDENTITY, metavar="P",
                   help="chance that a killed worker comes back under its own identity "
                        f"(default: {DEFAULT_SAME_IDENTITY})")


def same_identity(args: argparse.Namespace) -> float:
    """``--same-identity``, checked: a probability from 0 to 1."""
    if not 0.0 <= args.same_identity <= 1.0:
        raise BadInput(f"--same-identity {args.same_identity}: use a probability from 0 to 1")
    return float(args.same_identity)


def add_real_time(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--real-time``, and ``--no-real-time`` to win over ``real-time = true`` in ``[tool.killpoint]``."""
    p.add_argument("--real-time", action=argparse.BooleanOptionalAction, default=None,
                   help=f"{help_text}; --no-real-time keeps the clock on where [tool.killpoint] "
                        f"sets real-time = true")


def add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help="independent runs side by side, each job a process (default: the number of "
                        "cores); verdicts and reports stay in schedule order")


def _jobs(text: str) -> int:
    from killpoint.harness.settings import whole_number

    n = whole_number(text)
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"--jobs {shown(text)}: give a whole number of at least 1 "
                                         f"in ASCII digits")
    return n


def jobs_of(args: argparse.Namespace) -> int:
    from killpoint.harness.jobs import default_jobs

    return getattr(args, "jobs", None) or default_jobs()


def add_output(p: argparse.ArgumentParser) -> None:
    """The options of what a command that runs writes besides its result."""
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress and no closing line on stderr (the result is still printed)")
    p.add_argument("--junit-xml", default=None, metavar="PATH",
                   help="write JUnit XML: one test case per run, a violation as its failure")
    p.add_argument("--stats", action="store_true",
                   help="print which crash points fired, per run and in total, by worker and action "
                        "(always in --json)")


def _timing(text: str) -> dict[str, float]:
    from killpoint.harness.settings import parse_timing

    try:
        return parse_timing(text)
    except BadInput as exc:  # argparse says "argument --timing: " first
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--timing").lstrip(": ")) from None


def one_line(message: str, limit: int = 800) -> str:
    """An error message as one line, no word of it longer than 200 characters and the whole no
    longer than ``limit``: the last guard against a long value that a message quoted whole. A value
    :func:`~killpoint.errors.shown` clipped already (200 characters and its ``...``) is left as it
    is, never clipped a second time; a longer word is clipped the way ``shown`` clips."""
    words = [w if len(w) <= SHOWN_LIMIT + len("...") else f"{w[:SHOWN_LIMIT]}... ({len(w)} characters)"
             for w in message.split()]
    line = " ".join(words)
    return line if len(line) <= limit else line[:limit] + "..."


def _names(text: str, option: str, left_out: str = "all") -> tuple[str, ...]:
    """The comma-separated names of an option given explicitly: an empty list is bad input, never
    a quiet "all" (leaving the option out is how to ask for ``left_out``), and so is an empty name
    among others (a stray comma)."""
    from killpoint.harness.settings import comma_items

    chosen = comma_items(text)
    if chosen == ():
        raise BadInput(f"{option} {shown(text)}: name at least one, or leave {option} out for {left_out}")
    if chosen is None:  # 'after_call,' or 'a,,b': a slip, never a quiet "and nothing"
        raise BadInput(f"{option} {shown(text)}: an empty name (a stray comma); give names "
                       f"separated by single commas")
    return chosen


def parse_steps(text: str | None, known: Iterable[str], workload: str = "") -> tuple[str, ...]:
    """The steps named by ``--steps`` (any of ``known``, the steps of the workload named
    ``workload``), or without it all of ``known``."""
    known = tuple(known)
    if text is None:
        return known
    chosen = _names(text, "--steps")
    wrong = inputs.unknown_steps(chosen, workload, known)
    if wrong:
        raise BadInput(f"--steps: {wrong}")
    return chosen


def parse_points(text: str | None, known: Iterable[str] = POINTS,
                 default: Iterable[str] = DEFAULT_POINTS) -> tuple[str, ...]:
    """The crash points named by ``--points`` (any of ``known``), or without it ``default`` (the
    points every store has: the PostgreSQL store's own are run only when asked for)."""
    known = tuple(p for p in ORDERED_POINTS if p in set(known)) + tuple(sorted(set(known) - set(ORDERED_POINTS)))
    if text is None:
        return tuple(p for p in known if p in set(default))
    chosen = _names(text, "--points")
    wrong = inputs.unknown_points(chosen, known)
    if wrong:
        raise BadInput(f"--points: {wrong}")
    return chosen


def declared_target(args: argparse.Namespace):
    """The ``--target`` with its declaration, or a one-line :class:`BadInput`."""
    from killpoint.harness.targets import InvalidTarget, declared

    try:
        return declared(getattr(args, "target", "reference"))
    except InvalidTarget as exc:
        raise BadInput(str(exc)[:400]) from None


def workload_name(args: argparse.Namespace) -> str:
    """``--workload``, or the target's default: its declared one, ``orders`` for the reference and
    the mutants (their traps are what they are judged on), ``plain`` for a user's own target."""
    from killpoint.harness.workload import default_for

    workload = getattr(args, "workload", None)
    if workload is not None and not workload.strip():  # before: '' ran the target's default unsaid
        raise BadInput(f"--workload {shown(workload)}: name orders, single, plain or pkg.module:function, "
                       f"or leave --workload out for the target's own")
    if workload:
        return workload
    target = declared_target(args)
    return default_for(getattr(args, "target", "reference"), target)


def workload_of(args: argparse.Namespace):
    """The run's workload, built (and so checked) once, or a one-line :class:`BadInput`."""
    from killpoint.harness.workload import InvalidWorkload, cached_workload

    try:
        return cached_workload(workload_name(args), args.seed)
    except InvalidWorkload as exc:
        raise BadInput(f"--{str(exc)[:400]}") from None


def target_points(args: argparse.Namespace, text: str | None) -> tuple[str, ...]:
    """The crash points a command enumerates: ``text`` (``--points``) or the target's declared ones,
    always among those it declared (a point never declared is never scheduled)."""
    target = declared_target(args)
    if tuple(target.points) == tuple(DEFAULT_POINTS):
        return parse_points(text)  # a plain target: the built-in points, the store's own on request
    if text is None:
        return tuple(target.points)
    chosen = _names(text, "--points")
    wrong = inputs.unknown_points(chosen, target.points)
    if wrong:
        raise BadInput(f"--points: {wrong}")
    return chosen


def parse_schedule(args: argparse.Namespace, text: str):
    """A schedule's text, with the target's declared points as well as the built-in ones (a point
    the target did not declare is refused by :func:`run_config`, naming the ones it did)."""
    from killpoint import chaos

    points = frozenset(declared_target(args).points) | frozenset(DB_POINTS)
    try:
        return chaos.parse(text, points=points, context=False)  # the message names the schedule
    except chaos.InvalidSchedule as exc:
        raise BadInput(f"schedule {shown(text)}: {one_line(str(exc), 600)}") from None


def run_config(args: argparse.Namespace, schedule, **overrides: Any) -> RunConfig:
    wrong = inputs.bad_workers(args.workers)
    if wrong:
        raise BadInput(f"--workers {args.workers}: {wrong}")
    target = getattr(args, "target", "reference")
    declared = declared_target(args)
    workload = workload_name(args)
    steps = workload_of(args).step_names  # checked before any run starts
    if schedule is not None:
        from killpoint.harness.supervise import check_schedule

        check_schedule(schedule, steps=steps, workers=args.workers, owns_state=declared.owns_state)
        undeclared = [str(f) for f in schedule.faults
                      if f.point not in declared.points and f.point not in DB_POINTS]
        if undeclared:
            raise BadInput(f"schedule {shown(str(schedule))}: {', '.join(map(shown, undeclared))} names a crash point "
                           f"the target does not declare; it declares {', '.join(declared.points)}")
    validate_store(args.store, schedule)
    virtual = not getattr(args, "real_time", False)
    if getattr(args, "real_time", None) is False and declared.owns_state and not declared.run_clock:
        _warn_off_the_clock(target)
    timing = getattr(args, "timing", None) or {}
    values = dict(schedule=schedule, target=target, workload=workload, workers=args.workers,
                  seed=args.seed, store=args.store, virtual_time=virtual,
                  timing=dataclasses.replace(Timing() if virtual else REAL_TIME_TIMING, **timing)
                  if timing else None)
    values.update(overrides)
    return RunConfig(**values)


def _warn_off_the_clock(target: str) -> None:
    """``--no-real-time`` for a target that owns its state and does not read its time from the run
    clock: said once, instead of running it in real time without a word."""
    import warnings

    from killpoint.errors import KillpointWarning

    warnings.warn(f"--no-real-time: {target} keeps its state, and its leases' times, in a store of its own, "
                  f"whose clock the run clock cannot move, so it runs in real time with short timings "
                  f"(lease {REAL_TIME_TIMING.lease_ttl_ms:g} ms); to run it on the run clock, compute its "
                  f"leases from ctx.clock.now(), wait through ctx.clock and declare "
                  f"@killpoint.target(..., run_clock=True)", KillpointWarning, stacklevel=1)


def validate_store(spec: str, schedule=None) -> None:
    """Refuse a store we cannot use, or one that cannot carry out a fault of ``schedule``."""
    from killpoint.harness.store import InvalidStore, check_faults, check_store

    if not str(spec).strip():  # the store's library call takes "" as sqlite; given on purpose, it is a slip
        raise BadInput(f"--store {shown(spec)}: name sqlite or a postgresql:// URL, or leave --store "
                       f"out for sqlite")
    try:
        check_store(spec)
        check_faults(spec, schedule)
    except InvalidStore as exc:
        raise BadInput(str(exc)) from None


def replay_command(result: RunResult) -> str:
    """The one line that reproduces a run (:meth:`RunConfig.reproduce_command`)."""
    return result.config.reproduce_command()



def until_broken(results: Iterator[RunResult]) -> Iterator[RunResult]:
    """``results`` up to and including the first run whose infrastructure broke (the store lost or
    silent, the downstream silent, the disk full): the runs after it would meet the same failure,
    each after its own timeouts, and a command that went on would hold a CI job for as many. The
    runs in hand are ended as an interruption ends them (``results`` is closed)."""
    try:
        for result in results:
            yield result
            if result.infrastructure is not None:
                return
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()


@dataclass
class Summary:
    results: list[RunResult] = field(default_factory=list)
    planned: int | None = None  # the runs the command meant to make (more than made: it stopped)
    report: str | None = None
    report_error: str | None = None  # why the reports asked for could not be written
    report_pages: bool = True  # False: the index alone was written (every run valid, --report on-failure)
    junit_error: str | None = None  # why the --junit-xml file could not be written
    # The matrix's path exploration (harness.paths.Exploration): the later hits it found and crashed.
    exploration: Any = None
    # The point statistics of runs whose events were let go (see add), by the result's id.
    _points: dict[int, PointStats] = field(default_factory=dict, repr=False)
    # The report pages written as the runs come (killpoint.reports.PagesAsTheyCome), when a
    # command asked for them with stream_pages: every run must then go through add.
    pages: Any = None

    def add(self, result: RunResult, *, keep_events: bool = True) -> None:
        """Keep a run's result. Without ``keep_events`` (nothing will draw this run: no report is
        asked for), a valid run keeps its verdict, faults, points reached and history's summary but
        lets its events go: a matrix's histories otherwise grow this process's heap by tens of MiB,
        which every worker forked from it pays for in page tables and copy-on-write faults. With
        pages written as the runs come, the run goes to them (which write its page now, or hold it
        until pages are known to be wanted) and is kept here as without ``keep_events``."""
        if self.pages is not None:
            self.pages.add(result)
            keep_events = False
        if not keep_events and result.valid is True:
            points = PointStats.of(result.history)
            result = dataclasses.replace(result, history=dataclasses.replace(result.history, events=()))
            self._points[id(result)] = points
        self.results.append(result)

    @property
    def valid(self) -> bool | None:
        from killpoint.harness.checkers.base import rank

        if not self.results:
            return None
        valid = rank(r.valid for r in self.results)
        return None if valid is True and self.reasons() else valid

    def exercise(self) -> "Tally":
        """What the runs' faults provoked, over all of them (:mod:`killpoint.harness.exercise`)."""
        from killpoint.harness.exercise import total

        return total(r.exercise for r in self.results)

    def target_errors(self) -> list[tuple[str, int]]:
        """What the target's hooks did wrong (a history() of unknown kinds or bad fields, a hook
        that raised), each with the number of runs it happened in: said once per command, also
        where the runs came out violated (the cause was once only in each run's HTML)."""
        counts: Counter[str] = Counter()
        for r in self.results:
            counts.update(dict.fromkeys(r.target_errors, 1))
        return list(counts.items())

    def reasons(self) -> tuple[str, ...]:
        """Why the runs together are unknown whatever each one's verdict: no pause exercised a
        takeover, or a declared expectation (killpoint.sometimes) was never reached."""
        from killpoint.harness.exercise import matrix_reasons

        return matrix_reasons(self.exercise())

    def exit_code(self) -> int:
        v = self.valid
        return EXIT_VALID if v is True else EXIT_VIOLATED if v is False else EXIT_UNKNOWN

    def invariants(self) -> dict[str, dict[str, int]]:
        """Per invariant, the runs in which it judged something (``checked``), found a violation,
        or could not judge at all (``not_applicable``: a target that owns its state gave it nothing)."""
        checked: Counter[str] = Counter()
        violated: Counter[str] = Counter()
        na: Counter[str] = Counter()
        names: list[str] = []
        for r in self.results:
            for res in r.verdict.results:
                if res.invariant not in names:
                    names.append(res.invariant)
                checked[res.invariant] += res.judged
                violated[res.invariant] += res.valid is False
                na[res.invariant] += not res.applicable
        return {n: {"checked": checked[n], "violated": violated[n], "not_applicable": na[n]}
                for n in names}

    @property
    def infrastructure(self) -> str | None:
        """Why the infrastructure broke in a run, or None."""
        return next((r.infrastructure for r in self.results if r.infrastructure is not None), None)

    @property
    def not_run(self) -> int:
        """The runs planned and not made: the command stopped at an infrastructure failure."""
        return max(0, (self.planned or 0) - len(self.results))

    def judged(self) -> tuple[int, int]:
        """(invariants that judged something in some run, invariants in all)."""
        table = self.invariants()
        return sum(1 for c in table.values() if c["checked"]), len(table)

    def to_json(self) -> dict[str, Any]:
        violations = []
        for r in self.results:
            for v in r.verdict.violations:
                violations.append({**v.to_json(), "schedule": str(r.config.schedule),
                                   "reproduce": replay_command(r)})
        return {
            "valid": self.valid,
            "runs": len(self.results),
            "violations": violations,
            "invariants": self.invariants(),
            "judged": self.judged()[0],
            "report": self.report,
            **({"report_error": self.report_error} if self.report_error else {}),
            **({"junit_error": self.junit_error} if self.junit_error else {}),
            **({"hits": self.hits()} if self.exploration is not None else {}),
            "unknown": [{"schedule": str(r.config.schedule), "reasons": list(r.verdict.unknown_reasons)}
                        for r in self.results if r.valid is None],
            "unknown_reasons": list(dict.fromkeys([*self.reasons(), *(
                reason for r in self.results if r.valid is None for reason in r.verdict.unknown_reasons)])),
            "exercise": self.exercise().to_json(),
            "target_errors": [{"error": e, "runs": n} for e, n in self.target_errors()],
            "results": [{"schedule": str(r.config.schedule), "target": r.config.target_name,
                         "valid": r.valid, "fired": r.fired, "unfired": list(r.unfired),
                         "workers_spawned": r.spawned, "duration_ms": round(r.duration_s * 1000, 1),
                         "run_id": r.run_id, "seed": r.config.seed, "store": redact(r.config.store),
                         "points": s.to_json(),
                         "exercise": r.exercise.to_json() if r.exercise is not None else None}
                        for r, s in zip(self.results, self.point_stats())],
            "points": total_stats(self.point_stats()).to_json(),
            **({"infrastructure_failure": self.infrastructure, "not_run": self.not_run}
               if self.infrastructure is not None else {}),
        }

    def hits(self) -> dict[str, Any]:
        """The path exploration's counts: the hits the fault-free run reached, the later ones
        crashed (``explored``), those the bound left, and those a run never reached (``never_fired``:
        each of those runs is unknown)."""
        crashed = {str(s) for s in self.exploration.schedules}
        never = sum(1 for r in self.results if str(r.config.schedule) in crashed and r.unfired)
        return self.exploration.to_json(never)

    def point_stats(self) -> list[PointStats]:
        """The crash points each run reached and fired (see :mod:`harness.stats`)."""
        return [self._points[id(r)] if id(r) in self._points else PointStats.of(r.history)
                for r in self.results]


class Progress:
    """The commands' progress (:class:`harness.progress.Progress`, on stderr), fed by ``step``:
    called with a label as a run starts, and with its result when it ended."""

    def __init__(self, total: int | None, enabled: bool = True, *, title: str = "killpoint") -> None:
        from killpoint.harness.progress import Progress as Display

        self.display = Display(total, title=title, quiet=not enabled)

    def step(self, label: str, result: RunResult | None = None) -> None:
        if result is None:
            self.display.started(label)
        else:
            self.display.finished(result, label)

    def close(self) -> None:
        self.display.close()


def progress_for(args: argparse.Namespace, total: int | None, title: str) -> Progress:
    """Progress of a command's runs, on stderr whatever stdout is; off with ``--quiet``. Called as
    the runs start, so it also readies ``--report-dir`` (:func:`prepare_report_dir`)."""
    prepare_report_dir(args)
    return Progress(total, not getattr(args, "quiet", False), title=title)


def write_reports(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """Write the HTML index and run reports when asked, then the JUnit XML when asked."""
    write_html(args, summary, title)
    write_junit(args, summary, title)


def write_junit(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """``--junit-xml PATH``: one test case per run, linking each run's report when one was written."""
    path = getattr(args, "junit_xml", None)
    if not path:
        return
    from killpoint.reports import page_names

    reports = None
    if summary.report and summary.report_pages:
        where = os.path.dirname(summary.report)
        reports = [os.path.join(where, name) for name in page_names([r.run_id for r in summary.results])]
    summary.junit_error = write_junit_file(path, summary.results, suite=title, reproduce=replay_command,
                                           reports=reports)


def write_junit_file(path: str, results: Sequence[RunResult], **kwargs: Any) -> str | None:
    """Write the JUnit XML after the runs; a file that cannot be written (the path was checked at
    the start, by :func:`check_junit_xml`, but the disk filled or the folder went meanwhile) is a
    warning on stderr, never an error that hides the verdict the runs earned: returns why, or None."""
    from killpoint.reports import junit

    try:
        junit.write(path, results, **kwargs)
    except OSError as exc:
        why = f"--junit-xml {shown(path)}: cannot write it there ({exc.strerror or exc})"
        print(f"killpoint: warning: {why}; the verdict stands", file=sys.stderr)
        return why
    return None


def check_junit_xml(args: argparse.Namespace) -> None:
    """Before the first run, as ``--report-dir`` is checked: refuse a ``--junit-xml`` path that no
    file can be written to (:func:`killpoint.reports.files.check_file_path`), rather than find out
    after every run has been made."""
    path = getattr(args, "junit_xml", None)
    if path is not None and not path.strip():  # before: no file, and no word of it
        raise BadInput(f"--junit-xml {shown(path)}: name the file to write, or leave --junit-xml out")
    if path:
        from killpoint.reports.files import check_file_path

        check_file_path(path, "--junit-xml")


def print_stats(summary: Summary) -> None:
    """``--stats``: the points that fired in each run, then the table over all of them."""
    from killpoint.harness.stats import brief

    stats = summary.point_stats()
    print("\ncrash points fired, per run:")
    for n, (r, s) in enumerate(zip(summary.results, stats), start=1):
        print(f"  {n:>4}. {r.config.schedule or 'no faults'}: {brief(s)}")
    both = total_stats(stats)
    print(f"\ncrash points over {both.runs} run(s), {both.total_fired} fired:")
    for line in both.lines():
        print(f"  {line}")


def report_hint(args: argparse.Namespace, summary: Summary) -> str | None:
    """What to say when a run failed and no report was written: how to get one."""
    if summary.valid is True or summary.report or getattr(args, "report", None) == "never":
        return None
    if getattr(args, "report_dir", None):  # given, and the reports could not be written there: said already
        return None
    return "no HTML report written: add --report-dir DIR to get one for each failing run"


def print_json_hint(args: argparse.Namespace, summary: Summary) -> None:
    """With ``--json``, :func:`report_hint` goes to stderr, as progress and warnings do: standard
    output carries the JSON object alone. ``--quiet`` silences it there, as it silences the closing
    line."""
    hint = None if getattr(args, "quiet", False) else report_hint(args, summary)
    if hint:
        print(f"killpoint: {hint}", file=sys.stderr)


def _report_dir(args: argparse.Namespace) -> str | None:
    where = getattr(args, "report_dir", None)
    return None if where is None or getattr(args, "report", "on-failure") == "never" else where


def check_report_dir(args: argparse.Namespace) -> None:
    """Before the command reads anything else: refuse a ``--report-dir`` that cannot take its
    reports (bad input) -- a file, a place that cannot be written, or a directory holding an
    ``index.html`` that killpoint did not write (a user's own page is never replaced). Changes
    nothing: a command refused for another bad value leaves an earlier command's reports alone."""
    where = _report_dir(args)
    if where is not None:
        from killpoint.reports.files import check_report_path

        check_report_path(where)


def prepare_report_dir(args: argparse.Namespace) -> None:
    """As the command's first run starts (its other values read and accepted): make
    ``--report-dir``, and clear the pages an earlier command left there, so the directory shows
    this command's runs only. Once per command; refused as :func:`check_report_dir` refuses."""
    where = _report_dir(args)
    if where is None or getattr(args, "_report_dir_ready", False):
        return
    args._report_dir_ready = True
    check_report_dir(args)
    from killpoint.reports.files import claim_report_dir, clear_earlier_pages

    try:
        clear_earlier_pages(where)  # a pytest session's pages too (gw0-run-0001.html under xdist)
        claim_report_dir(where)
    except OSError as exc:
        raise BadInput(f"--report-dir {shown(where)}: cannot write reports there "
                       f"({exc.strerror or exc})") from None


def stream_pages(args: argparse.Namespace, summary: Summary, title: str, *, many: bool = True) -> None:
    """Have ``summary`` write each run's report page as the run is added (when ``--report-dir`` and
    ``--report`` ask for pages), rather than keep every run's history for :func:`write_html` at the
    end. Called once the report directory is ready (:func:`progress_for`)."""
    where = _report_dir(args)
    if where is None:
        return
    from killpoint.reports import PagesAsTheyCome

    summary.pages = PagesAsTheyCome(where, title=title, always=args.report == "always", many=many)


def write_html(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """The HTML index and run reports, when ``--report-dir`` and ``--report`` ask for them (the
    pages not written yet, when the runs' pages were written as they came: see
    :func:`stream_pages`).

    A report that cannot be written never hides the verdict: the command says so on stderr and
    goes on to print its verdict and exit with its code."""
    if args.report == "never" or args.report_dir is None:
        return
    # Every run valid and pages only on failure: the index alone, which says what ran and how each
    # verdict came out (a folder holding only a marker said nothing).
    pages = not (args.report == "on-failure" and summary.valid is True)
    from killpoint.reports import write_reports as write

    streamed = summary.pages
    left = len(streamed.held) if streamed is not None else len(summary.results)
    progress = _PageProgress(left if pages else 0, args.report_dir, quiet=bool(getattr(args, "quiet", False)),
                             before=streamed.written if streamed is not None else 0)
    try:
        prepare_report_dir(args)  # done already where the command's runs started
        if streamed is not None:
            summary.report = streamed.finish(summary.results, pages=pages, on_page=progress.page)
        else:
            summary.report = write(summary.results, args.report_dir, title=title, pages=pages,
                                   on_page=progress.page)
        summary.report_pages = pages
        progress.done()
    except BadInput as exc:  # the directory went away or bad since the command started
        summary.report_error = str(exc)
        print(f"killpoint: warning: {summary.report_error}; the verdict stands", file=sys.stderr)
    except OSError as exc:
        summary.report_error = (f"cannot write reports to {shown(args.report_dir)} "
                                f"({exc.strerror or exc})")
        print(f"killpoint: warning: {summary.report_error}; the verdict stands", file=sys.stderr)


class _PageProgress:
    """Progress of the report pages on stderr, as the runs' progress: a line when writing starts (when
    there is more than one page), then every 3 s, then one saying what was written (with the
    ``before`` pages written as the runs came); off with --quiet."""

    def __init__(self, total: int, where: str, *, quiet: bool, before: int = 0) -> None:
        self.total, self.where, self.quiet, self.before = total, where, quiet, before
        self.started = time.monotonic()
        self.last = self.started
        if not quiet and total > 1:
            print(f"killpoint: writing {total} report pages and the index to {where}", file=sys.stderr)

    def page(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.quiet and now - self.last >= 3.0 and done < total:
            print(f"killpoint: {done}/{total} report pages written, {now - self.started:.1f} s", file=sys.stderr)
            self.last = now

    def done(self) -> None:
        if self.quiet:
            return
        took = time.monotonic() - self.started
        if self.before and not self.total:
            print(f"killpoint: wrote {self.before} report page(s) as the runs came, and the index, to {self.where}",
                  file=sys.stderr)
            return
        if self.before:
            print(f"killpoint: wrote {self.before + self.total} report page(s) ({self.before} as the runs came, "
                  f"{self.total} after them) and the index to {self.where} in {took:.1f} s", file=sys.stderr)
            return
        what = (f"{self.total} report page(s) and the index" if self.total else
                "the index only (every run valid; --report always writes a page for each run)")
        print(f"killpoint: wrote {what} to {self.where} in {took:.1f} s", file=sys.stderr)


def print_judgement(summary: Summary, results: Sequence[RunResult], *, reproduce: bool = True) -> None:
    """The invariants table, then each violation (with its replay line) and each unknown reason."""
    paint = Colour.for_stream(sys.stdout)
    print()
    table = summary.invariants()
    na_column = any(c["not_applicable"] for c in table.values())
    print(f"{'invariant':<24} {'checked':>8} {'violated':>9}" + (f" {'n/a':>5}" if na_column else ""))
    for name, c in table.items():
        print(f"{name:<24} {c['checked']:>8} {c['violated']:>9}"
              + (f" {c['not_applicable']:>5}" if na_column else ""))
    if na_column:
        print("n/a: runs in which the invariant was not applicable (the target owns its state and "
              "gave it nothing to judge)")
    for r in results:
        where = r.config.schedule or "no faults"
        for v in r.verdict.violations:
            print(f"\n{paint.verdict('VIOLATED')} {v.invariant} at {v.instance}:{v.step} under {where}")
            print(f"  {v.detail}")
            if reproduce:
                print(f"  reproduce: {replay_command(r)}")
        if r.valid is None:
            for reason in r.verdict.unknown_reasons:
                print(f"\n{paint.verdict('UNKNOWN')} {where}: {reason}")
    for reason in summary.reasons():
        print(f"\n{paint.verdict('UNKNOWN')} all runs: {reason}")


def finish(args: argparse.Namespace, summary: Summary, title: str, lines: Sequence[str] = (),
           extra_json: Mapping[str, Any] | None = None) -> int:
    """Print the outcome (text or JSON, with ``extra_json``'s fields added) and return the exit code."""
    write_reports(args, summary, title)
    if summary.not_run:
        print(f"killpoint: stopped after run {len(summary.results)} of {summary.planned}: "
              f"{summary.infrastructure}; the other {summary.not_run} runs were not made", file=sys.stderr)
    if args.json:
        print(json.dumps({**summary.to_json(), **(extra_json or {})}, indent=2))
        print_json_hint(args, summary)
        return summary.exit_code()
    for line in lines:
        print(line)
    print_judgement(summary, summary.results)
    if getattr(args, "stats", False):
        print_stats(summary)
    hint = report_hint(args, summary)
    if hint:
        print(f"\n{hint}")
    paint = Colour.for_stream(sys.stdout)
    verdict = paint.verdict(vocab.VERDICT_WORDS[summary.valid])
    fired = sum(1 for r in summary.results for n in r.fired.values() if n)
    scheduled = sum(len(r.fired) for r in summary.results)
    judged, total = summary.judged()
    for error, n in summary.target_errors():
        print(f"\n{paint.verdict('TARGET ERROR')} in {n} of {len(summary.results)} runs: {error}")
    tally = summary.exercise()
    if tally.line():
        print(f"\nexercised: {tally.line()}")
    brief = tally.brief()
    hits = ""
    if summary.exploration is not None:
        h = summary.hits()
        hits = (f", {h['explored']} later hits explored ({h['mode']}; {h['left']} left"
                + (f", {h['never_fired']} never fired" if h["never_fired"] else "")
                + ("; --hits all kills every hit reached" if h["mode"] == "paths" else "") + ")")
    print(f"\n{len(summary.results)} runs, {fired}/{scheduled} scheduled faults fired"
          + (f" ({brief})" if brief else "") + hits
          + f", {judged} of {total} invariants judged: {verdict}"
          + (f"; report: {summary.report}" if summary.report else ""))
    return summary.exit_code()
