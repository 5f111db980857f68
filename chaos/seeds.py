"""Stable seed derivation: every random choice of a run flows from ``--seed`` through here.

Python's built-in ``hash()`` of a string is salted per process (``PYTHONHASHSEED``), so a seed
derived with it differs between two runs of the same command. A SHA-256 of the seed and a label
gives the same number on every machine and in every process.
"""

from __future__ import annotations

import hashlib
import random


def derive(seed: int, label: str) -> int:
    """A 64-bit seed for the random choices named ``label`` (a worker's incarnation, a rule)."""
    digest = hashlib.sha256(f"{seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rng(seed: int, label: str) -> random.Random:
    """A random generator for the choices named ``label``, the same for the same seed everywhere."""
    return random.Random(derive(seed, label))
