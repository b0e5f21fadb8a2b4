"""Broker-side consumed retention (KIP-68, option 1): delete what the consumer groups have read.

Runs in the replica's retention pass, before time/size retention, on each *led* partition of a
topic with ``consumed.retention.ms`` >= 0 (followers adopt the leader's log start offset, as
after DeleteRecords). The decision is a pure function (``decide_log_start_offset``):

* groups: ``consumed.retention.groups`` (comma-separated), default every group with a commit on
  the topic; with ``consumed.retention.group.inactive.ms`` >= 0, a group whose latest commit on
  the topic is older than that stops counting (logged, and counted in
  ``lowtide_consumed_retention_inactive_groups_total{topic,group}``) — a dead group neither pins
  the topic forever nor loses its data silently;
* target: ``consumed.retention.mode=all`` (default) the minimum committed offset over the
  groups, ``any`` the maximum (the furthest group);
* deletable: the prefix of segments whose last offset < target, wholly below the high
  watermark, and last modified more than ``consumed.retention.ms`` ago; the new log start
  offset is the first offset after them (KIP-107: it is made durable, then the segments go).

Delete nothing — and log why, at most once a minute per partition and reason — when the group
offsets cannot be read (any ``__consumer_offsets`` partition that matters failed this pass), a
group counted has no commit on the partition, a listed group has no commit on the topic at all,
or no group is left. ``lowtide_consumed_retention_lag_records{topic,partition,replica}`` = target
− low watermark: consumed, but not deleted on every replica yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.errors import InvalidConfig, LowtideError
from lowtide.groups import TopicCommit, partition_for_group
from lowtide.log.partition_log import LogStartOffsetCommit
from lowtide.replica.metrics import count_inactive_group
from lowtide.replica.offsets_reader import ConsumerOffsetsReader
from lowtide.replica.partition import Partition
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)

MODES = ("all", "any")
# consumed.retention.groups entries naming a KIP-932 share group ("share:<group id>"): its
# share-partition start offsets (everything below was acknowledged or archived) count as its
# committed offsets. Design: docs/design/kip-932-share-groups.md#deleted-once-delivered.
SHARE_PREFIX = "share:"
# (group id) -> {(topic id, partition): (start offset, write timestamp ms)} from __share_group_state.
ShareStarts = Callable[[str], Mapping[tuple[str, int], tuple[int, int]]]
LOG_EVERY_MS = 60_000

@dataclass(frozen=True)
class ConsumedRetentionConfig:
    """The topic's KIP-68 settings (``retention_ms`` -1 = off)."""

    retention_ms: int = -1
    groups: tuple[str, ...] = ()  # empty = every group with a commit on the topic
    mode: str = "all"
    group_inactive_ms: int = -1

    @property
    def enabled(self) -> bool:
        return self.retention_ms >= 0

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str]) -> ConsumedRetentionConfig:
        """Parse (broker defaults merged with) a topic's config; INVALID_CONFIG naming a bad key."""
        def integer(key: str) -> int:
            raw = config.get(key, "-1")
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise InvalidConfig(f"{key} must be an integer, got {raw!r}") from None
            if value < -1:
                raise InvalidConfig(f"{key} must be >= -1, got {value}")
            return value

        mode = str(config.get("consumed.retention.mode", "all")).strip()
        if mode not in MODES:
            raise InvalidConfig(f"consumed.retention.mode must be all or any, got {mode!r}")
        groups = tuple(g.strip() for g in str(config.get("consumed.retention.groups", "")).split(",") if g.strip())
        return cls(retention_ms=integer("consumed.retention.ms"), groups=groups, mode=mode,
                   group_inactive_ms=integer("consumed.retention.group.inactive.ms"))


@dataclass(frozen=True, slots=True)
class PassStats:
    """Totals over the passes that had at least one partition to look at, and the last one."""

    passes: int = 0
    seconds: float = 0.0
    last_seconds: float = 0.0
    last_partitions: int = 0
    last_raised: int = 0


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    next_offset: int  # last offset + 1
    last_modified_ms: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    """``log_start_offset``: raise it to this; None = delete nothing, ``reason`` says why.
    ``target`` is the committed offset the groups allow (None when unknown)."""

    log_start_offset: int | None
    reason: str
    target: int | None = None
    inactive_groups: tuple[str, ...] = ()


