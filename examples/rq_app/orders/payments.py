"""The shop's client of its stock and payment service: one POST per request, JSON in and out."""

import json
import os
import time
import urllib.error
import urllib.request
import uuid


def service_url() -> str:
    # PAYMENTS_URL in production; in a killpoint crash test, killpoint's stand-in for the service.
    return os.environ.get("KILLPOINT_DOWNSTREAM_URL") or os.environ.get("PAYMENTS_URL", "http://localhost:8000")


def post(resource: str, params: dict, *, key: str | None = None) -> dict:
    """Ask ``resource`` for an effect. The Idempotency-Key is ``key``, or a new request id."""
    body = json.dumps({"params": params}).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key or str(uuid.uuid4())}
    for _ in range(100):
        request = urllib.request.Request(f"{service_url()}/resources/{resource}", data=body, headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as error:
            if error.code != 409:  # 409: the same key is being applied right now; ask again
                raise
        time.sleep(0.01)
    raise RuntimeError(f"{resource}: the request stayed in flight")
