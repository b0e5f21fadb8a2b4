"""coordinator.snapshots: the low-priority thread a snapshot's copy and upload run on."""

from __future__ import annotations

import os
import threading

import pytest

from lowtide.coordinator.snapshots import SNAPSHOT_NICENESS, run_at_low_priority
from lowtide.errors import KafkaStorageError


def test_snapshot_work_runs_at_a_lower_cpu_priority_and_hands_back_its_result_or_error():
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = run_at_low_priority(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), name="t")
    assert seen == min(19, base + SNAPSHOT_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller keeps its own

    def fail() -> None:
        raise KafkaStorageError("disk full")

    with pytest.raises(KafkaStorageError, match="disk full"):
        run_at_low_priority(fail, name="t")