def latest_commit_ms(commits: Mapping[int, TopicCommit]) -> int:
    return max((c.commit_timestamp for c in commits.values()), default=-1)


def decide_log_start_offset(*, topic: str, partition: int, segments: Sequence[SegmentInfo], log_start_offset: int,
                            high_watermark: int, commits: Mapping[str, Mapping[int, TopicCommit]],
                            config: ConsumedRetentionConfig, now_ms: int) -> RetentionDecision:
    """The consumed-retention rule of the module doc, for one partition. No I/O."""
    groups = list(config.groups) or sorted(commits)
    if not groups:
        return RetentionDecision(None, f"no consumer group has committed offsets on topic {topic}")
    inactive: list[str] = []
    if config.group_inactive_ms >= 0:
        for g in groups:
            latest = latest_commit_ms(commits.get(g, {}))
            if latest >= 0 and now_ms - latest > config.group_inactive_ms:
                inactive.append(g)
    active = [g for g in groups if g not in inactive]
    if not active:
        return RetentionDecision(None, f"every group is inactive (no commit on {topic} for "
                                       f"{config.group_inactive_ms} ms): {', '.join(inactive)}",
                                 inactive_groups=tuple(inactive))
    offsets = []
    for g in active:
        on_topic = commits.get(g)
        if not on_topic:
            return RetentionDecision(None, f"group {g} is listed in consumed.retention.groups but has no "
                                           f"commit on topic {topic}", inactive_groups=tuple(inactive))
        committed = on_topic.get(partition)
        if committed is None:
            return RetentionDecision(None, f"group {g} has no committed offset for {topic}-{partition}",
                                     inactive_groups=tuple(inactive))
        offsets.append(committed.offset)
    target = min(min(offsets) if config.mode == "all" else max(offsets), high_watermark)
    new_start = None
    for s in segments:
        if s.size_bytes == 0 or s.next_offset > target or s.next_offset > high_watermark:
            break
        if now_ms - s.last_modified_ms <= config.retention_ms:
            break
        new_start = s.next_offset
    if new_start is None or new_start <= log_start_offset:
        return RetentionDecision(None, f"no segment below the committed offset {target} is older than "
                                       f"consumed.retention.ms={config.retention_ms}", target=target,
                                 inactive_groups=tuple(inactive))
    return RetentionDecision(new_start, "consumed", target=target, inactive_groups=tuple(inactive))


def snapshot_segments(partition: Partition) -> list[SegmentInfo]:
    with partition.log.segments_locked() as segments:
        return [SegmentInfo(base_offset=s.base_offset, next_offset=s.next_offset,
                            last_modified_ms=s.last_modified_ms, size_bytes=s.size_bytes) for s in segments]


