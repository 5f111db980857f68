"""Targets: the worker code under test, named on the command line or in a test."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Callable, Mapping

from killpoint.harness import declaration
from killpoint.harness.declaration import InvalidTarget
from killpoint.harness.worker import WorkerContext, reference

if TYPE_CHECKING:
    from killpoint.harness.mutants import Mutant

# What a run accepts as a target besides a name: a function taking a WorkerContext (a declared
# :class:`killpoint.harness.declaration.Target` is one too).
WorkerFn = Callable[[WorkerContext], None]
__all__ = ["InvalidTarget", "WorkerFn", "declared", "resolve"]


def mutants() -> Mapping[str, Mutant]:
    from killpoint.harness.mutants import MUTANTS

    return MUTANTS


def declared(target: "str | WorkerFn") -> declaration.Target:
    """The target with its declaration: a plain function declares the built-in points and no state."""
    fn = resolve(target)
    if isinstance(fn, declaration.Target):
        return fn
    return declaration.Target(fn, name=target if isinstance(target, str) else None)


# Built-in targets of the durable-execution servers (killpoint.harness.servers), by name prefix;
# each imports its SDK only when named.
SERVER_TARGETS = ("temporal-activity", "temporal", "restate")


def _server_target(name: str) -> WorkerFn | None:
    kind, sep, policy = name.partition(":")
    if not sep or kind not in SERVER_TARGETS:
        return None
    from killpoint.harness import servers

    try:
        if kind == "temporal-activity":
            from killpoint.harness.servers.temporal import activity_target

            return activity_target(policy)
        if kind == "temporal":
            from killpoint.harness.servers.temporal_server import server_target

            return server_target(policy)
        from killpoint.harness.servers.restate import restate_target  # restate: the last of SERVER_TARGETS

        return restate_target(policy)
    except (ValueError, servers.SdkMissing) as exc:
        raise InvalidTarget(f"target {name[:200]!r}: {exc}") from None


def resolve(target: "str | WorkerFn") -> WorkerFn:
    """``reference``, ``mutant:NAME``, a library target (``dbos:naive``, ``langgraph:keyed``, ...),
    ``pkg.module:function``, or a callable taking a WorkerContext."""
    if callable(target):
        return target
    if not isinstance(target, str):
        raise InvalidTarget(f"target {target!r}: expected reference, mutant:NAME, pkg.module:function "
                            f"or a function taking a WorkerContext")
    if target == "reference":
        return reference
    server = _server_target(target)
    if server is not None:
        return server
    if target.startswith("mutant:"):
        name = target.split(":", 1)[1]
        zoo = mutants()
        if name not in zoo:
            known = ", ".join(sorted(zoo)) or "none yet"
            raise InvalidTarget(f"unknown mutant {name!r}: known mutants are {known}")
        return zoo[name].target
    from killpoint.harness import libs

    if libs.is_library_target(target):  # dbos:naive, langgraph:keyed, ... (the library is an extra)
        return libs.resolve(target)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidTarget(f"target {target!r}: expected reference, mutant:NAME or pkg.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        # As ``python -m`` and pytest's rootdir do: a user's module in the working directory imports,
        # so a printed ``killpoint replay ... --target mymod:fn`` works as it is.
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidTarget(f"target {target!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InvalidTarget(f"target {target!r}: {module_name} has no function {attr!r}")
    return fn
