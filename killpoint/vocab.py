"""The words of a history: process names, event types, event kinds and the downstream's outcomes.

Every writer of a history (the worker's journal, the store's event table, the downstream's ledger,
the harness) and every reader (checkers, narration, reports, scenarios) names these strings through
the constants below, so a writer and a reader cannot drift apart: a reader that tests for a kind
no writer ever writes is a branch that never runs. The strings themselves are the history's file
format (journals and ledgers are JSON), so they never change; only the names in code are shared.

This module imports nothing, so the lowest layer (``chaos``) can use it as well as the harness.
"""

from __future__ import annotations

# -- processes (``Event.process``) --------------------------------------------------------------------
# Three fixed sources; every other process name is a worker incarnation ("A", "B", "A.2").
STORE = "store"
DOWNSTREAM = "downstream"
HARNESS = "harness"
NON_WORKERS = frozenset({STORE, DOWNSTREAM, HARNESS})

# -- types (``Event.type``): an operation is invoked, then completes ok / fail / info ------------------
INVOKE = "invoke"
OK = "ok"  # took effect
FAIL = "fail"  # certainly did not take effect
INFO = "info"  # unknown: it may or may not have taken effect (indeterminate)
EVENT = "event"  # a plain fact, not an operation
COMPLETIONS = frozenset({OK, FAIL, INFO})

# -- verdict words: what every command, the narration and the pytest plugin print for a verdict --------
# One word per verdict everywhere (a reader of a CI log greps for one); the JSON says true/false/null.
VERDICT_WORDS = {True: "valid", False: "VIOLATED", None: "unknown"}

# -- worker journal kinds --------------------------------------------------------------------------------
# Operations (invoke, then a completion sharing its ``op``).
CLAIM = "claim"
CALL = "call"
RECEIPT = "receipt"
COMMIT = "commit"
OP_KINDS = frozenset({CLAIM, CALL, RECEIPT, COMMIT})
# Plain events.
POINT = "point"  # a failpoint hit; ``action`` is None when nothing fired
RECOVER = "recover"  # the evidence about earlier attempts and the action decided
CHECKPOINT = "checkpoint"  # an instance's checkpoint not read as is: migrated or refused
HEARTBEAT_LOST = "heartbeat_lost"  # the heartbeat found the lease gone
STORE_UNAVAILABLE = "store_unavailable"  # the store connection died; the worker goes on
START = "start"  # the worker process began (pid)
FINISH = "finish"  # the target returned
RAISED = "raised"  # the target raised (error, exception, where, traceback): a finding, the run unknown
SOMETIMES = "sometimes"  # killpoint.sometimes(name, condition): an expectation evaluated (name, reached)
# Written by the Temporal targets.
ACTIVITY = "activity"  # a Temporal activity began
REPLAYED = "replay"  # a workflow history replayed against the code (``outcome``, ``detail``)
# Written by the library targets.
LIBRARY_ERROR = "library_error"  # procrastinate: the library failed a job (error)
LEASE_LOST = "lease_lost"  # langgraph: the thread's lease was taken over (instance, fence, error)

# -- store event kinds ---------------------------------------------------------------------------------
CREATED = "created"
CLAIMED = "claimed"
COMMITTED = "committed"
COMMIT_REJECTED = "commit_rejected"
RENEWED = "renewed"
RELEASED = "released"
RECEIPT_RECORDED = "receipt_recorded"
STUCK_FLAGGED = "stuck_flagged"
OPERATOR_RESOLVED = "operator_resolved"
APPROVED = "approved"
# The store events that changed a step; ``commit_rejected`` changed nothing.
ACCEPTED_TRANSITIONS = frozenset({CLAIMED, COMMITTED, OPERATOR_RESOLVED, APPROVED})
# Every kind a store event may have (also those a target's ``history()`` hook gives).
STORE_KINDS = frozenset({CREATED, CLAIMED, COMMITTED, COMMIT_REJECTED, RENEWED, RELEASED,
                         RECEIPT_RECORDED, STUCK_FLAGGED, OPERATOR_RESOLVED, APPROVED})

