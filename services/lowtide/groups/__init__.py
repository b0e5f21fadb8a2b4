"""Consumer-group offsets as stored in ``__consumer_offsets``: Kafka's record format
(``codec.py``) and the fold that materializes committed offsets from fetched batches
(``state.py``). Shared by the front door (group APIs) and the replicas (broker-side consumed
retention); imports only errors, clock and the record codec, never server code.
"""

from lowtide.groups.codec import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    decode_offset_key,
    decode_offset_value,
    encode_offset_key,
    encode_offset_value,
    java_string_hash,
    partition_for_group,
)
from lowtide.groups.state import (
    CommittedEntry,
    ConsumerRecord,
    OffsetRecord,
    PartitionOffsets,
    TopicCommit,
    TxnMarker,
    commits_by_topic,
    commits_by_topics,
    decode_offset_records,
)

__all__ = [
    "OFFSETS_TOPIC",
    "CommittedEntry",
    "ConsumerRecord",
    "OffsetKey",
    "OffsetRecord",
    "OffsetValue",
    "PartitionOffsets",
    "TopicCommit",
    "TxnMarker",
    "commits_by_topic",
    "commits_by_topics",
    "decode_offset_key",
    "decode_offset_records",
    "decode_offset_value",
    "encode_offset_key",
    "encode_offset_value",
    "java_string_hash",
    "partition_for_group",
]
