"""One bad value, one message: the command line and the pytest plugin say what is wrong with the
same value in the same words (harness/inputs.py), each behind its own prefix naming where the value
came from. The table lists every value both take; a new one belongs here."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

KILLPOINT = [sys.executable, "-m", "killpoint.harness.cli"]

# (what is given, the CLI's arguments, the marker's keywords, the CLI's prefix, the marker's prefix)
CASES = [
    ("a point the target does not declare", ["--points", "nope"], 'points=["nope"]',
     "--points: ", "points=['nope']: "),
    ("a step the workload does not have", ["--steps", "nope"], 'steps=["nope"]',
     "--steps: ", "steps=('nope',)): "),
    ("an action the matrix does not take", ["--actions", "kill,explode"], 'actions=["kill", "explode"]',
     "--actions: ", "actions=['kill', 'explode']): "),
    ("no workers", ["--workers", "0"], "workers=0", "--workers 0: ", "workers=0): "),
    ("too many workers", ["--workers", "27"], "workers=27", "--workers 27: ", "workers=27): "),
    ("a seed that is not a whole number", ["--seed", "x"], 'seed="x"', "'x': ", "seed='x'): "),
]


def _cli(argv: list[str]) -> str:
    done = subprocess.run([*KILLPOINT, "matrix", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _marker(pytester: pytest.Pytester, keywords: str) -> str:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.killpoint({keywords})
        def test_it(killpoint):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = result.stdout.str()
    found = [line for line in text.splitlines() if "@pytest.mark.killpoint" in line and "test_it" in line
             and not line.startswith("ERROR")]
    assert result.ret != 0 and found, text[-3000:]
    return found[0]


@pytest.mark.parametrize("what, argv, keywords, cli_prefix, marker_prefix", CASES, ids=[c[0] for c in CASES])
def test_the_command_line_and_the_marker_say_the_same_of_the_same_bad_value(pytester, what, argv, keywords,
                                                                             cli_prefix, marker_prefix):
    cli, marker = _cli(argv), _marker(pytester, keywords)
    said_cli = cli.split(cli_prefix, 1)[1]
    said_marker = marker.split(marker_prefix, 1)[1]
    # The same words. Where the message lists the valid choices, the CLI's may be longer: its points
    # add the store's own and its actions terminate, which need a PostgreSQL store (only the CLI takes
    # one); the marker's choices are then a part of the CLI's, in the same order.
    split = r"; (?:valid names are|use any of) "
    assert re.split(split, said_cli)[0] == re.split(split, said_marker)[0], (cli, marker)
    if re.search(split, said_cli):
        cli_choices = re.split(split, said_cli)[1].split(", ")
        marker_choices = re.split(split, said_marker)[1].split(", ")
        assert [c for c in cli_choices if c in marker_choices] == marker_choices, (cli, marker)
    else:
        assert said_cli == said_marker, (cli, marker)
    # collected once, never one error per item at its setup
    assert "ERROR at setup" not in marker
