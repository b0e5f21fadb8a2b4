"""The purgatory's Redis: the one place a service connects to it, waits for it at start-up, and
learns whether a redis-server is ready; and what counts as its outage.

Redis holds the purgatory's timers and the low-watermark wake-up events, nothing else
(docs/design/metadata.md): losing or emptying it costs at most the timers of DeleteRecords in
flight. A service that needs it at start-up waits instead of exiting: in Kubernetes every pod of a
release starts at once, and a service that exits because Redis' pod is not ready yet only adds
CrashLoopBackOff delays (Kafka's brokers wait for their metadata quorum the same way).

Thread-safety: a ``redis.Redis`` client is (it pools connections); the functions hold no state.
"""

from __future__ import annotations

import logging
import time

import redis as redis_lib

log = logging.getLogger(__name__)

RedisClient = redis_lib.Redis
# What an unreachable or failing Redis raises: a caller maps it to Kafka's REQUEST_TIMED_OUT.
RedisError = redis_lib.RedisError
SOCKET_TIMEOUT_S = 5.0


def connect_redis(url: str, *, timeout_s: float = SOCKET_TIMEOUT_S) -> redis_lib.Redis:
    """A client of ``url`` (redis:// or rediss://) whose calls give up after ``timeout_s``. It
    connects lazily: nothing is dialled until the first command."""
    return redis_lib.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def wait_for_redis(redis: redis_lib.Redis, *, timeout_s: float, service: str) -> None:
    """Return once ``redis`` answers PING and has loaded its dataset (a restarted server answers
    PING while it loads its AOF, and -LOADING to reads); raise the last connection error after
    ``timeout_s``.

    Retries only connection errors and timeouts (a refused AUTH, say, fails at once). Logs one
    line when it starts waiting and one when Redis answers.
    """
    deadline = time.monotonic() + timeout_s
    delay, waited = 0.2, False
    while True:
        try:
            redis.ping()
            if redis_loading(redis):
                raise redis_lib.BusyLoadingError("Redis is loading the dataset in memory")
        except (redis_lib.ConnectionError, redis_lib.TimeoutError) as exc:
            if time.monotonic() + delay > deadline:
                raise
            if not waited:
                log.warning("waiting for Redis", extra={"fields": {"service": service, "error": str(exc),
                                                                   "timeout_s": timeout_s}})
                waited = True
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        else:
            if waited:
                log.info("Redis is up", extra={"fields": {"service": service}})
            return


def redis_loading(redis: redis_lib.Redis) -> bool:
    """Whether a reachable Redis is still loading its dataset (a restarted server answers PING
    meanwhile, and -LOADING to reads)."""
    return bool(redis.info("persistence").get("loading"))


def redis_ready(url: str, *, timeout_s: float = 1.0) -> bool:
    """Whether the redis-server at ``url`` answers and has loaded its dataset (a supervisor's
    health check)."""
    client = connect_redis(url, timeout_s=timeout_s)
    try:
        if not client.ping() or redis_loading(client):
            return False
        client.dbsize()  # a read: -LOADING (BusyLoadingError) if loading began after the INFO above
        return True
    except redis_lib.RedisError:
        return False
    finally:
        client.close()