class ConsumedRetention:
    """The broker-side pass (module doc) over the led partitions of one replica.

    Contract: ``apply`` raises the log start offset of each led partition the rule allows (as
    DeleteRecords does: durable first, followers adopt it on their next fetch) and returns the
    partitions it changed; it never raises for one partition's trouble (that partition deletes
    nothing, and the reason is logged). ``lags`` holds the last target per partition.

    Thread-safety: ``apply`` from the retention thread only; ``lag_samples`` from any thread.
    """

    def __init__(self, *, registry: PartitionRegistry, reader: ConsumerOffsetsReader,
                 broker_defaults: Mapping[str, str], clock: Callable[[], int]) -> None:
        self._registry = registry
        self._reader = reader
        self._defaults = dict(broker_defaults)
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, int], int] = {}
        self._logged: dict[tuple[str, int], tuple[str, int]] = {}
        self._inactive: set[tuple[str, str]] = set()
        self.stats = PassStats()
        # The share groups' start offsets (set by the replica server once its share-partitions
        # exist; None: a named share group has none, which deletes nothing).
        self.read_share_starts: ShareStarts | None = None

    def config_of(self, partition: Partition) -> ConsumedRetentionConfig:
        return ConsumedRetentionConfig.from_topic_config({**self._defaults, **partition.topic_info.config})

    def apply(self) -> list[Partition]:
        now = self._clock()
        led: list[tuple[Partition, ConsumedRetentionConfig]] = []
        for p in self._registry.leading():
            try:
                cfg = self.config_of(p)
            except InvalidConfig as exc:
                self._say(p, f"invalid consumed retention config: {exc.message}", now)
                continue
            if cfg.enabled and "delete" in p.topic_info.cleanup_policy:
                led.append((p, cfg))
        targets: dict[tuple[str, int], int] = {}
        changed: list[Partition] = []
        began = time.perf_counter()
        if led:
            read = self._reader.refresh()
            commits = self._reader.commits_by_topics({p.topic for p, _ in led})
            self._add_share_groups(led, commits)
            # One flush for every log start offset this pass raises, as DeleteRecords does.
            with LogStartOffsetCommit() as lso_commit:
                raising: dict[int, tuple[Partition, RetentionDecision]] = {}
                for p, cfg in led:
                    decision = self._decide(p, cfg, read.partitions, read.failures, commits.get(p.topic, {}), now)
                    self._note_inactive(p.topic, decision.inactive_groups, cfg)
                    if decision.target is not None:
                        targets[p.key] = decision.target
                    if decision.log_start_offset is None:
                        self._say(p, decision.reason, now)
                        continue
                    try:
                        _, moved = p.delete_records_before(decision.log_start_offset, lso_commit=lso_commit)
                    except LowtideError as err:  # leadership moved meanwhile
                        self._say(p, f"could not raise the log start offset: {err.name}: {err.message}", now)
                        continue
                    if moved:
                        raising[id(p.log)] = (p, decision)
                if raising:
                    try:
                        moved_logs = lso_commit.commit()
                    except LowtideError as err:  # the flush failed: none of them moved
                        for p, _ in raising.values():
                            self._say(p, f"could not make the log start offset durable: {err.name}", now)
                        moved_logs = []
                    for plog in moved_logs:
                        p, decision = raising[id(plog)]
                        changed.append(p)
                        log.info("consumed retention raised the log start offset", extra={"fields": {
                            "topic": p.topic, "partition": p.partition,
                            "log_start_offset": decision.log_start_offset, "committed": decision.target}})
        with self._lock:
            self._targets = targets
            # A topic no longer led here (deleted, moved) is forgotten: if it comes back, a group
            # that goes quiet on it is counted again (replica/metrics.forget_topic drops its series).
            led_topics = {p.topic for p, _ in led}
            self._inactive = {k for k in self._inactive if k[0] in led_topics}
            if led:
                elapsed = time.perf_counter() - began
                self.stats = PassStats(passes=self.stats.passes + 1, seconds=self.stats.seconds + elapsed,
                                       last_seconds=elapsed, last_partitions=len(led), last_raised=len(changed))
        return changed

    def _add_share_groups(self, led: Sequence[tuple[Partition, ConsumedRetentionConfig]],
                          commits: dict[str, dict[str, dict[int, TopicCommit]]]) -> None:
        """Each named share group's start offsets, as the commits of group ``share:<id>`` (a share
        group whose state cannot be read now has none here: that partition deletes nothing)."""
        wanted = {g for _, cfg in led for g in cfg.groups if g.startswith(SHARE_PREFIX)}
        if not wanted or self.read_share_starts is None:
            return
        ids = {p.topic_info.topic_id: p.topic for p, _ in led}
        for group in sorted(wanted):
            try:
                starts = self.read_share_starts(group.removeprefix(SHARE_PREFIX))
            except LowtideError as err:
                log.info("consumed retention cannot read share group state", extra={"fields": {
                    "group": group, "error": err.name}})
                continue
            for (topic_id, partition), (offset, written_ms) in starts.items():
                topic = ids.get(topic_id)
                if topic is not None and offset >= 0:
                    commits.setdefault(topic, {}).setdefault(group, {})[partition] = TopicCommit(
                        offset=offset, commit_timestamp=written_ms)

    def _decide(self, p: Partition, cfg: ConsumedRetentionConfig, num_partitions: int | None,
                failures: Mapping[int, str], commits: Mapping[str, Mapping[int, TopicCommit]],
                now: int) -> RetentionDecision:
        if failures:
            if num_partitions:
                needed = ({partition_for_group(g, partitions=num_partitions) for g in cfg.groups
                           if not g.startswith(SHARE_PREFIX)} if cfg.groups else set(range(num_partitions)))
            else:
                needed = set(failures)
            blocking = sorted(set(failures) & needed)
            if blocking:
                return RetentionDecision(None, f"cannot read group offsets: __consumer_offsets-{blocking[0]}: "
                                               f"{failures[blocking[0]]}")
        log_start, hw = p.log.log_start_offset, p.log.high_watermark
        return decide_log_start_offset(topic=p.topic, partition=p.partition, segments=snapshot_segments(p),
                                       log_start_offset=log_start, high_watermark=hw, commits=commits, config=cfg,
                                       now_ms=now)

    def _note_inactive(self, topic: str, inactive: Sequence[str], cfg: ConsumedRetentionConfig) -> None:
        with self._lock:
            now_inactive = {(topic, g) for g in inactive}
            for key in sorted(now_inactive - self._inactive):
                count_inactive_group(*key)
                log.warning("consumer group no longer holds back consumed retention: no commit for "
                            "consumed.retention.group.inactive.ms", extra={"fields": {
                                "topic": key[0], "group": key[1], "inactive_ms": cfg.group_inactive_ms}})
            # A group that commits again counts again (and is counted again if it goes quiet again).
            self._inactive = {k for k in self._inactive if k[0] != topic} | now_inactive

    def _say(self, p: Partition, reason: str, now: int) -> None:
        """Log why ``p`` deleted nothing: when the reason changes, else at most once a minute."""
        last = self._logged.get(p.key)
        if last is not None and last[0] == reason and now - last[1] < LOG_EVERY_MS:
            return
        self._logged[p.key] = (reason, now)
        log.info("consumed retention deletes nothing", extra={"fields": {
            "topic": p.topic, "partition": p.partition, "reason": reason}})

    def lag_samples(self) -> list[tuple[Partition, int]]:
        """(led partition, target − low watermark) for each partition with a known target."""
        with self._lock:
            targets = dict(self._targets)
        live = self._registry.live_brokers
        out = []
        for p in self._registry.leading():
            target = targets.get(p.key)
            if target is None:
                continue
            lw = p.low_watermark(live)
            if lw >= 0:
                out.append((p, max(0, target - lw)))
        return out


