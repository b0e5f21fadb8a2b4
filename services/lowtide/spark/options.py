"""The data source's options, named and defaulted as Spark's Kafka source and sink name them.

Read options (``spark.read.format("lowtide")`` / ``spark.readStream``)::

    bootstrap.servers | kafka.bootstrap.servers   front door HOST:PORT                       required
    subscribe          t1,t2                       exactly one of subscribe /
    subscribePattern   regex (re.fullmatch)        subscribePattern / assign
    assign             {"t1":[0,1],"t2":[0]}
    startingOffsets    earliest | latest | {"t1":{"0":23,"1":-2}}   (-2 earliest, -1 latest)
                       default: earliest (batch), latest (streaming)
    endingOffsets      latest | {"t1":{"0":50,"1":-1}}             default latest; streaming: the query
                       reads no further (with Trigger.AvailableNow it ends there)
    maxOffsetsPerTrigger  N records per micro-batch, shared over partitions by what each has
    minPartitions      split offset ranges so a read has at least this many Spark partitions
    failOnDataLoss     true (default): a range that was deleted fails the query, naming partition
                       and offsets; false: the read skips ahead to the log start offset
    includeHeaders     false (default)
    lowtide.group.id   streaming: commit each micro-batch's end offsets to this consumer group
    lowtide.share.group   read as this KIP-932 share group: the topic is a queue, shared with every
                       other reader of the group (module doc of lowtide.spark.share). startingOffsets
                       is then earliest (batch default: sets the group's share.auto.offset.reset) or
                       latest (streaming default: the group's config as it is), for the partitions
                       the group never consumed;
                       endingOffsets and lowtide.group.id do not apply
    lowtide.share.max.records   share reads: most records one batch read or one micro-batch takes
                       (streaming: maxOffsetsPerTrigger too; the smaller wins). Default: all there is
    lowtide.fetch.max.bytes   bytes per Fetch (default 8 MiB)
    lowtide.read.timeout.ms   longest a task waits for offsets the plan promised (default 60000)

Write options: ``bootstrap.servers``; ``topic`` (overrides a ``topic`` column); ``lowtide.batch.bytes``
(most bytes per record batch, default 512 KiB: below the default max.message.bytes and segment size;
capped by a topic's own settings); ``lowtide.compression`` none|gzip|lz4|zstd.

Both: ``lowtide.auth.token`` (bearer token) or ``lowtide.command.config`` (a properties file as the
CLI's ``--command-config``, whose ``ssl.*`` keys also apply); TLS with ``lowtide.ssl.ca.location``
(the CA to verify the front door and leaders with), ``lowtide.ssl.certificate.location`` and
``lowtide.ssl.key.location`` (a client certificate, for mutual TLS). Keys are case-insensitive
(Spark passes them lower-cased).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lowtide.auth.client_config import TOKEN_KEY, TOKEN_KEY_ALIASES, bearer_metadata, load_command_config
from lowtide.errors import InvalidConfig
from lowtide.tls.config import ClientTls

EARLIEST = -2
LATEST = -1
MiB = 1 << 20


def _get(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise InvalidConfig(f"option {name} must be true or false, got {raw!r}")


def _int(options: Mapping[str, str], name: str, default: int | None, *, minimum: int = 1) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidConfig(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise InvalidConfig(f"option {name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class OffsetChoice:
    """earliest / latest for every partition, or per-partition offsets (JSON form)."""

    default: int  # EARLIEST or LATEST
    explicit: dict[str, dict[int, int]] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int:
        return self.explicit.get(topic, {}).get(partition, self.default)


def parse_offsets(raw: str | None, *, name: str, default: int, allow_earliest: bool = True) -> OffsetChoice:
    if raw is None:
        return OffsetChoice(default)
    text = raw.strip()
    if text.lower() == "earliest":
        if not allow_earliest:
            raise InvalidConfig(f"option {name} cannot be earliest")
        return OffsetChoice(EARLIEST)
    if text.lower() == "latest":
        return OffsetChoice(LATEST)
    try:
        parsed = json.loads(text)
        explicit = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise InvalidConfig(f"option {name} must be earliest, latest or JSON like "
                            f'{{"topic":{{"0":23,"1":-2}}}}, got {raw!r}') from None
    for topic, parts in explicit.items():
        for p, o in parts.items():
            if o < EARLIEST or (o == EARLIEST and not allow_earliest):
                raise InvalidConfig(f"option {name}: offset {o} for {topic}-{p} is not valid")
    return OffsetChoice(default, explicit)


@dataclass(frozen=True)
class Connection:
    """How to reach the cluster: picklable (it travels to executors)."""

    bootstrap: str
    token: str | None = None
    tls: ClientTls | None = None

    def call_metadata(self) -> list[tuple[str, str]]:
        return bearer_metadata(self.token) if self.token else []


def parse_connection(options: Mapping[str, str]) -> Connection:
    bootstrap = _get(options, "bootstrap.servers", "kafka.bootstrap.servers")
    if not bootstrap:
        raise InvalidConfig("option bootstrap.servers (or kafka.bootstrap.servers) is required")
    token = _get(options, "lowtide.auth.token")
    config_path = _get(options, "lowtide.command.config")
    config = load_command_config(config_path) if config_path else {}
    if token is None:
        token = next((config[k].strip() for k in (TOKEN_KEY, *TOKEN_KEY_ALIASES) if config.get(k, "").strip()), None)
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        value = _get(options, "lowtide." + key)
        if value:
            config[key] = value
    # Several bootstrap servers (Kafka style) are accepted; the front door is stateless, any will do.
    return Connection(bootstrap=bootstrap.split(",")[0].strip(), token=token, tls=ClientTls.from_properties(config))


@dataclass(frozen=True)
class Subscription:
    """Which partitions a read covers: named topics, a topic regex, or explicit partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned:
            return f"assign {json.dumps({t: list(p) for t, p in self.assigned.items()})}"
        return f"subscribe {','.join(self.topics)}"


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = {k: _get(options, k) for k in ("subscribe", "subscribePattern", "assign")}
    chosen = [k for k, v in given.items() if v is not None and v.strip()]
    if len(chosen) != 1:
        raise InvalidConfig("exactly one of the options subscribe, subscribePattern, assign is required"
                            + (f" (got {', '.join(chosen)})" if chosen else ""))
    kind = chosen[0]
    raw = given[kind] or ""
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        return Subscription(topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as err:
            raise InvalidConfig(f"option subscribePattern is not a valid regex: {err}") from None
        return Subscription(pattern=raw)
    try:
        parsed = json.loads(raw)
        assigned = {str(t): tuple(int(p) for p in ps) for t, ps in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise InvalidConfig(f'option assign must be JSON like {{"topic":[0,1]}}, got {raw!r}') from None
    return Subscription(assigned=assigned)


@dataclass(frozen=True)
class ShareRead:
    """A read as a share group (``lowtide.share.group``). ``start``: where the group starts on a
    partition it never consumed ("earliest", or None: the replicas' default); ``max_records``: the
    bound of one read or micro-batch (None: everything available)."""

    group: str
    start: str | None
    max_records: int | None


@dataclass(frozen=True)
class ReadOptions:
    connection: Connection
    subscription: Subscription
    starting: OffsetChoice
    ending: OffsetChoice
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    group_id: str | None
    fetch_max_bytes: int
    read_timeout_ms: int
    share: ShareRead | None = None


def parse_share(options: Mapping[str, str], *, streaming: bool) -> ShareRead | None:
    group = _get(options, "lowtide.share.group")
    if group is None or not group.strip():
        if _get(options, "lowtide.share.max.records") is not None:
            raise InvalidConfig("option lowtide.share.max.records needs lowtide.share.group")
        return None
    for name in ("endingOffsets", "lowtide.group.id"):
        if _get(options, name) is not None:
            raise InvalidConfig(f"option {name} does not apply to a share group read (lowtide.share.group): "
                                "a share group keeps its own progress")
    raw = (_get(options, "startingOffsets") or ("latest" if streaming else "earliest")).strip().lower()
    if raw not in ("earliest", "latest"):
        raise InvalidConfig(f"option startingOffsets of a share group read must be earliest or latest, got {raw!r}: "
                            "it says where the group starts on a partition it never consumed")
    bound = _int(options, "lowtide.share.max.records", None)
    if streaming and (per_trigger := _int(options, "maxOffsetsPerTrigger", None)) is not None:
        bound = per_trigger if bound is None else min(bound, per_trigger)
    return ShareRead(group=group.strip(), start="earliest" if raw == "earliest" else None, max_records=bound)


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    ending_raw = _get(options, "endingOffsets")
    return ReadOptions(
        connection=parse_connection(options),
        subscription=parse_subscription(options),
        starting=parse_offsets(_get(options, "startingOffsets"), name="startingOffsets",
                               default=LATEST if streaming else EARLIEST),
        ending=parse_offsets(ending_raw, name="endingOffsets", default=LATEST, allow_earliest=False),
        max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None),
        min_partitions=_int(options, "minPartitions", None),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        group_id=_get(options, "lowtide.group.id") or None,
        fetch_max_bytes=_int(options, "lowtide.fetch.max.bytes", 8 * MiB) or 8 * MiB,
        read_timeout_ms=_int(options, "lowtide.read.timeout.ms", 60_000) or 60_000,
        share=parse_share(options, streaming=streaming),
    )


@dataclass(frozen=True)
class WriteOptions:
    connection: Connection
    topic: str | None
    batch_bytes: int
    compression: str


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    compression = (_get(options, "lowtide.compression") or "none").lower()
    if compression not in ("none", "gzip", "lz4", "zstd"):
        raise InvalidConfig(f"option lowtide.compression must be none, gzip, lz4 or zstd, got {compression!r}")
    return WriteOptions(connection=parse_connection(options), topic=_get(options, "topic") or None,
                        batch_bytes=_int(options, "lowtide.batch.bytes", 512 * 1024, minimum=1024) or 512 * 1024,
                        compression=compression)
