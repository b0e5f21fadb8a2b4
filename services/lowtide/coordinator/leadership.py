"""Who leads a diskless coordinator shard, and where shards are: records of the ``shards`` section
of the cluster metadata (etcd, through ``lowtide.metadata.sections``; docs/design/metadata.md).

Records (``Section(store, "shards")``, under the store's root: ``/lowtide/shards/...``)::

    {K}/leader              owner id of shard K's leader process, attached to an etcd lease of the
                            shard's ``lease_ms`` (whole seconds, at least 2) that the holder keeps
                            alive every lease/3 (``ShardLease``); put only if absent, deleted by its
                            holder (compare on the value, then the lease revoked) or by etcd when the
                            lease is not kept alive
    {K}/epoch               {"epoch": N, "owner": owner id, "at_ms": epoch ms}: shard K's coordinator
                            epoch, raised by each new leadership in one transaction that compares the
                            leader record holds the caller and the epoch record is unchanged since
                            read (``take_epoch``); kept until deleted
    {K}/address             {"grpc": "host:port", "metrics": "http://.../metrics", "owner": owner id,
                            "since_ms": epoch ms, "framed": "host:port" when the shard has a framed
                            listener}: the address of shard K's last leader, written by each new
                            leader (``register_shard``); kept until deleted
    {K}/standbys/{owner}    {"grpc": "host:port", "since_ms": epoch ms}: a warm standby of shard K
                            (FindBatches from its copy), attached to its process's own lease
                            (``StandbyRegistration``): a killed process's standbys vanish with it

Nothing here is in Redis: an emptied Redis changes neither who leads a shard nor where it is. With
etcd away, a leader cannot renew its lease and stops acting ``margin`` before it could have expired;
readers of the registry keep routing from their metadata image.

One active coordinator per shard: a process acts as leader only while it holds the lease, and stops
appending ``margin`` before the lease it last renewed would expire (so a paused process whose lease
ran out does not append after a successor started). Readers of the registry (front door, replicas,
orphan scanner) call whichever address is registered and get NOT_COORDINATOR from a process that
lost the lease, after which they read the registry again.

The lease alone is a time assumption (a paused process acts on a lease it no longer holds until it
looks at its clock). What fences without one is the coordinator epoch: each leadership takes the
next epoch here, opens it in the metadata log (an EpochStarted record) before answering anything,
and the replicas refuse the lower epoch of a deposed leader's batches (docs/design/diskless.md
#fencing-by-epoch). The epoch record never decides alone: an epoch is always above the highest the
caller found in the log (``floor``), so a store restored from an old backup cannot make epochs go
back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from lowtide.clock import now_ms
from lowtide.common.ticker import Ticker
from lowtide.errors import RequestTimedOut
from lowtide.metadata.sections import Entry, Section
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)

SECTION = "shards"
# How long a killed process's standbys stay listed (its registration lease; renewed every third).
STANDBY_TTL_MS = 10_000
# Compare-and-set rounds of take_epoch before it gives up (another writer raced it each time).
_EPOCH_ATTEMPTS = 20


def shards_section(metadata: MetadataStore | Section) -> Section:
    """The ``shards`` section of ``metadata`` (a store, or the section itself)."""
    return metadata if isinstance(metadata, Section) else Section(metadata, SECTION)


def leader_key(shard: int) -> str:
    return f"{shard}/leader"


def epoch_key(shard: int) -> str:
    return f"{shard}/epoch"


def address_key(shard: int) -> str:
    return f"{shard}/address"


def standbys_key(shard: int) -> str:
    """The prefix of shard ``shard``'s standby records (one per owner id below it)."""
    return f"{shard}/standbys/"


def read_epoch(metadata: MetadataStore | Section, shard: int) -> int:
    """Shard ``shard``'s last coordinator epoch taken (0: none yet), as the image says."""
    entry = shards_section(metadata).get(epoch_key(shard))
    return int(json.loads(entry.value)["epoch"]) if entry is not None else 0


