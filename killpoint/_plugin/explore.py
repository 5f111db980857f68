"""The explore bridge: ``killpoint.explore()`` runs schedule exploration and returns a verdict."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from killpoint._plugin.settings import KillpointUnavailable
from killpoint._plugin.verdict import CrashVerdict, _Run, _verdict

if TYPE_CHECKING:
    from killpoint._plugin.fixture import Killpoint


def explore(handle: "Killpoint", *, target: str, budget: int | None, seed: int | None, workload: str | None,
            workers: int) -> CrashVerdict:
    """See :meth:`killpoint._plugin.fixture.Killpoint.explore`."""
    import argparse
    import contextlib
    import importlib
    import io
    import json

    try:
        command = importlib.import_module("killpoint.harness.commands.explore")
    except ModuleNotFoundError as exc:
        if exc.name != "killpoint.harness.commands.explore":
            raise
        raise KillpointUnavailable(
            "killpoint.explore() needs schedule exploration (the `killpoint explore` command), "
            "which this killpoint installation does not have yet; use killpoint.matrix() for "
            "every single crash, or killpoint.run(schedule) for one") from None
    if not isinstance(target, str):
        raise TypeError("killpoint.explore(target=...) takes a name: 'reference', 'mutant:NAME' "
                        "or 'pkg.module:function'")
    k, n = handle.settings.shard
    total = handle.settings.budget if budget is None else budget
    share = total // n + (1 if k - 1 < total % n else 0)
    if total and not share:
        pytest.skip(f"shard {k}/{n} has no share of an exploration budget of {total}")
    seed = (handle.settings.seed if seed is None else seed) + (k - 1)
    parser = argparse.ArgumentParser(prog="killpoint explore")
    command.add_arguments(parser)
    argv = ["--target", target, "--budget", str(share), "--seed", str(seed),
            *(["--workload", workload] if workload is not None else []),
            "--workers", str(workers), "--store", handle.settings.store, "--json"]
    if handle.settings.points is not None:
        argv += ["--points", ",".join(handle.settings.points)]
    args = parser.parse_args(argv)
    handle._guard()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        command.run(args)
    return _from_json(handle, json.loads(out.getvalue()), target, seed, workload, workers)


def _from_json(handle: "Killpoint", data: dict[str, Any], target: str, seed: int, workload: str | None,
               workers: int) -> CrashVerdict:
    """A verdict from a command's ``--json`` object (DESIGN section 10); it has no histories."""
    import types

    from killpoint import chaos
    from killpoint.harness.checkers.base import Violation
    from killpoint.harness.commands.common import replay_command
    from killpoint.harness.run import RunConfig

    found: dict[str, list[Violation]] = {}
    commands: dict[str, str] = {}
    for v in data.get("violations", []):
        schedule = v.get("schedule", "")
        found.setdefault(schedule, []).append(Violation(
            v["invariant"], v.get("instance"), v.get("step"), v.get("detail", ""),
            tuple(v.get("events", ())), schedule))
        commands[schedule] = v.get("reproduce", "")
    runs = [_Run(schedule, False, tuple(vs), (), commands[schedule], None) for schedule, vs in found.items()]
    for u in data.get("unknown", []):
        schedule = u.get("schedule", "")
        if schedule in found:
            continue
        config = RunConfig(schedule=chaos.parse(schedule), target=target, workload=workload,
                           workers=workers, seed=seed, store=handle.settings.store)
        runs.append(_Run(schedule, None, (), tuple(u.get("reasons", ())),
                         replay_command(types.SimpleNamespace(config=config)), None))
    total = max(int(data.get("runs", len(runs))), len(runs))
    for run in runs:
        handle._record(run, None, target=target, seed=seed)
    if total > len(runs):  # the valid runs, as one record: an exploration may make thousands
        handle._record(_Run("", True, (), (), "", None), None, target=target, seed=seed,
                     count=total - len(runs))
    verdict = _verdict(runs, (), target, seed, total=total)
    return dataclasses.replace(verdict, report_path=data.get("report") or verdict.report_path)