# -- the downstream ledger -------------------------------------------------------------------------------
REQUEST = "request"  # the one kind of a ledger row
# Outcomes (``outcome`` of a request).
APPLIED = "applied"  # a new effect happened
DECLINED = "declined"  # a new, permanent refusal (402), recorded under the key
REPLAY = "replay"  # the stored answer for the key, sent again
CONFLICT = "conflict"  # the key was reused with another intent (422)
IN_FLIGHT = "in_flight"  # the key's first request is still being applied (409)
MISSING_KEY = "missing_key"  # a keyed resource got no key (400)
STALE_FENCE = "stale_fence"  # a fence lower than one already seen in the scope (409)
ERROR = "error"  # a bad request or an injected failure
DROPPED = "dropped"  # applied, but the answer was never sent
OUTCOMES = frozenset({APPLIED, DECLINED, REPLAY, CONFLICT, IN_FLIGHT, MISSING_KEY, STALE_FENCE, ERROR,
                      DROPPED})

# -- harness kinds -------------------------------------------------------------------------------------
SPAWN = "spawn"
KILL = "kill"
STOP = "stop"
CONT = "cont"
EXIT = "exit"
BOUND_HIT = "bound_hit"
DOWNSTREAM_RESTART = "downstream_restart"
TARGET_RESTART = "target_restart"  # fault, ok: the target's own server restarted by its restart() hook
STORE_RESTART = "store_restart"
AFTER_QUIESCENT = "after_quiescent"
TERMINATE_BACKEND = "terminate_backend"
INFRASTRUCTURE_FAILURE = "infrastructure_failure"  # phase, error: the run ended unknown
STARVED = "starved"  # ms: the harness's own wait overran by this much (the machine was busy)
REPLACEMENTS_STOPPED = "replacements_stopped"  # worker, error: the target raised the same exception again
# workers, seconds, wall_s, capped: resumed workers still running that long after done() in time they
# could run (waits for a CPU not counted), wall_s on the clock; capped: starved until the wall-time cap
LATE_GRACE_OVER = "late_grace_over"
# faults, seconds: the target's done() said the work was finished that long with these faults still
# unfired; the run ended (unknown for them) instead of waiting out its bound
UNFIRED_GIVEN_UP = "unfired_given_up"
# worker, point, instance, step, frozen: a worker that reached another's resume moment waits there (the
# frozen one goes on meanwhile); its release is a ``cont`` without a signal
HELD = "held"

# -- why a frozen worker came back (``cont``'s ``why``; ``moment`` names the moment asked for) ---------
RESUMED_AT = "moment"  # another worker reached the point the pause named (``by``: that worker)
RESUMED_LAPSED = "lapsed"  # its lease lapsed and another worker was about to take the step
RESUMED_MOVED = "moved_on"  # its step moved on (a plain pause's moment)
RESUMED_DONE = "done"  # the work was finished without it
RESUMED_NOBODY = "nobody_can_move"  # no other worker is left that could move
RESUMED_BLOCKED = "blocked"  # no unfrozen worker made progress for the blocked bound of run time
RESUMED_RESTART = "restart_done"  # it only waited for a restart, which is done
RESUMED = frozenset({RESUMED_AT, RESUMED_LAPSED, RESUMED_MOVED, RESUMED_DONE, RESUMED_NOBODY,
                     RESUMED_BLOCKED, RESUMED_RESTART})
# why a held worker was let go (``cont`` without a signal, ``why``)
RELEASED_AFTER = "late_attempt_over"  # the resumed worker's late attempt at the step is over
RELEASED_BLOCKED = RESUMED_BLOCKED
# Every kind a harness action may have.
HARNESS_KINDS = frozenset({SPAWN, KILL, STOP, CONT, EXIT, BOUND_HIT, DOWNSTREAM_RESTART, TARGET_RESTART,
                           STORE_RESTART, AFTER_QUIESCENT, TERMINATE_BACKEND, INFRASTRUCTURE_FAILURE,
                           STARVED, REPLACEMENTS_STOPPED, LATE_GRACE_OVER, UNFIRED_GIVEN_UP, HELD})
