"""The invariants of DESIGN section 7 (its ten, then checkpoints_honoured, lease_fenced, fence_rises and
receipt_first for the bug classes it names beyond them), each a pure function ``History -> Result``,
gathered from the modules of their families: :mod:`.ledger` (effects), :mod:`.leases` (leases and
fences), :mod:`.state_machine` (a step's transitions), :mod:`.liveness` and :mod:`.checkpoints`.

No checker does I/O or reads a clock: they only walk the events of one history, so each one is
tested on small hand-written histories. Every violation names the events that prove it, so a report
can point at them. ``checked`` says whether the history had anything for the invariant to judge: a
run with no reused key says nothing about ``intent_conflict`` and must not count as evidence for it.
"""

from __future__ import annotations

from killpoint.harness.checkers.checkpoints import REFUSED as REFUSED
from killpoint.harness.checkers.checkpoints import checkpoints_honoured as checkpoints_honoured
from killpoint.harness.checkers.leases import fence_rises as fence_rises
from killpoint.harness.checkers.leases import lease_fenced as lease_fenced
from killpoint.harness.checkers.leases import stale_writes_rejected as stale_writes_rejected
from killpoint.harness.checkers.ledger import effects_accounted as effects_accounted
from killpoint.harness.checkers.ledger import intent_conflict as intent_conflict
from killpoint.harness.checkers.ledger import no_duplicate_effects as no_duplicate_effects
from killpoint.harness.checkers.ledger import receipt_first as receipt_first
from killpoint.harness.checkers.ledger import retry_budget as retry_budget
from killpoint.harness.checkers.liveness import stuck_detected as stuck_detected
from killpoint.harness.checkers.liveness import terminates as terminates
from killpoint.harness.checkers.state_machine import legal_transitions as legal_transitions
from killpoint.harness.checkers.state_machine import manual_stable as manual_stable
from killpoint.harness.checkers.state_machine import version_chain as version_chain

# The order is the order of DESIGN section 7 (and of reports), then the checkpoint rule of section 3,
# then the lease, fence and receipt rules of section 7's bug classes.
CHECKERS = (no_duplicate_effects, effects_accounted, stale_writes_rejected, version_chain,
            legal_transitions, manual_stable, intent_conflict, retry_budget, terminates,
            stuck_detected, checkpoints_honoured, lease_fenced, fence_rises, receipt_first)
