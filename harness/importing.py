"""Importing a user's module named on the command line (``--target``, ``--workload``): a name that
is no module name, or a module that fails as it imports, is the user's to fix (bad input, exit 2),
said in one line naming the module, never an infrastructure failure."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from killpoint.errors import shown

__all__ = ["import_user_module"]


def import_user_module(module_name: str) -> ModuleType:
    """The module ``module_name`` (dotted identifiers: ``pkg.module``), imported with the working
    directory on the path, as ``python -m`` and pytest's rootdir have it. Raises ``ValueError`` with
    one line naming the module: a name that is not a dotted module name (``../etc``, a path), one
    that does not import, or one that raised while importing (its exception named)."""
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise ValueError(f"{shown(module_name)} is not a module name (give dotted Python names, as "
                         f"pkg.module, not a path)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {shown(module_name)} ({' '.join(str(exc).split())[:300]})") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it ran: said, not raised
        what = f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")
        raise ValueError(f"importing {shown(module_name)} raised {what[:300]}") from None
