"""Who leads a diskless coordinator shard, and where shards are: two small Redis structures.

Keys::

    lowtide:coordinator:{K}:leader   STRING owner id of shard K's leader process, PX lease
                                     (renewed every lease/3 by the holder; compare-and-renew and
                                     compare-and-delete in Lua, so only the holder extends or frees it)
    lowtide:coordinators             HASH   shard K -> {"grpc": "host:port", "metrics": "http://.../metrics",
                                     "owner": owner id, "since_ms": epoch ms}, written by each new leader
    lowtide:coordinator:{K}:epoch    STRING shard K's coordinator epoch: INCR by each new leadership,
                                     in Lua only while the caller holds the lease (``take_epoch``)
    lowtide:coordinator:{K}:standbys HASH   owner id -> {"grpc": "host:port", "since_ms": epoch ms}: the
                                     warm standbys of shard K (FindBatches from their copy)

One active coordinator per shard: a process acts as leader only while it holds the lease, and stops
appending ``margin`` before the lease it last renewed would expire (so a paused process whose lease
ran out does not append after a successor started). Readers of the registry (front door, replicas,
orphan scanner) call whichever address is registered and get NOT_COORDINATOR from a process that
lost the lease, after which they read the registry again.

The lease alone is a time assumption (a paused process acts on a lease it no longer holds until it
looks at its clock). What fences without one is the coordinator epoch: each leadership takes the
next epoch here, opens it in the metadata log (an EpochStarted record) before answering anything,
and the replicas refuse the lower epoch of a deposed leader's batches (docs/design/diskless.md
#fencing-by-epoch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis as redis_lib

from lowtide.clock import now_ms

REGISTRY = "lowtide:coordinators"

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# KEYS[1] the lease, KEYS[2] the epoch; ARGV[1] the owner ("" = no Redis lease to check: a
# Kubernetes Lease), ARGV[2] the floor: the highest epoch the caller found in the log. Above the
# floor even if Redis lost the key (a restart without persistence): epochs never go back.
_TAKE_EPOCH = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[2])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
return epoch
"""


def leader_key(shard: int) -> str:
    return f"lowtide:coordinator:{shard}:leader"


def epoch_key(shard: int) -> str:
    return f"lowtide:coordinator:{shard}:epoch"


def standbys_key(shard: int) -> str:
    return f"lowtide:coordinator:{shard}:standbys"


def take_epoch(redis: redis_lib.Redis, *, shard: int, owner: str, floor: int, check_lease: bool = True) -> int:
    """The next coordinator epoch of ``shard`` (> ``floor``), taken atomically with a check that
    ``owner`` holds the Redis lease (``check_lease``): -1 if it does not, so a process that lost
    the lease cannot start a leadership newer than its successor's. Thread-safety: any thread."""
    return int(redis.eval(_TAKE_EPOCH, 2, leader_key(shard), epoch_key(shard),
                          owner if check_lease else "", floor))


@dataclass(frozen=True, slots=True)
class ShardAddress:
    shard: int
    grpc: str
    metrics: str
    owner: str = ""
    since_ms: int = 0
    framed: str = ""  # the shard's framed listener (CommitFile as CALL frames); "": none, gRPC only


class ShardLease:
    """The leader lease of one shard for one process (``owner``).

    Contract: ``acquire_or_renew`` returns whether this process holds the lease now, and records the
    monotonic time until which it may act as leader (``valid``). Thread-safety: the lease thread
    calls ``acquire_or_renew``/``release``; any thread may call ``valid`` (a float read).
    """

    def __init__(self, *, redis: redis_lib.Redis, shard: int, owner: str, lease_ms: int, margin_ms: int) -> None:
        if margin_ms >= lease_ms:
            raise ValueError(f"lease margin {margin_ms} ms must be below the lease {lease_ms} ms")
        self.redis = redis
        self.key = leader_key(shard)
        self.owner = owner
        self.lease_ms = lease_ms
        self.margin_ms = margin_ms
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._valid_until = 0.0

    def acquire_or_renew(self) -> bool:
        started = time.monotonic()
        held = bool(self.redis.set(self.key, self.owner, nx=True, px=self.lease_ms)) or \
            bool(self._renew(keys=[self.key], args=[self.owner, self.lease_ms]))
        # Measured from before the call: the lease may have started as early as that.
        self._valid_until = started + (self.lease_ms - self.margin_ms) / 1000 if held else 0.0
        return held

    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def holder(self) -> str | None:
        """The owner id holding the lease now (None: free), as Redis says."""
        raw = self.redis.get(self.key)
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    def release(self) -> None:
        self._valid_until = 0.0
        self._release(keys=[self.key], args=[self.owner])


def register_shard(redis: redis_lib.Redis, address: ShardAddress) -> None:
    doc = {"grpc": address.grpc, "metrics": address.metrics, "owner": address.owner,
           "since_ms": address.since_ms or now_ms()}
    if address.framed:
        doc["framed"] = address.framed
    redis.hset(REGISTRY, str(address.shard), json.dumps(doc, sort_keys=True))


def register_standby(redis: redis_lib.Redis, *, shard: int, owner: str, grpc: str) -> None:
    redis.hset(standbys_key(shard), owner, json.dumps({"grpc": grpc, "since_ms": now_ms()}, sort_keys=True))


def unregister_standby(redis: redis_lib.Redis, *, shard: int, owner: str) -> None:
    redis.hdel(standbys_key(shard), owner)


def read_standbys(redis: redis_lib.Redis, shard: int) -> dict[str, str]:
    """Owner id -> gRPC address of every registered standby of ``shard`` (a killed one stays listed
    until it starts again: callers treat an unreachable one as absent)."""
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v)["grpc"]
            for k, v in redis.hgetall(standbys_key(shard)).items()}


def read_shards(redis: redis_lib.Redis) -> dict[int, ShardAddress]:
    """Every registered shard's last leader address."""
    raw: Mapping = redis.hgetall(REGISTRY)
    out = {}
    for key, value in raw.items():
        doc = json.loads(value)
        shard = int(key)
        out[shard] = ShardAddress(shard=shard, grpc=doc["grpc"], metrics=doc.get("metrics", ""),
                                  owner=doc.get("owner", ""), since_ms=int(doc.get("since_ms", 0)),
                                  framed=doc.get("framed", ""))
    return dict(sorted(out.items()))
