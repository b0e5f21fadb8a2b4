"""Start-up waits shared by the services.

A service that needs Redis at start-up (a replica registers itself, the orphan scanner reads the
shard registry) waits for it instead of exiting: in Kubernetes every pod of a release starts at
once, and a replica that exits because Redis' pod is not ready yet only adds CrashLoopBackOff
delays (Kafka brokers wait for their metadata quorum the same way).
"""

from __future__ import annotations

import logging
import time

import redis as redis_lib

log = logging.getLogger(__name__)


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
