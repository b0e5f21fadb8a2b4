"""The collector settings of lowtide's server processes (lowtide.common.gc_tuning)."""

from __future__ import annotations

import gc

from lowtide.common.gc_tuning import YOUNG_GC_THRESHOLD, young_collections_less_often


def test_servers_collect_the_young_generation_every_10000_allocations_and_keep_the_older_thresholds():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        young_collections_less_often()
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 11, 12) == (10_000, 11, 12)
        assert gc.isenabled()
    finally:
        gc.set_threshold(*before)
