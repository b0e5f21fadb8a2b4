"""A replica server as the broker of diskless topics (KIP-1164): the one object its request path
calls for a diskless partition. Any replica serves any diskless partition; none hosts its data.

Wiring::

    Produce (diskless items)  -> DisklessProducer  -> WAL file -> object store; CommitFile -> shards
    Fetch   (diskless items)  -> DisklessFetcher   -> FindBatches -> ranged reads (RangeCache)
    ListOffsets, DeleteRecords -> DisklessOffsets  -> the partition's shard (as at the front door)
    a commit made here        -> RangeCache (its bytes) + CommitSignal (wakes parked fetches)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.diskless.fetch import CommitSignal, DisklessFetcher, DisklessFetchItem, RangeCache
from lowtide.diskless.offsets import DisklessOffsets
from lowtide.diskless.produce import DisklessAppend, DisklessConfig, DisklessProducer
from lowtide.diskless.topics import DisklessTopics, ShardDirectory
from lowtide.errors import LowtideError
from lowtide.messages.replica import DeleteRecordsResult, FetchedPartition, FetchPosition, PartitionOffset
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore
from lowtide.objectstore import open_object_store


class DisklessBroker:
    """Produce and fetch of diskless partitions for one replica server.

    Contract: ``topic(name)`` says whether a topic is diskless (its TopicInfo, else None);
    ``produce`` / ``fetch`` / ``list_offsets`` / ``delete_records`` take only diskless partitions
    and answer one result per item, in order (see DisklessProducer / DisklessFetcher /
    DisklessOffsets). Thread-safety: thread-safe; ``stop`` once.
    """

    def __init__(self, *, config: DisklessConfig, object_store_url: str, metadata: MetadataStore,
                 call_metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.config = config
        self.store = open_object_store(object_store_url)
        self.topics = DisklessTopics(store=metadata)
        self.topics.start()  # refreshed off the request path: every Produce asks it
        self.directory = ShardDirectory(store=metadata)
        self.coordinators = DisklessCoordinatorClient(lookup=self.directory.lookup, metadata=call_metadata,
                                                      framed_lookup=self.directory.lookup_framed)
        self.cache = RangeCache(max_bytes=config.cache_max_bytes)
        self.signal = CommitSignal()
        self.producer = DisklessProducer(config=config, store=self.store, coordinators=self.coordinators,
                                         on_committed=self._committed)
        self.fetcher = DisklessFetcher(store=self.store, coordinators=self.coordinators, cache=self.cache,
                                       signal=self.signal, poll_ms=config.fetch_poll_ms)
        self._offsets_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="diskless-offsets")
        self.offsets = DisklessOffsets(coordinators=self.coordinators, pool=self._offsets_pool)

    def _committed(self, object_key: str, batches: list[tuple[str, int, int, int, bytes]]) -> None:
        for _topic, _partition, position, _size, data in batches:
            self.cache.put(object_key, position, data)
        self.signal.notify()

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def produce(self, items: Sequence[tuple[TopicInfo, int, bytes]], *,
                timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        return self.producer.produce(items, timeout_ms=timeout_ms)

    def write_txn_markers(self, items: Sequence[tuple[TopicInfo, int]], *, producer_id: int, producer_epoch: int,
                          commit: bool, coordinator_epoch: int, timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        """One transaction marker per (topic, partition), committed through its shard
        (``DisklessProducer.write_markers``); one answer each, in order."""
        return self.producer.write_markers(items, producer_id=producer_id, producer_epoch=producer_epoch,
                                           commit=commit, coordinator_epoch=coordinator_epoch, timeout_ms=timeout_ms)

    def fetch(self, items: Sequence[tuple[TopicInfo, FetchPosition]], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, cancelled: Callable[[], bool] = lambda: False,
              isolation_level: int = 0) -> list[FetchedPartition]:
        return self.fetcher.fetch([DisklessFetchItem(info=i, position=p) for i, p in items], max_wait_ms=max_wait_ms,
                                  min_bytes=min_bytes, max_bytes=max_bytes, cancelled=cancelled,
                                  isolation_level=isolation_level)

    def list_offsets(self, items: Sequence[tuple[TopicInfo, int, int]], *,
                     isolation_level: int = 0) -> list[PartitionOffset]:
        """(topic, partition, timestamp or OffsetSpec) -> one answer each, in order (a partition
        asked twice, at two times, gets both answers); READ_COMMITTED: latest is the LSO."""
        return [*self._each_round(items, lambda q, infos: self.offsets.list_offsets(
            q, infos, isolation_level=isolation_level))]

    def delete_records(self, items: Sequence[tuple[TopicInfo, int, int]], *,
                       timeout_ms: int) -> list[DeleteRecordsResult]:
        """(topic, partition, delete-before offset) -> one answer each, in order."""
        return [*self._each_round(items, lambda q, infos: self.offsets.delete_records(q, infos,
                                                                                        timeout_ms=timeout_ms))]

    @staticmethod
    def _each_round(items: Sequence[tuple[TopicInfo, int, int]], ask: Callable) -> list:
        # DisklessOffsets takes one value per partition: a repeated partition goes in a later round.
        rounds: list[dict[tuple[str, int], int]] = []
        slots = []
        for info, partition, value in items:
            key = (info.name, partition)
            index = next((i for i, r in enumerate(rounds) if key not in r), len(rounds))
            if index == len(rounds):
                rounds.append({})
            rounds[index][key] = value
            slots.append((index, key))
        infos = {(i.name, p): i for i, p, _ in items}
        answers = [ask(r, infos) for r in rounds]
        return [answers[index][key] for index, key in slots]

    def stop(self) -> None:
        self.topics.stop()
        self.producer.stop()
        self.fetcher.stop()
        self._offsets_pool.shutdown(wait=False, cancel_futures=True)
        self.coordinators.close()
        self.store.close()
