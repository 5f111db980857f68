"""The explore bridge: ``killpoint.explore()`` runs :func:`killpoint.harness.explore.explore` in the
session's services and turns the :class:`~killpoint.harness.explore.Exploration` it returns into a
verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from killpoint._plugin.marker import _collection_error as _fail
from killpoint._plugin.verdict import CrashVerdict, _Run, _verdict

if TYPE_CHECKING:
    from killpoint._plugin.fixture import Killpoint


def explore(handle: "Killpoint", *, target: Any, budget: int | None, seed: int | None,
            workload: str | None, workers: int) -> CrashVerdict:
    """See :meth:`killpoint._plugin.fixture.Killpoint.explore`."""
    from killpoint.chaos.generator import budget_share
    from killpoint.chaos.points import DEFAULT_POINTS
    from killpoint.harness.explore import explore as search
    from killpoint.harness.mutants import overrides_for
    from killpoint.harness.workload import InvalidWorkload, resolve_workload

    settings = handle.settings
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        _fail(f"killpoint.explore(budget={budget!r}): use a whole number of at least 1")
    k, n = settings.shard
    total = settings.budget if budget is None else budget
    share = budget_share(total, k, n)
    if total and not share:
        pytest.skip(f"shard {k}/{n} has no share of an exploration budget of {total}")
    seed = (settings.seed if seed is None else seed) + (k - 1)
    own = tuple(handle._declared(target).points)
    config = handle._config(None, target, workload, workers, seed, overrides_for(target))
    try:
        steps = resolve_workload(config.workload_spec or config.workload_name, seed).step_names
    except InvalidWorkload as exc:
        _fail(f"killpoint: {exc}")
    # The points as ``killpoint explore --points`` takes them: a plain target's built-in points
    # (or those --killpoint-points names), a declaring target's own (narrowed by it).
    if own == tuple(DEFAULT_POINTS):
        points = settings.points if settings.points is not None else own
    else:
        points = tuple(p for p in own if settings.points is None or p in settings.points)
    handle._guard()
    from killpoint.harness.examples_db import DEFAULT_DATABASE

    found = search(config, steps=steps, points=points, budget=share, seed=seed,
                   database=DEFAULT_DATABASE if settings.database is None else settings.database,
                   session=handle._session_getter(), jobs=handle._jobs())
    judged = ([found.minimal.result] if found.minimal is not None else []) + list(found.unknown)
    runs = [handle._keep(result) for result in judged]
    if found.runs > len(runs):  # the valid runs, as one record: an exploration may make thousands
        handle._record(_Run("", True, (), (), "", None), None, target=config.target_name, seed=seed,
                       count=found.runs - len(runs))
    return _verdict(runs, judged, config.target_name, seed, total=found.runs, exercise=found.exercise)
