"""Delayed operations (DeleteRecords, acks=all Produce) with their deadlines kept in Redis."""

from lowtide.clock import now_ms  # re-exported: callers build deadlines with lowtide.purgatory.now_ms
from lowtide.purgatory.delayed import DelayedOperation
from lowtide.purgatory.events import LOW_WATERMARK_CHANNEL, LowWatermarkSubscriber, publish_low_watermark
from lowtide.purgatory.purgatory import Purgatory, build_deadlines_key, build_owner_key

__all__ = [
    "LOW_WATERMARK_CHANNEL",
    "DelayedOperation",
    "LowWatermarkSubscriber",
    "Purgatory",
    "build_deadlines_key",
    "build_owner_key",
    "now_ms",
    "publish_low_watermark",
]