class ConsumedRetentionCollector(Collector):
    """Read at scrape time::

        lowtide_consumed_retention_lag_records{topic,partition,replica}   target - low watermark
        lowtide_consumed_retention_passes_total{replica}                  passes with partitions to look at
        lowtide_consumed_retention_pass_seconds_total{replica}            time spent in them
        lowtide_consumed_retention_last_pass_seconds{replica}             the last one's duration
        lowtide_consumed_retention_last_pass_partitions{replica}          led partitions it looked at
        lowtide_consumed_retention_last_pass_raised{replica}              log start offsets it raised
    """

    def __init__(self, retention: ConsumedRetention, *, broker_id: int) -> None:
        self._retention = retention
        self._replica = str(broker_id)

    def collect(self):
        gauge = GaugeMetricFamily("lowtide_consumed_retention_lag_records",
                                  "Committed offset the consumer groups allow (min, or max with mode=any) minus "
                                  "the low watermark: consumed but not yet deleted on every replica",
                                  labels=["topic", "partition", "replica"])
        for p, lag in self._retention.lag_samples():
            gauge.add_metric([p.topic, str(p.partition), self._replica], lag)
        yield gauge
        stats = self._retention.stats
        for name, doc, value, family in [
            ("passes", "Consumed retention passes that had partitions to look at", stats.passes,
             CounterMetricFamily),
            ("pass_seconds", "Seconds spent in consumed retention passes", stats.seconds, CounterMetricFamily),
            ("last_pass_seconds", "Duration of the last consumed retention pass", stats.last_seconds,
             GaugeMetricFamily),
            ("last_pass_partitions", "Led partitions the last consumed retention pass looked at",
             stats.last_partitions, GaugeMetricFamily),
            ("last_pass_raised", "Log start offsets the last consumed retention pass raised", stats.last_raised,
             GaugeMetricFamily),
        ]:
            metric = family(f"lowtide_consumed_retention_{name}", doc, labels=["replica"])
            metric.add_metric([self._replica], value)
            yield metric
