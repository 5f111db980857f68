"""The brokers the task-queue targets run on: Redis and RabbitMQ, real ones, one namespace per run.

Addresses come from the environment, defaulting to a broker on this machine:

``KILLPOINT_REDIS_URL``  default ``redis://127.0.0.1:6379/0``
``KILLPOINT_AMQP_URL``   default ``amqp://guest:guest@127.0.0.1:5672//``

A broker that does not answer is bad input, said in one line that names the variable (exit 2),
never a matrix of unknown runs.

Each run lives in a namespace of its own, made from the run's ``namespace`` (unique per run):

* Redis: every key the run makes carries :func:`redis_prefix` (``kp:<namespace>:``, a library's key
  prefix option where it has one, its queue and job names where it has not), and :func:`purge_redis`
  deletes every key that names the namespace, plus the namespace's members of the few global sets a
  library keeps (RQ's ``rq:queues`` and ``rq:workers``).
* RabbitMQ: queues and exchanges named after the namespace (this broker's management API is not
  assumed), deleted by :func:`purge_amqp`.

Teardown purges (it is called after a failed or interrupted run too); a namespace that teardown
could not purge (the process ended first) is purged when the harness process ends (:func:`remember`).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable
from urllib.parse import urlsplit, urlunsplit

from killpoint.errors import InvalidTarget

REDIS_ENV = "KILLPOINT_REDIS_URL"
AMQP_ENV = "KILLPOINT_AMQP_URL"
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"
AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"
# Every key and queue name of a run starts with this (then the run's namespace): what a test scans.
PREFIX = "kp:"
CONNECT_TIMEOUT_S = 3.0

_clients: dict[tuple[int, str], Any] = {}  # (pid, url) -> a redis client of this process
_lock = threading.Lock()
_pending: dict[str, tuple[str, str | None, tuple[str, ...], tuple[str, ...]]] = {}  # namespace -> what to purge
_exit_hook: dict[int, bool] = {}  # pid -> its at-exit purge is registered


def redis_url() -> str:
    return os.environ.get(REDIS_ENV) or REDIS_DEFAULT


def amqp_url() -> str:
    return os.environ.get(AMQP_ENV) or AMQP_DEFAULT


def shown_url(url: str) -> str:
    """``url`` without its password, for a message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redis_prefix(namespace: str) -> str:
    return f"{PREFIX}{namespace}:"


def redis_client(url: str) -> Any:
    """One client (a connection pool) per process and URL: runs of a session share its connections,
    never their keys. A forked worker makes its own (a pool's sockets are not shared across fork)."""
    import redis

    key = (os.getpid(), url)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                                          socket_timeout=30, health_check_interval=0)
    return client


def require_redis(url: str | None = None) -> str:
    """The Redis URL to use, once it answered a PING; :class:`InvalidTarget` naming the variable if
    it does not."""
    url = url or redis_url()
    try:
        import redis
    except ImportError as exc:  # every queue extra brings it
        raise InvalidTarget(f"the Redis client is not installed ({exc}): pip install redis") from None
    try:
        redis_client(url).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise InvalidTarget(f"the Redis broker at {shown_url(url)} is not reachable ({exc}): start one, "
                            f"or set {REDIS_ENV} to its URL") from None
    return url


def require_amqp(url: str | None = None) -> str:
    """The AMQP URL to use, once a connection to it opened; :class:`InvalidTarget` naming the variable
    if it did not."""
    url = url or amqp_url()
    try:
        with _amqp(url) as conn:
            conn.connect()
    except Exception as exc:  # noqa: BLE001 - kombu raises the transport's own errors
        raise InvalidTarget(f"the RabbitMQ broker at {shown_url(url)} is not reachable ({exc}): start one, "
                            f"or set {AMQP_ENV} to its URL") from None
    return url


def _amqp(url: str) -> Any:
    from kombu import Connection

    return Connection(url, connect_timeout=CONNECT_TIMEOUT_S, transport_options={"max_retries": 0})


def redis_keys(url: str, namespace: str) -> list[bytes]:
    """Every key of this Redis database that names ``namespace``."""
    return list(redis_client(url).scan_iter(match=f"*{namespace}*", count=1000))


def purge_redis(url: str, namespace: str, global_sets: Iterable[str] = ()) -> int:
    """Delete every key naming ``namespace``, and its members of ``global_sets``: how many went."""
    client = redis_client(url)
    keys = redis_keys(url, namespace)
    gone = 0
    for n in range(0, len(keys), 500):
        gone += int(client.delete(*keys[n:n + 500]))
    for name in global_sets:
        members = [m for m in client.smembers(name) if namespace.encode() in m]
        if members:
            gone += int(client.srem(name, *members))
    return gone


def purge_amqp(url: str, queues: Iterable[str], exchanges: Iterable[str]) -> None:
    """Delete the run's queues and exchanges (each may already be gone)."""
    with _amqp(url) as conn:
        for name in queues:
            channel = conn.channel()
            try:
                channel.queue_delete(name)
            except Exception:  # noqa: BLE001 - a queue never declared: the channel is closed
                pass
            finally:
                _close(channel)
        for name in exchanges:
            channel = conn.channel()
            try:
                channel.exchange_delete(name)
            except Exception:  # noqa: BLE001
                pass
            finally:
                _close(channel)


def amqp_queue_depth(url: str, queue: str) -> int | None:
    """Messages ready in ``queue`` (not those a consumer holds unacknowledged); None if it is gone."""
    with _amqp(url) as conn:
        channel = conn.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).message_count)
        except Exception:  # noqa: BLE001
            return None
        finally:
            _close(channel)


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001
        pass


# -- purge at exit what teardown could not ---------------------------------------------------------


def remember(namespace: str, redis: str, amqp: str | None = None, queues: Iterable[str] = (),
             exchanges: Iterable[str] = ()) -> None:
    """Purge ``namespace`` when this process ends unless :func:`forget` came first."""
    with _lock:
        _pending[namespace] = (redis, amqp, tuple(queues), tuple(exchanges))
        if not _exit_hook.get(os.getpid()):
            from killpoint.harness.jobs import at_exit

            _exit_hook[os.getpid()] = True
            at_exit(_purge_pending, os.getpid())


def forget(namespace: str) -> None:
    with _lock:
        _pending.pop(namespace, None)


def purge(namespace: str, global_sets: Iterable[str] = (), *, redis: str | None = None) -> None:
    """Purge ``namespace`` now (on ``redis``, and where :func:`remember` said), then forget it."""
    with _lock:
        what = _pending.get(namespace)
    if what is None and redis is None:
        return
    remembered, amqp, queues, exchanges = what if what is not None else ("", None, (), ())
    purge_redis(redis or remembered, namespace, global_sets)
    if amqp is not None:
        purge_amqp(amqp, queues, exchanges)
    forget(namespace)


def _purge_pending(pid: int) -> None:
    if os.getpid() != pid:
        return  # a forked worker inherits the hook; only the harness process purges
    for namespace in list(_pending):
        try:
            purge(namespace, ("rq:queues", "rq:workers"))
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
