"""Where an exploration keeps the examples it found: one of Hypothesis's own example databases, named
by one string, so a counterexample found in one place replays in another that names the same one.

* ``none``: nothing is kept and nothing is written (Hypothesis's own caches go to a temporary folder,
  removed when the search ends).
* ``redis://HOST:PORT[/DB][?key_prefix=PREFIX]`` (also ``rediss://``): Hypothesis's
  ``RedisExampleDatabase`` on that server (the ``redis`` package, ``killpoint[redis]``). Every process
  that names the same server and prefix shares the examples: a CI job saves its counterexample there
  and a laptop's search replays it first. ``key_prefix`` (default ``killpoint:``) keeps one project's
  examples apart from another's on a shared server; every other query parameter goes to redis-py.
* anything else: a folder, laid out as pytest's ``.hypothesis/`` (examples under ``examples/``,
  Hypothesis's caches beside them). A CI job can upload it as an artifact, and a machine that
  downloads it and names it replays what the job found.

Each search reads its examples under a key of its search space (target, workload, workers, schedule
shape: :func:`killpoint.harness.explore.database_key`), so only a search of the same space replays
them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator

from killpoint.errors import BadInput, InfrastructureError, shown

__all__ = ["DEFAULT_DATABASE", "DEFAULT_PREFIX", "NONE", "DatabaseSpec", "opened", "parse_database"]

DEFAULT_DATABASE = os.path.join(".killpoint", "hypothesis")
NONE = "none"
DEFAULT_PREFIX = "killpoint:"
_REDIS = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class DatabaseSpec:
    """A parsed ``--database``: what kind, where, and (Redis) the prefix of every key it writes."""

    kind: str  # "none" | "folder" | "redis"
    location: str = ""  # the folder, or the Redis URL less its key_prefix parameter
    key_prefix: str = DEFAULT_PREFIX

    @property
    def keeps(self) -> bool:
        return self.kind != NONE


def parse_database(text: str | None, *, flag: str = "--database") -> DatabaseSpec:
    """The database ``text`` names (None: the default folder); :class:`BadInput` naming the value
    when it names none."""
    if text is None:
        return DatabaseSpec("folder", DEFAULT_DATABASE)
    if not text.strip():
        raise BadInput(f"{flag} {shown(text)}: name a folder, a redis:// URL, or 'none' to keep no "
                       f"examples, or leave it out for {DEFAULT_DATABASE}")
    if text.strip().lower() == NONE:
        return DatabaseSpec(NONE)
    if text.lower().startswith(_REDIS):
        url = urllib.parse.urlsplit(text)
        query = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        prefixes = [v for k, v in query if k == "key_prefix"]
        if len(prefixes) > 1 or (prefixes and not prefixes[0]):
            raise BadInput(f"{flag} {shown(text)}: give key_prefix once, not empty (e.g. ?key_prefix=myapp:)")
        if url.scheme.lower() != "unix" and not url.hostname:
            raise BadInput(f"{flag} {shown(text)}: a redis:// URL names its server, as in redis://127.0.0.1:6379/0")
        rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "key_prefix"])
        return DatabaseSpec("redis", urllib.parse.urlunsplit(url._replace(query=rest)),
                            prefixes[0] if prefixes else DEFAULT_PREFIX)
    if "://" in text:
        raise BadInput(f"{flag} {shown(text)}: a database is a folder, a redis:// URL or 'none'")
    return DatabaseSpec("folder", text)


def _redis(spec: DatabaseSpec, flag: str) -> Any:
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise BadInput(f"{flag} {shown(spec.location)}: the redis package is not installed; "
                       f"pip install 'killpoint[redis]'") from None
    try:
        client = redis.Redis.from_url(spec.location)
    except ValueError as exc:  # a URL redis-py cannot read
        raise BadInput(f"{flag} {shown(spec.location)}: {exc}") from None
    try:
        client.ping()
    except redis.exceptions.AuthenticationError as exc:  # it answered, and refused us: bad input
        raise BadInput(f"{flag} {shown(spec.location)}: the server refused the login ({exc})") from None
    except redis.exceptions.RedisError as exc:  # it did not answer: the infrastructure's failure
        raise InfrastructureError(f"the example database {spec.location} did not answer: {exc}") from None
    return RedisExampleDatabase(client, key_prefix=spec.key_prefix.encode())


@contextlib.contextmanager
def opened(spec: DatabaseSpec, *, flag: str = "--database") -> Iterator[tuple[Any, str]]:
    """``(examples, home)``: the example database to give Hypothesis (None for ``none``) and the
    folder for Hypothesis's own files (its caches). For ``none`` and Redis that folder is a
    temporary one, removed on leaving: nothing is left in the working directory."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if spec.kind == "folder":
        yield DirectoryBasedExampleDatabase(os.path.join(spec.location, "examples")), spec.location
        return
    examples = _redis(spec, flag) if spec.kind == "redis" else None
    home = tempfile.mkdtemp(prefix="killpoint-hypothesis-")
    try:
        yield examples, home
    finally:
        shutil.rmtree(home, ignore_errors=True)
        client = getattr(examples, "redis", None)
        if client is not None:
            client.close()
