"""A user's own task-queue app as a target, run as it is: ``celery:PKG.MODULE:NAME``, ``rq:PKG.MODULE:NAME``.

What the library-specific modules (:mod:`killpoint.harness.libs.celery_app`,
:mod:`killpoint.harness.libs.rq_app`) share, and nothing that imports a library:

* the user's object named by ``PKG.MODULE:NAME``, imported as ``--target pkg.module:function`` is
  (the working directory on the path), with one line naming the target when it is not there;
* the workload: one order, ``order-1``, whose steps are the tasks the user's function makes for
  it, each named by its function (``charge_card``). Its name is a ``pkg.module:attr`` that
  :func:`killpoint.harness.workload.resolve_workload` resolves through this module's
  ``__getattr__``, so a replay, a ``--jobs`` runner and the pytest plugin build the same one;
* the crash points the user marks: every ``killpoint.point("NAME")`` with a literal name in the
  source of the modules that define the order's tasks;
* in each worker, what the user's tasks need to reach killpoint's downstream: its URL in the
  environment (:data:`DOWNSTREAM_ENV`, read by the app when it calls), and on every request to it
  made through :mod:`http.client` (urllib, requests, urllib3) the ``Killpoint-Instance``,
  ``Killpoint-Step`` and ``Killpoint-Worker`` headers of the task being run, so the ledger knows
  which step an effect belongs to whatever key the app sent.
"""

from __future__ import annotations

import ast
import http.client
import importlib
import inspect
import os
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from killpoint.chaos import points as chaos
from killpoint.errors import InvalidTarget, shown

# The environment variable a worker sets to the run's downstream URL, for the user's tasks.
DOWNSTREAM_ENV = "KILLPOINT_DOWNSTREAM_URL"
# The one order a run places (the user's function gets this id).
ORDER_ID = "order-1"
# library -> the module that runs a user's app of it
MODULES = {"celery": "killpoint.harness.libs.celery_app", "rq": "killpoint.harness.libs.rq_app"}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def is_app(variant: str) -> bool:
    """``pkg.module:name`` (after the library's prefix), not a built-in variant such as ``naive``."""
    module, sep, attr = variant.partition(":")
    return bool(sep) and bool(module) and bool(attr) and all(p.isidentifier() for p in module.split("."))


def load(lib: str, spec: str) -> Any:
    """The object ``spec`` (``pkg.module:name``) names; :class:`InvalidTarget` naming the target."""
    from killpoint.harness.importing import import_user_module

    module_name, _, attr = spec.partition(":")
    if not attr.isidentifier():
        raise InvalidTarget(f"target {shown(f'{lib}:{spec}')}: expected {lib}:pkg.module:function")
    try:
        module = import_user_module(module_name)
    except ValueError as exc:
        raise InvalidTarget(f"target {shown(f'{lib}:{spec}')}: {exc}") from None
    found = getattr(module, attr, None)
    if found is None:
        raise InvalidTarget(f"target {shown(f'{lib}:{spec}')}: {shown(module_name)} has no {shown(attr)}")
    return found


def workload_name(lib: str, spec: str) -> str:
    """The name the target declares as its workload: resolved by this module's ``__getattr__``."""
    return f"{__name__}:{lib}:{spec}"


def __getattr__(name: str) -> Any:
    """``celery:pkg.module:name`` -> the function of the seed that builds that target's workload."""
    lib, sep, spec = name.partition(":")
    if not sep or lib not in MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(MODULES[lib])

    def build(seed: int = 0) -> Any:
        return module.workload(spec, seed)

    return build


def step_names(task_names: Iterable[str]) -> list[str]:
    """Each task's step name: its function's name (``shop.tasks.charge_card`` -> ``charge_card``),
    ``charge_card-2`` for the second task of the same name in one order."""
    out: list[str] = []
    for task in task_names:
        short = "".join(c if c in _NAME_CHARS else "_" for c in str(task).rsplit(".", 1)[-1]) or "task"
        if not short[0].isalpha():
            short = f"t{short}"
        name, n = short, 1
        while name in out:
            n += 1
            name = f"{short}-{n}"
        out.append(name)
    return out


def order_workload(lib: str, spec: str, steps: list[tuple[str, str]]) -> Any:
    """The workload of one order whose steps are ``(step, task name)``: each an idempotent call, its
    resource named after the task (what the app calls it is the app's)."""
    from killpoint.harness.workload import IDEMPOTENT, InstanceSpec, StepSpec, Workload

    return Workload(workload_name(lib, spec), (InstanceSpec(ORDER_ID, tuple(
        StepSpec(step, IDEMPOTENT, task) for step, task in steps)),))


# -- the points the user marks -----------------------------------------------------------------------


def user_points(functions: Iterable[Callable[..., Any]]) -> tuple[str, ...]:
    """Every ``killpoint.point("NAME")`` (or ``point("NAME")`` imported from killpoint) with a
    literal name in the source files that define ``functions``, in source order."""
    files = []
    for fn in functions:
        try:
            path = inspect.getsourcefile(inspect.unwrap(fn))
        except TypeError:
            path = None
        if path and path not in files:
            files.append(path)
    found: list[str] = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
        except (OSError, SyntaxError, ValueError):
            continue
        for name in _points_in(tree):
            if name not in found:
                found.append(name)
    return tuple(found)


def _points_in(tree: ast.AST) -> list[str]:
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "killpoint" for alias in node.names if alias.name == "point"}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        marked = ((isinstance(f, ast.Attribute) and f.attr == "point" and isinstance(f.value, ast.Name)
                   and f.value.id == "killpoint") or (isinstance(f, ast.Name) and f.id in bare))
        first = node.args[0]
        if marked and isinstance(first, ast.Constant) and isinstance(first.value, str):
            calls.append((node.lineno, node.col_offset, first.value))
    return [name for _, _, name in sorted(calls)]


# -- in a worker -------------------------------------------------------------------------------------

_tagging: dict[str, Any] = {}  # this process's: the downstream's (host, port), the worker id


def enter_worker(ctx: Any) -> None:
    """In a worker, before the library's worker starts: the downstream's URL in the environment,
    and the requests to it tagged with the step being run."""
    os.environ[DOWNSTREAM_ENV] = ctx.downstream_url
    parts = urlsplit(ctx.downstream_url)
    _tagging.update(address=(parts.hostname, parts.port), worker=ctx.worker_id)
    if not getattr(http.client.HTTPConnection.endheaders, "_killpoint", False):
        original = http.client.HTTPConnection.endheaders

        def endheaders(self: http.client.HTTPConnection, *args: Any, **kwargs: Any) -> Any:
            _tag(self)
            return original(self, *args, **kwargs)

        endheaders._killpoint = True  # type: ignore[attr-defined]
        http.client.HTTPConnection.endheaders = endheaders  # type: ignore[method-assign]


def _tag(conn: http.client.HTTPConnection) -> None:
    """Say which step a request to the downstream is for: the one the worker is in."""
    fp = chaos.installed()
    if fp is None or (conn.host, conn.port) != _tagging.get("address"):
        return
    instance, step = fp.where
    if instance is None or step is None:
        return
    conn.putheader("Killpoint-Instance", instance)
    conn.putheader("Killpoint-Step", step)
    conn.putheader("Killpoint-Worker", str(_tagging.get("worker")))
