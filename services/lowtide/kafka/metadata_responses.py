"""Encoded Kafka Metadata answers, kept while they are current (issue 48).

Why: a Metadata request for every topic of a cluster of 10,000 partitions cost 215-490 ms on the
listener (the front door's answer, then a Kafka entity per partition, then kio's encoder), and
Kafka's clients send one at start, every ``metadata.max.age.ms`` and after every error that
suggests stale metadata. A cluster at rest answers the same bytes each time.

When an answer is current: the front door's answer says which metadata store revision it
reflects at least (``MetadataResponse.revision``). The listener's own process follows the same
store (``revision()``: its image's revision). An encoded answer is served again while the
listener's revision is no newer than the answer's, so it is never staler than what this process
itself knows; once the process sees a newer revision (a leader moved, an ISR changed, a topic or
an ACL came or went, a broker's session ended) the answer is built again.

``lowtide_kafka_metadata_answers_total{source="kept"|"built"}`` counts both kinds of answer.

The key: the request's version, the topics it names (None: all), the listener it came in on
(brokers' endpoints differ per listener) and the connection's identity (what it may DESCRIBE).
At most ``MAX_ENTRIES`` answers are kept, the least recently used going first.

Thread-safety: thread-safe (one lock; the listener's workers call it concurrently).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from prometheus_client import Counter

from lowtide.kafka.protocol import EncodedBody

MAX_ENTRIES = 256
ANSWERS = Counter("lowtide_kafka_metadata_answers", "Kafka Metadata answers by where they came from "
                  "(kept: an encoded answer still current; built: asked and encoded)", ["source"])


class MetadataResponses:
    """Encoded Metadata answers by key, each valid up to the store revision it reflects."""

    def __init__(self, *, revision: Callable[[], int], max_entries: int = MAX_ENTRIES) -> None:
        self.revision = revision
        self._max = max_entries
        self._entries: OrderedDict[Hashable, tuple[int, EncodedBody]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> EncodedBody | None:
        """The answer kept for ``key`` if no newer revision was seen here since it was built."""
        now = self.revision()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] < now:
                self.misses += 1
                ANSWERS.labels("built").inc()
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        ANSWERS.labels("kept").inc()
        return entry[1]

    def put(self, key: Hashable, *, revision: int, body: EncodedBody) -> None:
        """Keep ``body``, built from an answer reflecting store ``revision`` (0: unknown, kept not)."""
        if revision <= 0:
            return
        with self._lock:
            self._entries[key] = (revision, body)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
