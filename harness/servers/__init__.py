"""Targets for the durable-execution servers: Temporal and Restate.

Each system's SDK is an optional extra (``killpoint[temporal]``, ``killpoint[restate]``) and is
imported only when one of its targets is named, so killpoint works without them.

``temporal-activity:naive`` / ``temporal-activity:keyed``
    The order's steps as Temporal activities, run with the official SDK's
    ``temporalio.testing.ActivityEnvironment`` in killpoint's forked worker processes. The harness
    plays the Temporal server's part (see :mod:`killpoint.harness.servers.temporal`).
``restate:naive`` / ``restate:keyed``
    The order as a Restate service, served by hypercorn in the worker processes and driven by a real
    Restate server that the harness starts on loopback (see :mod:`killpoint.harness.servers.restate`).

``naive`` mints a random idempotency key in each attempt; ``keyed`` derives it from what the
system keeps stable across retries (``workflow_id:activity_id`` in Temporal, the invocation id and
the step in Restate).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # imported lazily: Temporal's workflow sandbox re-imports this package
    from killpoint.harness.downstream import Answer, DownstreamClient

__all__ = ["KEY_POLICIES", "SdkMissing", "call_downstream", "check_policy", "random_key"]

KEY_POLICIES = ("naive", "keyed")


def check_policy(family: str, policy: str) -> None:
    """Refuse a key policy ``family:policy`` does not have, naming the ones it has."""
    if policy not in KEY_POLICIES:
        raise ValueError(f"{family}:{policy}: expected one of "
                         f"{', '.join(f'{family}:{p}' for p in KEY_POLICIES)}")


class SdkMissing(ImportError):
    """A server target was named but its SDK is not installed (say which extra brings it)."""


def random_key() -> str:
    """The naive key: new in every attempt, as ``str(uuid4())`` written inside the step."""
    return uuid.uuid4().hex


def call_downstream(client: "DownstreamClient", *, resource: str, key: str, params: dict[str, Any],
                    meta: dict[str, Any], in_call: Callable[[], Any] | None = None) -> "Answer":
    """The side effect every server target's step makes: one keyed POST to the downstream."""
    return client.call(resource, key=key, params=params, meta=meta, before_read=in_call)
