"""Targets for real durable-execution libraries and task queues: DBOS, LangGraph, procrastinate,
Celery, RQ, Dramatiq, Huey and arq.

Each library is an optional extra (``pip install 'killpoint[dbos]'``) and each module here imports
its library only when a target of it is resolved, so killpoint works without them. Every module
gives two targets that run the same workflow as that library's own workflow, graph or job, call the
downstream by URL with a plain HTTP client, and recover through the library's own path:

``naive``  a new random idempotency key per attempt (what a step that builds its key inside the
           attempt does): a crash after the call and before the library records the step applies
           the effect twice, and killpoint says so.
``keyed``  a key that is stable across attempts (the workflow id and the step): the downstream
           answers the retry with the stored result.
"""

from __future__ import annotations

import importlib
from typing import Any

# library -> (module, the extra that installs it)
LIBRARIES = {"dbos": ("killpoint.harness.libs.dbos", "dbos"),
             "langgraph": ("killpoint.harness.libs.langgraph", "langgraph"),
             "procrastinate": ("killpoint.harness.libs.procrastinate", "procrastinate"),
             "celery": ("killpoint.harness.libs.celery", "celery"),
             "dramatiq": ("killpoint.harness.libs.dramatiq", "dramatiq"),
             "arq": ("killpoint.harness.libs.arq", "arq"),
             "rq": ("killpoint.harness.libs.rq", "rq"),
             "huey": ("killpoint.harness.libs.huey", "huey")}


def is_library_target(name: str) -> bool:
    return name.partition(":")[0] in LIBRARIES


def resolve(name: str) -> Any:
    """``dbos:naive`` and the like, as a declared target; a clear error when the extra is missing."""
    from killpoint.errors import InvalidTarget

    library, _, variant = name.partition(":")
    module_name, extra = LIBRARIES[library]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidTarget(f"target {name!r} needs the {library} library, which is not installed "
                            f"({exc}); install it with: pip install 'killpoint[{extra}]'") from None
    return module.target_named(variant)