def take_epoch(metadata: MetadataStore | Section, *, shard: int, owner: str, floor: int,
               check_lease: bool = True) -> int:
    """The next coordinator epoch of ``shard`` (> ``floor`` and > the last one taken), taken in one
    transaction with a check that ``owner`` holds the shard's lease (``check_lease``; without it, a
    Kubernetes Lease, only the epoch record is compared): -1 if it does not, so a process that lost
    the lease cannot start a leadership newer than its successor's. A race lost to another writer
    of the epoch is run again on what it wrote. Thread-safety: any thread."""
    section = shards_section(metadata)
    holder = owner.encode()
    for _ in range(_EPOCH_ATTEMPTS):
        entry = section.get(epoch_key(shard))
        current = int(json.loads(entry.value)["epoch"]) if entry is not None else 0
        epoch = max(current, floor) + 1
        expect: dict[str, Entry | bytes | None] = {epoch_key(shard): entry}
        if check_lease:
            expect[leader_key(shard)] = holder
        doc = json.dumps({"epoch": epoch, "owner": owner, "at_ms": now_ms()}, sort_keys=True).encode()
        if section.change({epoch_key(shard): doc}, expect=expect):
            return epoch
        if check_lease:  # the failed change caught the image up with etcd
            leader = section.get(leader_key(shard), fresh=True)
            if leader is None or leader.value != holder:
                return -1
    raise RequestTimedOut(f"coordinator shard {shard}: its epoch changed under too many concurrent writers")


@dataclass(frozen=True, slots=True)
class ShardAddress:
    shard: int
    grpc: str
    metrics: str
    owner: str = ""
    since_ms: int = 0
    framed: str = ""  # the shard's framed listener (CommitFile as CALL frames); "": none, gRPC only


class ShardLease:
    """The leader lease of one shard for one process (``owner``): the record ``{K}/leader`` holding
    ``owner`` under an etcd lease of ``lease_ms`` (module doc).

    Contract: ``acquire_or_renew`` returns whether this process holds the lease now, and records the
    monotonic time until which it may act as leader (``valid``): ``lease_ms - margin_ms`` from
    before the call, since etcd may have started (or refreshed) the lease as early as that; etcd
    keeps it at least ``lease_ms`` from then (whole seconds, at least 2: never shorter).
    Thread-safety: the lease thread calls ``acquire_or_renew``/``release``; any thread may call
    ``valid`` (a float read) and ``holder``.
    """

    def __init__(self, *, metadata: MetadataStore | Section, shard: int, owner: str, lease_ms: int,
                 margin_ms: int) -> None:
        if margin_ms >= lease_ms:
            raise ValueError(f"lease margin {margin_ms} ms must be below the lease {lease_ms} ms")
        self.section = shards_section(metadata)
        self.shard = shard
        self.key = leader_key(shard)
        self.owner = owner
        self.lease_ms = lease_ms
        self.margin_ms = margin_ms
        # A call that outlasts the lease is of no use to it: the next renewal asks again.
        self._timeout_s = min(5.0, max(1.0, lease_ms / 1000))
        self.lease_id = 0  # the etcd lease the record is (or would be) put under; 0: none yet
        self._valid_until = 0.0

    def acquire_or_renew(self) -> bool:
        started = time.monotonic()
        held = self._acquire_or_renew()
        # Measured from before the call: the lease may have started as early as that.
        self._valid_until = started + (self.lease_ms - self.margin_ms) / 1000 if held else 0.0
        return held

    def _acquire_or_renew(self) -> bool:
        # Refreshed (or granted) after ``started``: whatever record is under it lives lease_ms from then.
        if not (self.lease_id and self.section.keep_alive(self.lease_id, timeout_s=self._timeout_s)):
            # Expired (etcd deleted the record with it) or never granted.
            self.lease_id = self.section.grant_lease(self.lease_ms, timeout_s=self._timeout_s)
        entry = self.section.get(self.key)
        if entry is not None:  # held (by us, or another: a contender asks again in a moment)
            return self._holds(entry)
        if self.section.put(self.key, self.owner.encode(), expect=None, lease=self.lease_id):
            return True
        return self._holds(self.section.get(self.key))  # the failed put caught the image up

    def _holds(self, entry: Entry | None) -> bool:
        return entry is not None and entry.value == self.owner.encode() and entry.lease == self.lease_id

    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def holder(self) -> str | None:
        """The owner id holding the lease now (None: free), as this process's metadata image says."""
        entry = self.section.get(self.key)
        return entry.value.decode() if entry is not None else None

    def release(self) -> None:
        """Give the lease up at once if held: the record is deleted if it still holds this owner,
        and the etcd lease revoked (a store away: it expires on its own)."""
        self._valid_until = 0.0
        lease, self.lease_id = self.lease_id, 0
        if not lease:
            return
        try:
            self.section.delete([self.key], expect={self.key: self.owner.encode()})
        finally:
            self.section.revoke_lease(lease)


