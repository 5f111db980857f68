"""The ``killpoint`` command line.

Exit codes: 0 every verdict valid, 1 an invariant was violated, 2 bad input (one line naming the
bad value), 3 nothing violated but some verdict unknown.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from killpoint.harness.commands.common import EXIT_BAD_INPUT, BadInput, one_line

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


def _available() -> dict[str, object]:
    found = {}
    for name, module in COMMANDS.items():
        try:
            found[name] = importlib.import_module(f"killpoint.harness.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"killpoint.harness.commands.{module}":
                raise
    return found


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every bad input
        self.exit(EXIT_BAD_INPUT, f"killpoint: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="killpoint", description="Crash-injection testing for durable-execution workers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _available().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed as one line
        return int(exc.code or 0)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return args._run(args)
    except BadInput as exc:
        print(f"killpoint: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `killpoint demo | head`: the reader left; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("killpoint: interrupted; every process it started has been ended", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
