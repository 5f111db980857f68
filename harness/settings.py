"""The ``[tool.killpoint]`` table of ``pyproject.toml``: a project's defaults for every run option.

The command line and the pytest plugin read the same table, from the first ``pyproject.toml``
found walking up from the current directory (as pytest and most tools find theirs). A flag given
on the command line wins over the table; the table wins over killpoint's own defaults. A key the
table does not know, or a value of the wrong kind, is an error naming it -- a misspelt ``sed = 7``
must not silently run seed 0. Paths in the table are relative to the ``pyproject.toml``.

    [tool.killpoint]
    store = "postgresql://postgres@127.0.0.1:5432/test"
    workers = 3
    seed = 7
    report-dir = "killpoint-report"
    report = "always"          # always | on-failure | never
    target = "myapp.worker:run"
    workload = "orders"
    junit-xml = "killpoint.xml"
    real-time = true           # the run clock off, as --real-time

    [tool.killpoint.timing]    # milliseconds
    lease-ttl-ms = 200
    heartbeat-ms = 50
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from killpoint.errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the same parser, from its backport
    import tomli as tomllib

PYPROJECT = "pyproject.toml"
REPORT_CHOICES = ("always", "on-failure", "never")
# key -> (python type, the argparse dest it sets)
KEYS: dict[str, tuple[type, str]] = {
    "store": (str, "store"),
    "workers": (int, "workers"),
    "seed": (int, "seed"),
    "report-dir": (str, "report_dir"),
    "report": (str, "report"),
    "target": (str, "target"),
    "workload": (str, "workload"),
    "junit-xml": (str, "junit_xml"),
    "real-time": (bool, "real_time"),
}
PATH_DESTS = ("report_dir", "junit_xml")
TIMING_KEYS = {"lease-ttl-ms": "lease_ttl_ms", "heartbeat-ms": "heartbeat_ms",
               "stuck-bound-ms": "stuck_bound_ms", "poll-ms": "poll_ms"}


# A year: far past any production lease or bound. Far larger values (1e308, infinity) overflow the
# run clock's and the checkers' arithmetic.
MAX_TIMING_MS = 31_536_000_000.0


def timing_problem(ms: Any) -> str | None:
    """What is wrong with ``ms`` as a timing (``None``: nothing): it must be a number of
    milliseconds above zero and at most a year (so neither NaN nor infinity)."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms <= MAX_TIMING_MS:
        return f"give a number of milliseconds above 0 and at most {MAX_TIMING_MS:.0f} (a year)"
    return None


def whole_number(text: str) -> int | None:
    """``text`` as a whole number when it is one in ASCII digits, with an optional leading minus
    (``None`` otherwise): the one reading of a seed, on the command line and in the pytest plugin.
    int() also takes other scripts' digits, underscores and surrounding spaces."""
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else None


def comma_items(text: str) -> tuple[str, ...] | None:
    """The items of a comma-separated list (``--points``, ``--steps``, ``--actions``, ``--timing``,
    ...), each stripped, or ``None`` when one is empty -- a stray comma (``after_call,``,
    ``a,,b``), which is a slip, never a quiet "and nothing". A list of no item at all (``''``,
    ``' , '``) gives ``()``, for the caller to say that leaving the option out is how to ask for all."""
    items = tuple(p.strip() for p in text.split(","))
    if not any(items):
        return ()
    return None if "" in items else items


def decimal_number(text: str) -> float | None:
    """``text`` as float() reads it when it is written in ASCII without underscores (``None``
    otherwise): float() also reads other scripts' digits ('\u0660.\u0665', '\uff12') and '1_0'.
    What float() reads beyond digits (an exponent, 'inf', 'nan') is left to the caller's range."""
    if not text.isascii() or "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


class InvalidSettings(BadInput):
    """The ``[tool.killpoint]`` table has a key we do not know or a value of the wrong kind."""


@dataclass(frozen=True)
class Settings:
    """The table, checked: argparse ``dest`` -> value, and the timing overrides in milliseconds."""

    path: str | None = None  # the pyproject.toml read, if any
    values: Mapping[str, Any] = field(default_factory=dict)
    timing: Mapping[str, float] = field(default_factory=dict)  # Timing field -> ms

    def defaults_for(self, dests: set[str]) -> dict[str, Any]:
        """The values a parser with these destinations takes from the table."""
        out = {d: v for d, v in self.values.items() if d in dests}
        if self.timing and "timing" in dests:
            out["timing"] = dict(self.timing)
        return out


