"""The downstream's semantics: one SQLite ledger per server, the rules of every request, in order.

See :mod:`killpoint.harness.downstream` for the rules; every method of :class:`Ledger` is one
transaction, committed before the answer is sent.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from killpoint import vocab
from killpoint.harness.intent import intent_hash

DEFAULT_RESOURCE: Mapping[str, bool] = {"legacy": False, "fencing": True}
OUTCOMES = vocab.OUTCOMES  # what the ledger records of each request (killpoint.vocab)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    run TEXT NOT NULL, seq INTEGER NOT NULL, t INTEGER NOT NULL, resource TEXT NOT NULL,
    key TEXT, scope TEXT, fence INTEGER, intent_hash TEXT, params TEXT NOT NULL,
    meta TEXT NOT NULL, status INTEGER NOT NULL, outcome TEXT NOT NULL, applied INTEGER NOT NULL,
    PRIMARY KEY (run, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (
    run TEXT NOT NULL, key TEXT NOT NULL, resource TEXT NOT NULL, intent_hash TEXT NOT NULL,
    state TEXT NOT NULL, status INTEGER, response TEXT,
    PRIMARY KEY (run, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fences (
    run TEXT NOT NULL, scope TEXT NOT NULL, highest INTEGER NOT NULL,
    PRIMARY KEY (run, scope)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS config (
    run TEXT PRIMARY KEY, config TEXT NOT NULL) WITHOUT ROWID;
"""


class BadRequest(Exception):
    pass


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | None
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False


