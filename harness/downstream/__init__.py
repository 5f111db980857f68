"""The fake downstream: a real HTTP service with idempotency keys, fencing tokens and a ledger.

The server runs in its own OS process on ``127.0.0.1`` and an ephemeral port, forked from the
caller with :func:`start`. It keeps everything in one SQLite file (WAL), so a new process on the
same file -- :meth:`DownstreamProcess.restart` -- sees every earlier key, receipt and fence. One
server serves many runs at once; each run is isolated by the run id in the URL path.

Semantics follow the Idempotency-Key header draft and Stripe. For ``POST /runs/{run}/resources/{r}``
the rules are applied in this order:

1. fencing resource, ``Fencing-Token`` lower than the highest seen for ``(run, scope)`` → 409
   ``stale_fence``, no effect (equal passes; a higher one becomes the highest seen);
2. keyed (non-legacy) resource without ``Idempotency-Key`` → 400 ``missing_key``;
3. key known and still being processed → 409 ``in_flight``;
4. key known, finished, same resource and intent hash → the stored answer again, with
   ``"replay": true`` and the header ``Idempotent-Replayed: true``; no new effect;
5. key known, other intent (or other resource) → 422 ``intent_conflict``, never the old result
   (config ``ignore_intent`` turns this into a replay of the old result: a deliberate mutant);
6. otherwise (a new key; a legacy resource always) the request is applied: ``"card": "declined"``
   in the parameters answers 402 and stores that outcome for the key, anything else applies one
   effect and answers 200.

Injected faults only touch requests that reach rule 6 (the apply path): ``status:N`` answers N with
no effect and no stored key (a retry is a fresh attempt); ``latency:MS`` marks the key in flight and
sleeps; ``drop`` applies and stores the outcome as usual, then closes the connection without an
answer (ledger outcome ``dropped``; ``applied`` stays the truth: false for a declined card).

Every resource request, whatever its outcome, is one ledger row, committed before the answer is
sent: the ledger is the ground truth the checkers trust (see :mod:`killpoint.harness.history`).

One module per job: :mod:`.ledger` (the semantics above), :mod:`.server` (HTTP), :mod:`.process`
(starting, restarting and reaping the server process) and :mod:`.client`.
"""

from __future__ import annotations

from killpoint.harness.downstream.client import Answer, DownstreamClient, LostResponse
from killpoint.harness.downstream.ledger import DEFAULT_RESOURCE, OUTCOMES
from killpoint.harness.downstream.process import DownstreamProcess, start

__all__ = ["Answer", "DownstreamClient", "DownstreamProcess", "LostResponse", "start",
           "DEFAULT_RESOURCE", "OUTCOMES"]
