"""Wall-clock time in epoch milliseconds: the one definition of ``now_ms``.

Kafka timestamps, segment ages, purgatory deadlines (kept in Redis, shared across processes) and
follower lag are all wall-clock epoch milliseconds. Code that must be driven by tests takes a
``Clock`` (any ``() -> int``) and defaults to ``now_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def now_ms() -> int:
    """Milliseconds since the epoch (wall clock)."""
    return int(time.time() * 1000)
