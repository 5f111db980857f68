"""The marker ``@pytest.mark.killpoint``: its keywords, checked at collection, and its items' crash cases."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn, Sequence

import pytest


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class _Case:
    """One item of a marked test: a single fault at ``point`` (of ``step``, or any step)."""

    point: str
    step: str | None
    action: str = "kill"  # the failpoint action, as ``killpoint matrix`` schedules it
    label: str = ""  # told apart in the id: "pause" (or "pause-until-MOMENT") for the matrix's pauses

    @property
    def id(self) -> str:
        where = f"{self.step}.{self.point}" if self.step else self.point
        return f"{where}-{self.label}" if self.label else where


def _cases(points: Sequence[str], steps: Sequence[str] | None, actions: Sequence[str],
           action: str | None, declared: Any = None) -> list[_Case]:
    """A marked test's items: the schedules ``killpoint matrix`` runs for the same points, steps
    and actions, in its order (kills, a hang at the heartbeat, then pauses past the lease); with
    ``action=``, that one action at every point instead."""
    steps_or_any: Sequence[str | None] = tuple(steps) if steps else (None,)
    if action is not None:
        return [_Case(p, s, action) for s in steps_or_any for p in points]
    from killpoint.chaos.generator import single_fault_schedules

    where = {} if declared is None else {"passes": declared.points, "lease": declared.lease_points,
                                         "claim": declared.claim_point}
    faults = [s.faults[0] for s in single_fault_schedules(steps_or_any, points, tuple(actions), **where)]
    return [_Case(f.point, f.step, str(f.actions), _label(f.actions.terms[0]) if "pause" in str(f.actions) else "")
            for f in faults]


def _label(term: Any) -> str:
    """A pause's part of an item's id: ``pause``, or ``pause-until-after_claim`` for one that comes
    back at another worker's point (the matrix has both at each point where A holds a lease)."""
    return f"pause-until-{term.until}" if term.until else "pause"


_MARKER_KEYS = ("points", "target", "workers", "steps", "action", "actions", "workload", "seed", "check")


def _marker_kwargs(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Check a marker's keywords at collection, so a typo is a collection error naming it."""
    unknown = sorted(set(kwargs) - set(_MARKER_KEYS))
    if unknown:
        _collection_error(f"{name}: @pytest.mark.killpoint got unknown keyword "
                                f"{', '.join(map(repr, unknown))}; it takes {', '.join(_MARKER_KEYS)}")
    out = {"points": None, "target": "reference", "workers": 2, "steps": None, "action": None,
           "actions": ("kill", "pause"), "workload": None, "seed": None, "check": True, **kwargs}
    from killpoint.harness import inputs  # not at load time: the plugin loads in every session
    actions, wrong = inputs.action_names(out["actions"], ("kill", "pause"))
    if wrong:
        _collection_error(f"{name}: @pytest.mark.killpoint(actions={out['actions']!r}): {wrong}")
    for key, check in (("workers", inputs.bad_workers), ("seed", inputs.bad_seed)):
        wrong = None if key == "seed" and out[key] is None else check(out[key])
        if wrong:
            _collection_error(f"{name}: @pytest.mark.killpoint({key}={out[key]!r}): {wrong}")
    out["actions"] = actions
    for key in ("points", "steps"):
        value = out[key]
        if isinstance(value, str):
            value = [value]
        if value is not None:
            value = tuple(value)
            bad = [v for v in value if not isinstance(v, str) or not _NAME.match(v)]
            if bad or not value:
                _collection_error(f"{name}: @pytest.mark.killpoint({key}={out[key]!r}): expected "
                                        f"names such as 'after_call'")
        out[key] = value
    if out["action"] is not None:
        from killpoint.chaos.actions import InvalidAction, parse

        try:
            parse(out["action"])
        except InvalidAction as exc:
            _collection_error(f"{name}: @pytest.mark.killpoint(action={out['action']!r}): {exc}")
    return out


def _declared_target(name: str, target: Any) -> Any:
    """A marked test's target's declaration (a collection error if it cannot be found)."""
    from killpoint.harness.targets import InvalidTarget, declared

    try:
        return declared(target)
    except InvalidTarget as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint(target={target!r}): {exc}")


def _collection_error(message: str) -> NoReturn:
    """Fail the collection of a test with just ``message`` (the plugin's traceback helps nobody)."""
    __tracebackhide__ = True
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception as failed:
        # Raised while handling the error it explains: without this, pytest shows that error too,
        # and "During handling of the above exception, another exception occurred".
        raise failed from None


def _case_of(item: pytest.Item) -> _Case | None:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("killpoint") if callspec is not None else None
    return case if isinstance(case, _Case) else None
