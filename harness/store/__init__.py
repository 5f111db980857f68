"""Durable stores: SQLite (embedded default, one file per run) and PostgreSQL (a schema per run)."""

from __future__ import annotations

import os

from harness.store.base import Claim, Store, StoreError
from harness.store.sqlite import SQLiteStore


class InvalidStore(ValueError):
    """The --store value names no backend we have."""


def open_store(spec: str, run_dir: str, run_id: str) -> Store:
    """``sqlite`` (a file in the run's folder) or a ``postgresql://`` URL."""
    if spec in ("sqlite", "", None):
        return SQLiteStore(os.path.join(run_dir, f"{run_id}.sqlite"))
    if spec.startswith(("postgresql://", "postgres://")):
        raise InvalidStore(f"--store {spec!r}: the PostgreSQL backend is not built yet; use sqlite")
    raise InvalidStore(f"--store {spec!r}: expected 'sqlite' or a postgresql:// URL")


def check_store(spec: str) -> None:
    """Refuse a --store value we cannot use, with one line naming it (before any run starts)."""
    if spec in ("sqlite", "", None):
        return
    if spec.startswith(("postgresql://", "postgres://")):
        raise InvalidStore(f"--store {spec!r}: the PostgreSQL backend is not built yet; use sqlite")
    raise InvalidStore(f"--store {spec!r}: expected 'sqlite' or a postgresql:// URL")


__all__ = ["check_store", "Claim", "InvalidStore", "SQLiteStore", "Store", "StoreError", "open_store"]
