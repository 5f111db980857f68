"""The marker ``@pytest.mark.killpoint``: its keywords, checked at collection, and its items' crash cases."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn

import pytest

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class _Case:
    """One item of a marked test: a single crash at ``point`` (of ``step``, or any step)."""

    point: str
    step: str | None

    @property
    def id(self) -> str:
        return f"{self.step}.{self.point}" if self.step else self.point


_MARKER_KEYS = ("points", "target", "workers", "steps", "action", "workload", "seed", "check")


def _marker_kwargs(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Check a marker's keywords at collection, so a typo is a collection error naming it."""
    unknown = sorted(set(kwargs) - set(_MARKER_KEYS))
    if unknown:
        _collection_error(f"{name}: @pytest.mark.killpoint got unknown keyword "
                                f"{', '.join(map(repr, unknown))}; it takes {', '.join(_MARKER_KEYS)}")
    out = {"points": None, "target": "reference", "workers": 2, "steps": None, "action": None,
           "workload": None, "seed": None, "check": True, **kwargs}
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


def _declared_points(name: str, target: Any) -> tuple[str, ...]:
    """The crash points a marked test's target declares (a collection error if it cannot be found)."""
    from killpoint.harness.targets import InvalidTarget, declared

    try:
        return declared(target).points
    except InvalidTarget as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint(target={target!r}): {exc}")


def _collection_error(message: str) -> NoReturn:
    """Fail the collection of a test with just ``message`` (the plugin's traceback helps nobody)."""
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def _case_of(item: pytest.Item) -> _Case | None:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("killpoint") if callspec is not None else None
    return case if isinstance(case, _Case) else None
