"""Intents and idempotency keys: what a step asks a downstream to do, and its stable name."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


def canonical(params: Mapping[str, Any]) -> str:
    """The canonical JSON text of an intent's parameters (sorted keys, no spaces)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def intent_hash(params: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(params).encode()).hexdigest()[:16]


def idempotency_key(instance: str, step: str, resource: str, version: str) -> str:
    """``instance:step:resource-version``: stable across retries, never a random request id."""
    return f"{instance}:{step}:{resource}-{version}"
