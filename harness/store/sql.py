"""The store protocol written once, in SQL both backends speak.

A backend supplies its dialect (database time, placeholders, table names, the row lock a read that
precedes a write takes) and its transactions (``_write`` runs a function in one write transaction,
``_read`` in a read); everything the protocol decides lives here, so the two stores cannot drift.
Statements use ``?`` placeholders and ``{steps}``, ``{receipts}``, ``{events}``, ``{instances}``,
``{now}``, ``{lock}`` and ``{skip_locked}``, which :meth:`SqlStore._q` fills in for the dialect.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, TypeVar

from killpoint import vocab
from killpoint.harness import states
from killpoint.harness.store.base import Claim, Store, StoreError, row_dict

T = TypeVar("T")

_EVENT = ("INSERT INTO {events} (t, db_time, kind, instance, step, worker, from_state, to_state, "
          "state_version, fence, lease_version, attempt, data) "
          "VALUES (?, {now}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


# A lease whose heartbeat goes on while its step's progress stopped more than the bound ago.
_STUCK = "owner_worker IS NOT NULL AND expires_at >= {now} AND progress_at < {now} - ?"
_ANY_STUCK = "SELECT 1 FROM {steps} WHERE " + _STUCK + " LIMIT 1"
_STUCK_ROWS = ("SELECT instance, step, owner_worker, lease_version, state_version, state, "
               "({now} - progress_at) * 1000.0 FROM {steps} WHERE " + _STUCK +
               " ORDER BY instance, step{skip_locked}")


def event_args(kind: str, instance: str | None, step: str | None, *, worker: str | None = None,
               from_state: str | None = None, to_state: str | None = None,
               state_version: int | None = None, fence: int | None = None,
               lease_version: int | None = None, attempt: int | None = None,
               **data: Any) -> tuple[Any, ...]:
    """The values of one event row; ``t`` is CLOCK_MONOTONIC in the writing process."""
    return (time.monotonic_ns(), kind, instance, step, worker, from_state, to_state, state_version,
            fence, lease_version, attempt, json.dumps(data, default=str))


def _columns(cur: Any) -> list[str]:
    return [getattr(d, "name", None) or d[0] for d in cur.description or ()]


class SqlStore(Store):
    """The protocol; subclasses set the dialect and implement ``_write``, ``_read`` and ``_tables``."""

    NOW = ""  # database time as epoch seconds (a float)
    LOCK = ""  # appended to a read that precedes a write: " FOR UPDATE" where rows lock
    SKIP_LOCKED = ""  # for the monitor's scan: " FOR UPDATE SKIP LOCKED" where rows lock
    PARAM = "?"

    def _tables(self) -> dict[str, str]:
        raise NotImplementedError

    def _write(self, fn: Callable[[Any], T], *, points: bool = True) -> T:
        raise NotImplementedError

    def _read(self, fn: Callable[[Any], T]) -> T:
        raise NotImplementedError

    def _now(self, tables: dict[str, str]) -> str:
        """The run's time: the database's clock plus the run's offset (see :mod:`harness.clock`),
        read in the same statement, so every time the protocol compares is the run's."""
        return f"({self.NOW} + (SELECT offset_s FROM {tables['clock']}))"

    def _q(self, sql: str) -> str:
        # A store's statements are a fixed set, and its tables never change: each is made once.
        cache = self.__dict__.setdefault("_sql", {})
        text = cache.get(sql)
        if text is None:
            tables = self._tables()
            text = sql.format(now=self._now(tables), lock=self.LOCK, skip_locked=self.SKIP_LOCKED,
                              **tables)
            text = cache[sql] = text if self.PARAM == "?" else text.replace("?", self.PARAM)
        return text

    def _event_sql(self) -> str:
        return self._q(_EVENT)

    def _event(self, cur: Any, kind: str, instance: str | None, step: str | None, **kw: Any) -> None:
        cur.execute(self._event_sql(), event_args(kind, instance, step, **kw))

    def set_clock(self, offset_s: float) -> None:
        """Move the run's time to real time plus ``offset_s`` (the harness's; it only grows)."""
        self._write(lambda cur: cur.execute(self._q("UPDATE {clock} SET offset_s = ?"), (offset_s,)),
                    points=False)

    # -- reading ------------------------------------------------------------------------------------
    def now(self) -> float:
        return self._read(lambda cur: cur.execute(self._q("SELECT {now}")).fetchone()[0])

    def snapshot(self) -> tuple[float, list[dict[str, Any]]]:
        """Database time and every step row, in instance then step order (one statement)."""
        def do(cur: Any) -> tuple[float, list[dict[str, Any]]]:
            result = cur.execute(self._q("SELECT {now} AS now, s.* FROM {steps} s JOIN {instances} i "
                                         "ON i.id = s.instance ORDER BY i.seq, s.idx"))
            cols = _columns(result)
            rows = result.fetchall()
            if not rows:
                return cur.execute(self._q("SELECT {now}")).fetchone()[0], []
            dicts = [dict(zip(cols, r)) for r in rows]
            now = dicts[0]["now"]
            for d in dicts:
                del d["now"]
            return now, dicts
        return self._read(do)

    def steps(self) -> list[dict[str, Any]]:
        return self.snapshot()[1]

    def step_progress(self, instance: str, step: str) -> tuple[int, str | None] | None:
        row = self._read(lambda cur: cur.execute(
            self._q("SELECT state_version, owner_worker FROM {steps} WHERE instance = ? AND step = ?"),
            (instance, step)).fetchone())
        return None if row is None else (row[0], row[1])

    def instance(self, instance: str) -> dict[str, Any]:
        row = self._read(lambda cur: cur.execute(
            self._q("SELECT id, format_version, fingerprint, data, integrity FROM {instances} "
                    "WHERE id = ?"), (instance,)).fetchone())
        if row is None:
            raise StoreError(f"no instance {instance!r} in the store")
        return dict(zip(("id", "format_version", "fingerprint", "data", "integrity"), row))

    def events(self) -> list[dict[str, Any]]:
        def do(cur: Any) -> list[dict[str, Any]]:
            result = cur.execute(self._q("SELECT * FROM {events} ORDER BY seq"))
            cols = _columns(result)
            return [row_dict(dict(zip(cols, r))) for r in result.fetchall()]
        return self._read(do)

    def receipt(self, key: str) -> dict[str, Any] | None:
        row = self._read(lambda cur: cur.execute(
            self._q("SELECT key, instance, step, intent_hash, status, response FROM {receipts} "
                    "WHERE key = ?"), (key,)).fetchone())
        if row is None:
            return None
        d = dict(zip(("key", "instance", "step", "intent_hash", "status", "response"), row))
        d["response"] = json.loads(d["response"])
        return d

    # -- the protocol -------------------------------------------------------------------------------
    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        """Take the step if its version and state are as seen and its lease is free or expired.

        One conditional UPDATE (database time, the fence raised): of many workers claiming the same
        row at once, exactly one matches.
        """
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal claim {from_state} -> {to_state} for {instance}:{step}")
        attempt_sql = "1" if reset_attempt else "attempt + 1"

        def do(cur: Any) -> Claim | None:
            row = cur.execute(self._q(
                "UPDATE {steps} SET owner_worker = ?, lease_version = lease_version + 1, "
                "expires_at = {now} + ?, heartbeat_at = {now}, progress_at = {now}, "
                f"state = ?, state_version = state_version + 1, attempt = {attempt_sql} "
                "WHERE instance = ? AND step = ? AND state_version = ? AND state = ? "
                "AND (owner_worker IS NULL OR expires_at < {now}) "
                "RETURNING lease_version, state_version, attempt"),
                (worker, ttl_ms / 1000.0, to_state, instance, step, expected_state_version,
                 from_state)).fetchone()
            if row is None:
                return None
            fence, sv, attempt = row
            self._event(cur, vocab.CLAIMED, instance, step, worker=worker, from_state=from_state,
                        to_state=to_state, state_version=sv, fence=fence, lease_version=fence,
                        attempt=attempt)
            return Claim(instance, step, worker, fence, sv, attempt, from_state, to_state)
        return self._write(do)

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        """Compare-and-set on (state_version, lease_version, owner); a refusal is recorded."""
        if not states.allowed(claim.state, to_state):
            raise StoreError(f"illegal transition {claim.state} -> {to_state} for "
                             f"{claim.instance}:{claim.step}")

        def do(cur: Any) -> bool:
            row = cur.execute(self._q(
                "UPDATE {steps} SET state = ?, state_version = ?, owner_worker = NULL, expires_at = NULL, "
                "progress_at = {now} WHERE instance = ? AND step = ? AND state_version = ? "
                "AND lease_version = ? AND owner_worker = ? RETURNING state_version, lease_version"),
                (to_state, claim.state_version + 1, claim.instance, claim.step, claim.state_version,
                 claim.fence, claim.worker)).fetchone()
            if row is None:
                # Read under the row lock where rows lock, so the refusal is recorded against the
                # row as it is once any claim in flight has committed, never an older version.
                now = cur.execute(self._q("SELECT state_version, lease_version, owner_worker FROM {steps} "
                                          "WHERE instance = ? AND step = ?{lock}"),
                                  (claim.instance, claim.step)).fetchone()
                if now is None:
                    raise StoreError(f"no step {claim.instance}:{claim.step} in the store")
                self._event(cur, vocab.COMMIT_REJECTED, claim.instance, claim.step, worker=claim.worker,
                            from_state=claim.state, to_state=to_state, state_version=now[0],
                            fence=claim.fence, lease_version=now[1], attempt=claim.attempt,
                            expected_state_version=claim.state_version, current_owner=now[2], **detail)
                return False
            self._event(cur, vocab.COMMITTED, claim.instance, claim.step, worker=claim.worker,
                        from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                        lease_version=row[1], attempt=claim.attempt, **detail)
            return True
        return self._write(do)

    def settle(self, instance: str, step: str, *, expected_state_version: int, from_state: str,
               to_state: str, worker: str, **detail: Any) -> bool:
        """A lease-free planning transition (e.g. pending -> cancelled), compare-and-set on the version."""
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal transition {from_state} -> {to_state} for {instance}:{step}")

        def do(cur: Any) -> bool:
            row = cur.execute(self._q(
                "UPDATE {steps} SET state = ?, state_version = state_version + 1 WHERE instance = ? "
                "AND step = ? AND state_version = ? AND state = ? AND owner_worker IS NULL "
                "RETURNING state_version, lease_version"),
                (to_state, instance, step, expected_state_version, from_state)).fetchone()
            if row is None:
                return False
            self._event(cur, vocab.COMMITTED, instance, step, worker=worker, from_state=from_state,
                        to_state=to_state, state_version=row[0], lease_version=row[1], **detail)
            return True
        return self._write(do)

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        """Extend the lease, only while it is still ours (same fence, same owner); a renewal is
        recorded as a ``renewed`` event, so the history shows who kept which lease alive."""
        def do(cur: Any) -> bool:
            row = cur.execute(self._q(
                "UPDATE {steps} SET expires_at = {now} + ?, heartbeat_at = {now} "
                "WHERE instance = ? AND step = ? AND lease_version = ? AND owner_worker = ? "
                "RETURNING lease_version"),
                (ttl_ms / 1000.0, claim.instance, claim.step, claim.fence, claim.worker)).fetchone()
            if row is None:
                return False
            self._event(cur, vocab.RENEWED, claim.instance, claim.step, worker=claim.worker,
                        fence=claim.fence, lease_version=row[0])
            return True
        return self._write(do, points=False)

    def release(self, claim: Claim) -> bool:
        """Give the lease up without a transition (the worker stops working on the step), only
        while it is still ours; recorded as a ``released`` event. The next claim raises the fence."""
        def do(cur: Any) -> bool:
            row = cur.execute(self._q(
                "UPDATE {steps} SET owner_worker = NULL, expires_at = NULL "
                "WHERE instance = ? AND step = ? AND lease_version = ? AND owner_worker = ? "
                "RETURNING lease_version, state_version"),
                (claim.instance, claim.step, claim.fence, claim.worker)).fetchone()
            if row is None:
                return False
            self._event(cur, vocab.RELEASED, claim.instance, claim.step, worker=claim.worker,
                        fence=claim.fence, lease_version=row[0], state_version=row[1])
            return True
        return self._write(do, points=False)

    def progress(self, claim: Claim) -> None:
        self._write(lambda cur: cur.execute(self._q(
            "UPDATE {steps} SET progress_at = {now} WHERE instance = ? AND step = ? "
            "AND lease_version = ? AND owner_worker = ?"),
            (claim.instance, claim.step, claim.fence, claim.worker)))

    def record_receipt(self, claim: Claim, key: str, intent_hash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        """Keep the first receipt for a key (a later one for the same key is ignored)."""
        def do(cur: Any) -> None:
            cur.execute(self._q("INSERT INTO {receipts} (key, instance, step, intent_hash, status, response) "
                                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING"),
                        (key, claim.instance, claim.step, intent_hash, status, json.dumps(response)))
            # Progress only under our fence, but the row is written (and so locked) either way.
            cur.execute(self._q("UPDATE {steps} SET progress_at = CASE WHEN lease_version = ? "
                                "THEN {now} ELSE progress_at END WHERE instance = ? AND step = ?"),
                        (claim.fence, claim.instance, claim.step))
            self._event(cur, vocab.RECEIPT_RECORDED, claim.instance, claim.step, worker=claim.worker,
                        fence=claim.fence, key=key, status=status)
        self._write(do)

    def flag_stuck(self, bound_ms: float, worker: str) -> list[tuple[str, str]]:
        """Flag leases whose heartbeat goes on but whose progress stopped more than ``bound_ms`` ago,
        and free them so another worker can take over (the next claim raises the fence).

        Where rows lock, the rows found are locked, so a commit or another monitor cannot slip in
        between finding and freeing; skipping locked rows in a fixed order means monitors never wait
        on each other or deadlock (a busy row is looked at again on the next poll).
        """
        # Almost always nothing is stuck: a read says so without taking the write lock that every
        # worker's claims and commits wait for (the write below looks again, under that lock).
        bound_s = bound_ms / 1000.0
        probe = self._q(_ANY_STUCK)
        if not self._read(lambda cur: cur.execute(probe, (bound_s,)).fetchone()):
            return []

        def do(cur: Any) -> list[tuple[str, str]]:
            rows = cur.execute(self._q(_STUCK_ROWS), (bound_s,)).fetchall()
            found = []
            for inst, step, owner, fence, sv, state, idle_ms in rows:
                cur.execute(self._q("UPDATE {steps} SET owner_worker = NULL, expires_at = NULL "
                                    "WHERE instance = ? AND step = ? AND lease_version = ?"),
                            (inst, step, fence))
                self._event(cur, vocab.STUCK_FLAGGED, inst, step, worker=worker, state_version=sv,
                            lease_version=fence, from_state=state, stuck_owner=owner,
                            idle_ms=round(idle_ms, 1))
                found.append((inst, step))
            return found
        return self._write(do)

    def resolve(self, instance: str, step: str, to_state: str, *, actor: str, evidence: str) -> bool:
        """An operator moves a step out of manual review by an appended event (actor, evidence)."""
        if not actor or not evidence:
            raise StoreError("an operator resolution needs both an actor and evidence")

        def do(cur: Any) -> bool:
            now = cur.execute(self._q("SELECT state, state_version FROM {steps} "
                                      "WHERE instance = ? AND step = ?{lock}"), (instance, step)).fetchone()
            if now is None or not states.allowed(now[0], to_state) or now[0] != states.MANUAL:
                return False
            row = cur.execute(self._q("UPDATE {steps} SET state = ?, state_version = state_version + 1 "
                                      "WHERE instance = ? AND step = ? AND state_version = ? "
                                      "RETURNING state_version, lease_version"),
                              (to_state, instance, step, now[1])).fetchone()
            if row is None:
                return False
            self._event(cur, vocab.OPERATOR_RESOLVED, instance, step, worker=None, from_state=now[0],
                        to_state=to_state, state_version=row[0], lease_version=row[1], actor=actor,
                        evidence=evidence)
            return True
        return self._write(do)