def find(start: str | None = None) -> str | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (default: the current directory)."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, PYPROJECT)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def load(start: str | None = None, *, path: str | None = None) -> Settings:
    """Read and check ``[tool.killpoint]`` of ``path`` (default: the one :func:`find` finds)."""
    path = path or find(start)
    if path is None:
        return Settings()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise InvalidSettings(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSettings(f"{path}: not valid TOML ({exc})") from None
    table = data.get("tool", {}).get("killpoint")
    if table is None:
        return Settings(path)
    settings = parse(table, where=f"{path} [tool.killpoint]")
    # Paths in the table are relative to the pyproject.toml, wherever the command is started.
    values = {k: (os.path.join(os.path.dirname(os.path.abspath(path)), v) if k in PATH_DESTS else v)
              for k, v in settings.values.items()}
    return dataclasses.replace(settings, path=path, values=values)


def parse(table: Any, *, where: str = "[tool.killpoint]") -> Settings:
    """Check a ``[tool.killpoint]`` table (already read from TOML)."""
    if not isinstance(table, dict):
        raise InvalidSettings(f"{where}: must be a table, not {_show(table)}")
    values: dict[str, Any] = {}
    timing: dict[str, float] = {}
    unknown = [k for k in table if _key(k) not in KEYS and _key(k) != "timing"]
    if unknown:
        raise InvalidSettings(f"{where}: unknown key {', '.join(map(repr, unknown))}; known keys are "
                              f"{', '.join(sorted(KEYS))} and the table timing")
    for raw, value in table.items():
        key = _key(raw)
        if key == "timing":
            timing = _timing(value, where)
            continue
        kind, dest = KEYS[key]
        if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidSettings(f"{where}: {raw} = {_show(value)}: give a whole number")
        if kind is bool and not isinstance(value, bool):
            raise InvalidSettings(f"{where}: {raw} = {_show(value)}: give true or false")
        if kind is str and (not isinstance(value, str) or not value):
            raise InvalidSettings(f"{where}: {raw} = {_show(value)}: give a non-empty string")
        if key == "workers" and not 1 <= value <= 26:
            raise InvalidSettings(f"{where}: workers = {value}: use a number from 1 to 26")
        if key == "report" and value not in REPORT_CHOICES:
            raise InvalidSettings(f"{where}: report = {_show(value)}: use one of {', '.join(REPORT_CHOICES)}")
        values[dest] = value
    return Settings(None, values, timing)


def parse_timing(text: str) -> dict[str, float]:
    """``--timing lease-ttl-ms=200,heartbeat-ms=50`` as the same overrides as the table's. An empty
    one is refused, as an empty ``--points`` is: leaving the option out is how to keep the defaults."""
    parts = comma_items(text)
    if parts == ():
        raise BadInput(f"--timing {_show(text)}: name at least one NAME=MILLISECONDS "
                       f"({', '.join(TIMING_KEYS)}), or leave --timing out")
    if parts is None:
        raise BadInput(f"--timing {_show(text)}: an empty item (a stray comma); give NAME=MILLISECONDS "
                       f"items separated by single commas")
    out: dict[str, Any] = {}
    for part in parts:
        name, sep, value = part.partition("=")
        # Digits with an optional fraction, nothing else: float() also reads '1e3', ' 200' and
        # '\uff12\uff10\uff10', which the reproduce line would give back as another text.
        ms = float(value) if sep and _MILLISECONDS.fullmatch(value) else None
        if ms is None:
            raise BadInput(f"--timing {_clip(text)}: {_show(part)} is not NAME=MILLISECONDS (milliseconds "
                           f"in ASCII digits, as 200 or 2.5: no sign, exponent or space)")
        key = TIMING_KEYS.get(_key(name))
        if key is not None and key in {TIMING_KEYS.get(_key(n)) for n in out}:
            raise BadInput(f"--timing {_clip(text)}: {_show(name)} is given twice; give each timing once")
        out[name] = ms
    return _timing(out, "--timing")


_MILLISECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _timing(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise InvalidSettings(f"{where}: timing = {_show(value)}: must be a table of milliseconds")
    out: dict[str, float] = {}
    for raw, ms in value.items():
        name = TIMING_KEYS.get(_key(raw))
        if name is None:
            raise InvalidSettings(f"{where}: unknown timing {raw!r}; known timings are "
                                  f"{', '.join(TIMING_KEYS)}")
        problem = timing_problem(ms)
        if problem:
            raise InvalidSettings(f"{where}: timing {raw} = {_show(ms)}: {problem}")
        out[name] = float(ms)
    return out


def _key(raw: str) -> str:
    return str(raw).replace("_", "-")


def _show(value: Any) -> str:
    return _clip(repr(value))


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


__all__ = ["MAX_TIMING_MS", "Settings", "InvalidSettings", "comma_items", "decimal_number", "find", "load",
           "parse", "parse_timing", "timing_problem", "whole_number"]