def _normalize_config(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadRequest("config must be a JSON object")
    resources: dict[str, dict[str, bool]] = {}
    for name, spec in (raw.get("resources") or {}).items():
        if not isinstance(spec, dict):
            raise BadRequest(f"resource {name!r}: expected an object")
        resources[str(name)] = {"legacy": bool(spec.get("legacy", DEFAULT_RESOURCE["legacy"])),
                                "fencing": bool(spec.get("fencing", DEFAULT_RESOURCE["fencing"]))}
    faults: list[dict[str, Any]] = []
    for f in raw.get("faults") or []:
        if not isinstance(f, dict):
            raise BadRequest("fault: expected an object")
        action = f.get("action")
        _parse_action(action)
        faults.append({"key": f.get("key"), "instance": f.get("instance"), "step": f.get("step"),
                       "action": action, "times": int(f.get("times", 1))})
    return {"resources": resources, "faults": faults,
            "ignore_intent": bool(raw.get("ignore_intent", False))}


def _parse_action(action: Any) -> tuple[str, int]:
    """Parse a fault action: ``drop``, ``status:503`` or ``latency:MS`` → (kind, number)."""
    if action == "drop":
        return "drop", 0
    if isinstance(action, str) and ":" in action:
        kind, _, arg = action.partition(":")
        if kind in ("status", "latency"):
            try:
                n = int(arg)
            except ValueError:
                raise BadRequest(f"bad fault action {action!r}") from None
            if (kind == "status" and 100 <= n <= 599) or (kind == "latency" and n >= 0):
                return kind, n
    raise BadRequest(f"bad fault action {action!r}")


class Ledger:
    """The server's durable state. One connection, one lock; every method is one transaction."""

    def __init__(self, path: str) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(_SCHEMA)
        # A key still in flight was left by a killed process: its effect was never applied (apply
        # and marking done are one transaction), so forget it and let a retry be a fresh attempt.
        self.db.execute("DELETE FROM keys WHERE state = 'in_flight'")
        self._configs: dict[str, dict[str, Any]] = {}
        self._seqs: dict[str, int] = {}

    # -- helpers (lock held) --

    def _config(self, run: str) -> dict[str, Any]:
        cfg = self._configs.get(run)
        if cfg is None:
            row = self.db.execute("SELECT config FROM config WHERE run = ?", (run,)).fetchone()
            cfg = json.loads(row[0]) if row else _normalize_config({})
            self._configs[run] = cfg
        return cfg

    def _next_seq(self, run: str) -> int:
        seq = self._seqs.get(run)
        if seq is None:
            seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM ledger WHERE run = ?",
                                  (run,)).fetchone()[0]
        seq += 1
        self._seqs[run] = seq
        return seq

    def _write_row(self, run: str, row: dict[str, Any], status: int, outcome: str,
                   applied: bool, seq: int | None = None) -> None:
        if seq is None:
            seq = self._next_seq(run)
        self.db.execute(
            "INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run, seq, time.monotonic_ns(), row["resource"], row["key"], row["scope"],
             row["fence"], row["intent_hash"], json.dumps(row["params"]), json.dumps(row["meta"]),
             status, outcome, int(applied)))

    def _begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self.db.execute("COMMIT")

    def _rollback(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self._seqs.clear()  # counters may have run ahead of what was committed
        self._configs.clear()

    def _take_fault(self, run: str, cfg: dict[str, Any], key: str | None,
                    meta: Mapping[str, Any]) -> tuple[str, int] | None:
        for f in cfg["faults"]:
            if f["times"] <= 0:
                continue
            if f["key"] is not None:
                if f["key"] != key:
                    continue
            elif ((f["instance"] is not None and f["instance"] != meta.get("instance"))
                  or (f["step"] is not None and f["step"] != meta.get("step"))):
                continue
            f["times"] -= 1
            self.db.execute("UPDATE config SET config = ? WHERE run = ?", (json.dumps(cfg), run))
            return _parse_action(f["action"])
        return None

    # -- requests --

    def configure(self, run: str, raw: Any) -> None:
        cfg = _normalize_config(raw)
        with self.lock:
            try:
                self._begin()
                self.db.execute("INSERT OR REPLACE INTO config VALUES (?, ?)",
                                (run, json.dumps(cfg)))
                self._commit()
            except BaseException:
                self._rollback()
                raise
            self._configs[run] = cfg

    def raise_fence(self, run: str, scope: str, fence: int) -> None:
        """A recovering lease holder shows its fence without calling, so that an older holder's late
        call is refused even when the new holder settles the step without a call of its own."""
        with self.lock:
            self._begin()
            try:
                self.db.execute("INSERT INTO fences VALUES (?, ?, ?) ON CONFLICT (run, scope) DO UPDATE "
                                "SET highest = MAX(highest, excluded.highest)", (run, scope, fence))
            except BaseException:
                self._rollback()
                raise
            self._commit()

    def receipt(self, run: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT intent_hash, status, response FROM keys WHERE run = ? AND key = ? "
                "AND state = 'done'", (run, key)).fetchone()
        if row is None:
            return None
        return {"key": key, "intent_hash": row[0], "status": row[1], "response": json.loads(row[2])}

    def rows(self, run: str) -> list[dict[str, Any]]:
        with self.lock:
            found = self.db.execute(
                "SELECT t, seq, resource, key, scope, fence, intent_hash, params, meta, status, "
                "outcome, applied FROM ledger WHERE run = ? ORDER BY seq", (run,)).fetchall()
        return [{"t": t, "seq": seq, "resource": res, "key": key, "scope": scope, "fence": fence,
                 "intent_hash": ih, "params": json.loads(params), "meta": json.loads(meta),
                 "status": status, "outcome": outcome, "applied": bool(applied)}
                for (t, seq, res, key, scope, fence, ih, params, meta, status, outcome, applied)
                in found]

    def bad_request(self, run: str, resource: str, key: str | None, fence: int | None,
                    params: Any, meta: Any, why: str) -> Reply:
        row = {"resource": resource, "key": key, "scope": None, "fence": fence,
               "intent_hash": None, "params": params, "meta": meta}
        with self.lock:
            try:
                self._begin()
                self._write_row(run, row, 400, vocab.ERROR, False)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        return Reply(400, {"error": "bad_request", "detail": why})

    def post(self, run: str, resource: str, key_header: str | None, fence: int | None,
             scope_header: str | None, params: dict[str, Any], meta: dict[str, Any]) -> Reply:
        ih = intent_hash(params)
        delay_ms: int | None = None
        with self.lock:
            try:
                self._begin()
                reply, delay_ms, row, drop = self._decide(run, resource, key_header, fence,
                                                          scope_header, params, meta, ih)
                if reply is None and delay_ms is None:
                    reply = self._apply(run, row, drop)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        if reply is not None:
            return reply
        assert delay_ms is not None  # Invariant: no reply yet means the key is in flight
        time.sleep(delay_ms / 1000.0)  # the key is in flight; the lock is not held
        with self.lock:
            try:
                self._begin()
                reply = self._apply(run, row, drop)
                self._commit()
            except BaseException:
                self._rollback()
                if row["key"] is not None:  # do not leave the key wedged in flight
                    self.db.execute("DELETE FROM keys WHERE run = ? AND key = ? "
                                    "AND state = 'in_flight'", (run, row["key"]))
                raise
        return reply

    def _decide(self, run: str, resource: str, key_header: str | None, fence: int | None,
                scope_header: str | None, params: dict[str, Any], meta: dict[str, Any], ih: str
                ) -> tuple[Reply | None, int | None, dict[str, Any], bool]:
        cfg = self._config(run)
        spec = cfg["resources"].get(resource, DEFAULT_RESOURCE)
        key = None if spec["legacy"] else key_header
        if scope_header:
            scope = scope_header
        elif key is not None:
            scope = key
        elif meta.get("instance") is not None or meta.get("step") is not None:
            scope = f"{meta.get('instance')}:{meta.get('step')}"
        else:
            scope = resource
        row = {"resource": resource, "key": key, "scope": scope, "fence": fence,
               "intent_hash": ih, "params": params, "meta": meta}

        def finish(status: int, body: dict[str, Any], outcome: str,
                   headers: tuple[tuple[str, str], ...] = ()) -> tuple[Reply, None, dict, bool]:
            self._write_row(run, row, status, outcome, False)
            return Reply(status, body, headers), None, row, False

        # 1. fencing
        if spec["fencing"] and fence is not None:
            got = self.db.execute("SELECT highest FROM fences WHERE run = ? AND scope = ?",
                                  (run, scope)).fetchone()
            if got is not None and fence < got[0]:
                return finish(409, {"error": "stale_fence", "highest": got[0]}, vocab.STALE_FENCE)
            if got is None or fence > got[0]:
                self.db.execute("INSERT OR REPLACE INTO fences VALUES (?, ?, ?)",
                                (run, scope, fence))
        # 2. a keyed resource needs a key
        if not spec["legacy"] and key is None:
            return finish(400, {"error": "missing_key"}, vocab.MISSING_KEY)
        # 3-5. a known key
        if key is not None:
            known = self.db.execute(
                "SELECT resource, intent_hash, state, status, response FROM keys "
                "WHERE run = ? AND key = ?", (run, key)).fetchone()
            if known is not None:
                k_resource, k_hash, k_state, k_status, k_response = known
                if k_state == "in_flight":
                    return finish(409, {"error": "in_flight"}, vocab.IN_FLIGHT)
                if (k_resource == resource and k_hash == ih) or cfg["ignore_intent"]:
                    body = json.loads(k_response)
                    body["replay"] = True
                    return finish(k_status, body, vocab.REPLAY, (("Idempotent-Replayed", "true"),))
                return finish(422, {"error": "intent_conflict"}, vocab.CONFLICT)
        # 6. apply, unless a fault says otherwise
        drop = False
        fault = self._take_fault(run, cfg, key, meta)
        if fault is not None:
            kind, arg = fault
            if kind == "status":
                return finish(arg, {"error": "injected", "status": arg}, vocab.ERROR)
            if kind == "drop":
                drop = True
            elif kind == "latency":
                if key is not None:
                    self.db.execute("INSERT INTO keys VALUES (?, ?, ?, ?, 'in_flight', NULL, NULL)",
                                    (run, key, resource, ih))
                return None, arg, row, drop
        return None, None, row, drop

    def _apply(self, run: str, row: dict[str, Any], drop: bool) -> Reply:
        seq = self._next_seq(run)
        key, ih = row["key"], row["intent_hash"]
        if row["params"].get("card") == "declined":
            status, applied, outcome = 402, False, vocab.DECLINED
            body: dict[str, Any] = {"status": "declined", "key": key, "intent_hash": ih,
                                    "replay": False}
        else:
            status, applied, outcome = 200, True, vocab.APPLIED
            body = {"status": "applied", "effect_id": f"eff-{seq}", "key": key,
                    "intent_hash": ih, "replay": False}
        if key is not None:
            self.db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, 'done', ?, ?)",
                            (run, key, row["resource"], ih, status, json.dumps(body)))
        self._write_row(run, row, status, vocab.DROPPED if drop else outcome, applied, seq=seq)
        return Reply(status, body, drop=drop)
