"""What a user's editor and ``mypy --strict`` see through ``import killpoint``: the real types.

Never run, only type-checked (``.ci/typecheck``). If a public name reached a type checker as
``Any`` (say, through the lazy module ``__getattr__``), ``assert_type`` below would fail.
"""

from __future__ import annotations

from typing_extensions import assert_type

import killpoint
from killpoint import Claim, CrashVerdict, RunConfig, RunResult, Session, WorkerContext, parse_schedule


def worker(ctx: WorkerContext) -> None:
    assert_type(ctx.worker_id, str)
    claim = ctx.store.claim("order-1", "charge", ctx.worker_id, expected_state_version=1,
                            from_state="pending", to_state="running", ttl_ms=ctx.timing.lease_ttl_ms)
    assert_type(claim, Claim | None)
    if claim is not None:
        assert_type(claim.fence, int)
        assert_type(ctx.store.commit(claim, "succeeded"), bool)
    ctx.point("before_call")


@killpoint.target(points=("before_call", "after_call"), workload="single")
def declared(ctx: WorkerContext) -> None:
    ctx.heartbeat.release()  # always there: the harness (or the context itself) makes one
    ctx.point("after_call")


@killpoint.target
def bare(ctx: WorkerContext) -> None:
    ctx.clock.sleep(0.1)


def declarations() -> None:
    assert_type(declared, killpoint.Target)
    assert_type(bare, killpoint.Target)
    assert_type(declared.points, "tuple[str, ...]")


def session() -> None:
    with Session() as s:
        result = s.run(RunConfig(schedule=parse_schedule("A@charge.after_call:kill"), target=worker))
        assert_type(result, RunResult)
        assert_type(result.valid, bool | None)


def verdict(v: CrashVerdict) -> None:
    assert_type(v, CrashVerdict)


def errors() -> None:
    try:
        parse_schedule("A@nowhere:kill")
    except killpoint.KillpointError as exc:
        assert_type(exc, killpoint.KillpointError)
