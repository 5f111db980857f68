"""The ``killpoint`` command line.

Exit codes: 0 every verdict valid, 1 an invariant was violated, 2 bad input (one line naming the
bad value), 3 nothing violated but some verdict unknown (the infrastructure breaking included: the
JSON object is printed all the same, with the cause), 130 on SIGINT, 143 on SIGTERM and 129 on SIGHUP, each after
ending every process, run folder and schema the command started.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from types import ModuleType
from typing import NoReturn

from killpoint.errors import BadInput, InvalidTarget, shown
from killpoint.harness import signals
from killpoint.harness.commands.options import one_line
from killpoint.harness.commands.output import check_junit_xml, check_report_dir
from killpoint.harness.commands.summary import EXIT_BAD_INPUT, EXIT_UNKNOWN
from killpoint.harness.redact import RedactingStream, register

# name -> module under harness.commands; each has HELP, add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "demo": "demo",
    "matrix": "matrix",
    "explore": "explore",
    "replay": "replay",
    "scenario": "scenario",
    "report": "report",
    "mutants": "mutants",
    "selftest": "selftest",
}


def _available() -> dict[str, ModuleType]:
    """Every command's module; a missing one is an ImportError naming it, never a command quietly gone."""
    return {name: importlib.import_module(f"killpoint.harness.commands.{module}")
            for name, module in COMMANDS.items()}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, as for every bad input
        self.exit(EXIT_BAD_INPUT, f"killpoint: error: {one_line(message)}\n")

    def _parse_optional(self, arg_string: str):  # type: ignore[no-untyped-def]
        # A word that starts with one '-' and holds a schedule's punctuation ('-1*kill') is a
        # schedule, for the command to judge and name; taken for an unknown option, it was refused
        # as "the following arguments are required: schedule", naming nothing.
        if arg_string.startswith("-") and not arg_string.startswith("--") and any(c in arg_string for c in "*@:>("):
            return None
        return super()._parse_optional(arg_string)


def version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("killpoint")
    except metadata.PackageNotFoundError:
        from killpoint import __version__

        return __version__


class _Version(argparse.Action):
    """``--version``: the distribution's version, looked up only when asked (14 ms a command)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(f"killpoint {version()}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser(settings=None) -> argparse.ArgumentParser:
    """The parser; ``settings`` (the ``[tool.killpoint]`` table) gives each command its defaults, so
    a flag on the command line still wins."""
    parser = _Parser(prog="killpoint", description="Crash-injection testing for durable-execution workers.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _available().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
        if settings is not None:
            p.set_defaults(**settings.defaults_for({a.dest for a in p._actions}))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; everything it prints passes through :func:`killpoint.harness.redact.redact`."""
    if not isinstance(sys.stdout, RedactingStream):
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)
        try:
            return main(argv)
        finally:
            sys.stdout, sys.stderr = out, err
    from killpoint.harness.settings import load

    _register_secrets(argv if argv is not None else sys.argv[1:])
    try:
        settings = load()
    except BadInput as exc:
        print(f"killpoint: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser = build_parser(settings)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed as one line
        return int(exc.code or 0)
    if not getattr(args, "_run", None):  # no command: one line on stderr, as any usage error
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        print(f"killpoint: error: give a command ({', '.join(commands)}); killpoint --help says what "
              f"each does", file=sys.stderr)
        return EXIT_BAD_INPUT
    register(getattr(args, "store", None))  # a [tool.killpoint] store too
    debug = bool(getattr(args, "debug", False))
    if debug:
        os.environ["KILLPOINT_DEBUG"] = "1"  # a run's infrastructure failure prints its traceback
    signals.install_handlers()
    _warnings_as_lines()
    try:
        check_report_dir(args)  # before the first run, not after the last; made as the runs start
        check_junit_xml(args)
        code = args._run(args)
    except (BadInput, InvalidTarget) as exc:  # InvalidTarget: a target's setup() refused the run
        print(f"killpoint: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `killpoint demo | head`: the reader left; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt as exc:
        return _interrupted(exc.signum if isinstance(exc, signals.Terminated) else signal.SIGINT)
    except Exception as exc:  # the infrastructure broke outside a run (e.g. the downstream)
        if debug:  # the traceback, and nothing else changes: the same line, JSON and exit code
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        return _broken(args, exc, debug=debug)
    received = signals.received()
    if received is not None:  # its KeyboardInterrupt was swallowed where it landed
        return _interrupted(received)
    return code


def _register_secrets(argv: list[str]) -> None:
    """Hide the passwords of every DSN the command was given (:func:`killpoint.harness.redact.register`):
    on its command line, and in ``KILLPOINT_PG_DSN`` and ``PGPASSWORD``, before anything is printed."""
    for word in argv:
        if "://" in word or "password" in word.lower():
            register(word.split("=", 1)[1] if word.startswith("--") and "=" in word else word)
    register(os.environ.get("KILLPOINT_PG_DSN"), password=os.environ.get("PGPASSWORD"))


def _warnings_as_lines() -> None:
    """Show a :class:`~killpoint.errors.KillpointWarning` as the command's other lines are shown
    (``killpoint: warning: ...`` on stderr); any other warning as Python shows it."""
    import warnings

    from killpoint.errors import KillpointWarning

    shown = warnings.showwarning
    if getattr(shown, "_killpoint", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, KillpointWarning):
            print(f"killpoint: warning: {one_line(str(message))}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show._killpoint = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def _interrupted(signum: int) -> int:
    said: dict[int, str] = {signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}
    name = said.get(signum, "interrupted")
    print(f"killpoint: {name}; every process it started has been ended", file=sys.stderr)
    return signals.EXIT_CODES[signal.Signals(signum)]


def _broken(args: argparse.Namespace, exc: Exception, *, debug: bool = False) -> int:
    """An infrastructure failure no run could absorb: exit 3, the cause in one line, and with
    ``--json`` the JSON object all the same (unknown, no runs: every field a command's JSON has,
    empty), never a bare traceback; ``debug``: its traceback was printed already."""
    import json

    from killpoint.harness.commands.summary import Summary

    cause = f"infrastructure failure: {type(exc).__name__}: {one_line(str(exc), 400)}"
    junit_error = None
    path = getattr(args, "junit_xml", None)
    if path:  # checked at the start: CI reads the command's failure in the file it expects
        from killpoint.reports import junit

        try:
            junit.write_broken(path, suite=f"killpoint {getattr(args, 'command', '')}".strip(), cause=cause)
        except OSError as exc2:
            junit_error = f"--junit-xml {shown(path)}: cannot write it there ({exc2.strerror or exc2})"
    if getattr(args, "json", False):
        summary = getattr(args, "_summary", None) or Summary()
        summary.junit_error = junit_error
        print(json.dumps({**summary.to_json(), "valid": None,
                          "unknown_reasons": [*summary.to_json()["unknown_reasons"], cause],
                          "infrastructure_failure": cause, "not_run": summary.not_run}, indent=2))
    if junit_error:
        print(f"killpoint: warning: {junit_error}", file=sys.stderr)
    print(f"killpoint: {cause}" + ("" if debug else " (run with --debug for the traceback)"), file=sys.stderr)
    return EXIT_UNKNOWN


if __name__ == "__main__":
    sys.exit(main())
