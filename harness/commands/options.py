"""The options the commands share, and what their values become.

Each command declares its options with these (``add_common``, ``add_seed``, ...), whose ``type=``
readers refuse a value the reproduce line could not give back; the values are then checked against
the target and its workload and made into a :class:`~killpoint.harness.run.RunConfig`
(:func:`run_config`). Bad input is a one-line :class:`~killpoint.errors.BadInput` naming the value
(exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable

from killpoint.chaos.points import DB_POINTS, DEFAULT_POINTS, ORDERED_POINTS, POINTS
from killpoint.errors import SHOWN_LIMIT, BadInput, shown
from killpoint.harness import inputs
from killpoint.harness.run import RunConfig
from killpoint.harness.worker import REAL_TIME_TIMING, Timing


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
        from killpoint.harness.identities import check_schedule

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
