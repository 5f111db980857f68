"""The plugin's options (command line over ini over defaults), read and checked once per session."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

import pytest

from killpoint.errors import BadInput
from killpoint.errors import KillpointUnavailable as KillpointUnavailable

# Every option: its name after the --killpoint- prefix (the ini key is killpoint_NAME), metavar, help.
_OPTIONS = (
    ("store", "STORE", "where runs keep their state: sqlite (default, a file per run) or a "
                       "postgresql:// URL (a schema per run)"),
    ("report-dir", "DIR", "write an HTML report per crash run and an index over them into DIR"),
    ("seed", "N", "seed for the workload data and every random draw of a run (default: 0)"),
    ("points", "P1,P2", "only these crash points in marked tests, matrices and explorations "
                        "(default: all)"),
    ("budget", "N", "schedules killpoint.explore() draws when the test does not say (default: 100)"),
    ("shard", "K/N", "run only the K-th of N deterministic shares of the crash points of marked "
                     "tests, of each killpoint.matrix() and of each exploration's budget"),
    ("database", "DB", "where killpoint.explore() keeps the examples Hypothesis found: a folder "
                       "(default: .killpoint/hypothesis), a redis://HOST:PORT[/DB][?key_prefix=P] URL "
                       "shared between machines, or none"),
    ("jobs", "N", "runs of one killpoint.matrix() or killpoint.explore() side by side, each in a "
                  "process of its own (default: the number of cores; 1 in an xdist worker, which is "
                  "already one of many)"),
)
# A flag, not a value: on when given (the ini key and [tool.killpoint] can say true or false).
_REAL_TIME_HELP = ("run every crash run with the run clock off, as killpoint matrix --real-time: leases and "
                   "bounds wait in real time with short timings (lease 120 ms) instead of production-like "
                   "ones (lease 30 s) that the virtual clock skips past; -o killpoint_real_time=false turns "
                   "off an ini or [tool.killpoint] real-time = true")
DEFAULT_BUDGET = 100
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class Settings:
    """The resolved options of this session (command line over ini over defaults)."""

    store: str = "sqlite"
    report_dir: str | None = None  # absolute; None: no HTML reports
    seed: int = 0
    points: tuple[str, ...] | None = None  # None: every point
    budget: int = DEFAULT_BUDGET
    shard: tuple[int, int] = (1, 1)  # (K, N), 1 <= K <= N
    jobs: int | None = None  # None: the number of cores, or 1 under xdist
    real_time: bool = False  # every run with the run clock off (killpoint matrix --real-time)
    database: str | None = None  # killpoint.explore()'s example database; None: .killpoint/hypothesis

    def in_shard(self, position: int) -> bool:
        """Whether the ``position``-th (0-based) member of a deterministic list is this shard's
        (:func:`killpoint.chaos.generator.in_shard`: round robin)."""
        from killpoint.chaos.generator import in_shard

        k, n = self.shard
        return in_shard(position, k, n)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("killpoint", "crash-injection testing (killpoint)")
    for name, metavar, help_text in _OPTIONS:
        ini = "killpoint_" + name.replace("-", "_")
        group.addoption(f"--killpoint-{name}", dest=ini, metavar=metavar, default=None,
                        help=f"{help_text}; ini: {ini}")
        parser.addini(ini, help_text, default=None)
    group.addoption("--killpoint-real-time", dest="killpoint_real_time", action="store_true", default=None,
                    help=f"{_REAL_TIME_HELP}; ini: killpoint_real_time")
    parser.addini("killpoint_real_time", _REAL_TIME_HELP, default=None)


# The options [tool.killpoint] of pyproject.toml sets too (the table's key, the same as the CLI's).
_TABLE = {"store": "store", "report-dir": "report_dir", "seed": "seed", "real-time": "real_time"}


def _raw(config: pytest.Config, name: str, table: Any = None) -> tuple[str | None, str]:
    """The value of one option and where it came from (for error messages and relative paths):
    the command line, else the ini key, else ``[tool.killpoint]`` (``table``), the one the CLI reads."""
    key = "killpoint_" + name.replace("-", "_")
    value = config.getoption(key)
    if value is not None:
        return str(value), f"--killpoint-{name}"
    value = config.getini(key)
    if value is not None and str(value).strip():
        return str(value).strip(), f"ini {key}"
    if table is not None and name in _TABLE and _TABLE[name] in table.values:
        return str(table.values[_TABLE[name]]), f"[tool.killpoint] {name} in {table.path}"
    return None, f"ini {key}"


def _table(config: pytest.Config) -> Any:
    """``[tool.killpoint]`` of the nearest pyproject.toml above where pytest was started."""
    from killpoint.errors import BadInput
    from killpoint.harness.settings import load

    try:
        return load(str(config.invocation_params.dir))
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None


def _settings(config: pytest.Config) -> Settings:
    """Read and check every option once, at configure time: bad values stop the session early."""
    values: dict[str, Any] = {}
    table = _table(config)
    store, where = _raw(config, "store", table)
    if store is not None:
        if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
            raise pytest.UsageError(f"{where} {store!r}: expected 'sqlite' or a postgresql:// URL")
        values["store"] = store
    report_dir, where = _raw(config, "report-dir", table)
    if report_dir is not None:
        base = config.invocation_params.dir if where.startswith("--") else \
            os.path.dirname(table.path) if where.startswith("[tool.killpoint]") else \
            (config.inipath.parent if config.inipath else config.rootpath)
        values["report_dir"] = os.path.abspath(os.path.join(base, report_dir))
        from killpoint.reports.files import check_report_path

        try:  # as killpoint --report-dir: never a file, nor a user's own index.html replaced
            check_report_path(values["report_dir"], flag=where)
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None
    # A seed is any whole number, as killpoint --seed takes it (negative ones too), in ASCII digits
    # as there: int() also read an Arabic-Indic 3 as 3, '1_000' as 1000.
    from killpoint.harness.settings import whole_number

    for name, low in (("seed", None), ("budget", 1), ("jobs", 1)):
        text, where = _raw(config, name, table)
        if text is None:
            continue
        number = whole_number(text)
        if number is None:
            raise pytest.UsageError(f"{where} {text!r}: expected a whole number in ASCII digits"
                                    f"{'' if low is None else f' of at least {low}'}")
        if low is not None and number < low:
            raise pytest.UsageError(f"{where} {text!r}: expected a whole number of at least {low}")
        values[name] = number
    real_time, where = _raw(config, "real-time", table)
    if real_time is not None:
        word = real_time.strip().lower()
        if word not in _TRUE + _FALSE:
            raise pytest.UsageError(f"{where} {real_time!r}: expected true or false")
        values["real_time"] = word in _TRUE
    database, where = _raw(config, "database")
    if database is not None:
        from killpoint.harness.examples_db import parse_database

        try:  # as killpoint explore --database: a bad value stops the session before any test
            spec = parse_database(database, flag=where)
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None
        if spec.kind == "folder":  # relative to where pytest was started, or to the ini file
            base = config.invocation_params.dir if where.startswith("--") else \
                (config.inipath.parent if config.inipath else config.rootpath)
            database = os.path.abspath(os.path.join(base, database))
        values["database"] = database
    points, where = _raw(config, "points")
    if points is not None:
        from killpoint.chaos.points import ORDERED_POINTS

        # Any name: a target may declare points of its own; each marked test or matrix then runs
        # the points its target declares among these (and says so when there are none).
        from killpoint.harness.settings import comma_items

        chosen = comma_items(points)
        if chosen is None:  # 'after_call,' or 'a,,b', as killpoint --points refuses it
            raise pytest.UsageError(f"{where} {points!r}: an empty name (a stray comma); give names "
                                    f"separated by single commas")
        bad = [p for p in chosen if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", p)]
        if bad or not chosen:
            raise pytest.UsageError(f"{where}: bad crash point name {', '.join(map(repr, bad)) or repr(points)}; "
                                    f"give names such as {', '.join(ORDERED_POINTS[:3])} or a target's own")
        values["points"] = chosen
    shard, where = _raw(config, "shard")
    if shard is not None:
        # ASCII digits, as every number of the plugin's: \d also matched an Arabic-Indic 1.
        m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*", shard)
        if not m or not 1 <= int(m[1]) <= int(m[2]):
            raise pytest.UsageError(f"{where} {shard!r}: expected K/N with 1 <= K <= N, as in 1/4")
        values["shard"] = (int(m[1]), int(m[2]))
    return Settings(**values)


def _points(asked: Sequence[str] | None, settings: Settings,
            declared: Sequence[str] | None = None) -> tuple[str, ...]:
    """The points a marked test or a matrix runs: its own (or all the target declares), narrowed by
    --killpoint-points. A point the target does not declare is never scheduled (ValueError)."""
    from killpoint.chaos.points import DEFAULT_POINTS

    declared = tuple(declared) if declared else DEFAULT_POINTS
    points = tuple(asked) if asked else declared
    from killpoint.harness import inputs  # not at load time: the plugin loads in every session
    wrong = inputs.unknown_points(points, declared)
    if wrong:
        raise ValueError(f"points={list(asked or ())!r}: {wrong}")
    if settings.points is not None:
        narrowed = tuple(p for p in points if p in settings.points)
        if points and not narrowed:
            whose = "asked for" if asked else "this target declares"  # a marker's or matrix's own, else all
            raise ValueError(f"--killpoint-points {','.join(settings.points)} leaves none of the points "
                             f"{whose} ({', '.join(points)})")
        points = narrowed
    return points