def register_shard(metadata: MetadataStore | Section, address: ShardAddress, *, check_lease: bool = False) -> bool:
    """Record ``address`` as shard ``address.shard``'s leader's. With ``check_lease`` only while
    ``address.owner`` holds the shard's lease (False otherwise: a deposed leader never points the
    registry back at itself)."""
    doc = {"grpc": address.grpc, "metrics": address.metrics, "owner": address.owner,
           "since_ms": address.since_ms or now_ms()}
    if address.framed:
        doc["framed"] = address.framed
    expect = {leader_key(address.shard): address.owner.encode()} if check_lease else {}
    return shards_section(metadata).change({address_key(address.shard): json.dumps(doc, sort_keys=True).encode()},
                                           expect=expect)


def read_shards(metadata: MetadataStore | Section) -> dict[int, ShardAddress]:
    """Every registered shard's last leader address, from the metadata image (no round trip)."""
    out = {}
    for name, entry in shards_section(metadata).items().items():
        shard, _, what = name.partition("/")
        if what != "address" or not shard.isdigit():
            continue
        doc = json.loads(entry.value)
        out[int(shard)] = ShardAddress(shard=int(shard), grpc=doc["grpc"], metrics=doc.get("metrics", ""),
                                       owner=doc.get("owner", ""), since_ms=int(doc.get("since_ms", 0)),
                                       framed=doc.get("framed", ""))
    return dict(sorted(out.items()))


def register_standby(metadata: MetadataStore | Section, *, shard: int, owner: str, grpc: str, lease: int) -> None:
    """List ``owner`` as a warm standby of ``shard`` at ``grpc``, under etcd lease ``lease`` (the
    record vanishes when the lease does)."""
    doc = json.dumps({"grpc": grpc, "since_ms": now_ms()}, sort_keys=True).encode()
    shards_section(metadata).put(standbys_key(shard) + owner, doc, lease=lease)


def unregister_standby(metadata: MetadataStore | Section, *, shard: int, owner: str) -> None:
    shards_section(metadata).delete([standbys_key(shard) + owner])


def read_standbys(metadata: MetadataStore | Section, shard: int) -> dict[str, str]:
    """Owner id -> gRPC address of every registered standby of ``shard`` (a killed process's stay
    listed until its registration lease runs out: callers treat an unreachable one as absent)."""
    prefix = standbys_key(shard)
    return {name[len(prefix):]: json.loads(entry.value)["grpc"]
            for name, entry in sorted(shards_section(metadata).items(prefix).items())}


class StandbyRegistration:
    """This process's warm standbys in the registry (``{K}/standbys/{owner}``), under one etcd lease
    of its own (``ttl_ms``) that a thread keeps alive every third of it, so a killed process's
    standbys vanish within ``ttl_ms``. A lease lost meanwhile (etcd away longer than that) is
    granted anew and every standby written again.

    Contract: ``add`` lists a standby (at once when the store answers, else from the thread);
    ``start`` starts the thread; ``stop`` ends it and removes the records (revokes the lease).
    Thread-safety: ``add``/``start``/``stop`` from one thread (the server's); the keep-alive runs
    on its own.
    """

    def __init__(self, metadata: MetadataStore | Section, *, owner: str, ttl_ms: int = STANDBY_TTL_MS) -> None:
        self.section = shards_section(metadata)
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.lease_id = 0
        self._standbys: dict[int, str] = {}
        self._written: set[int] = set()
        self._lock = threading.Lock()
        self._ticker = Ticker(name="coordinator-standby-registration", interval_s=ttl_ms / 3 / 1000,
                              tick=self._refresh_quietly)

    def add(self, *, shard: int, grpc: str) -> None:
        with self._lock:
            self._standbys[shard] = grpc
        self._refresh_quietly()

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()
        with self._lock:
            lease, self.lease_id = self.lease_id, 0
            shards, self._written = sorted(self._written), set()
        if lease:
            self.section.delete([standbys_key(k) + self.owner for k in shards])
            self.section.revoke_lease(lease)

    def _refresh_quietly(self) -> None:
        try:
            self._refresh()
        except Exception as exc:  # noqa: BLE001 - the store away: the next round tries again
            log.warning("could not register the standby shards", extra={"fields": {"error": str(exc)}})

    def _refresh(self) -> None:
        with self._lock:
            if self._ticker.stopped:
                return
            if not (self.lease_id and self.section.keep_alive(self.lease_id)):
                self.lease_id = self.section.grant_lease(self.ttl_ms)
                self._written = set()
            for shard, grpc in sorted(self._standbys.items()):
                if shard not in self._written:
                    register_standby(self.section, shard=shard, owner=self.owner, grpc=grpc, lease=self.lease_id)
                    self._written.add(shard)
