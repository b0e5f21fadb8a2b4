"""The crash-safe swap (.cleaned -> .swap -> live): a crash after any step reopens to a readable log
with every latest value at its offset, and nothing the pass left behind."""

from __future__ import annotations

import os

import pytest

from lowtide.log import filenames
from lowtide.log.cleaner.cleaner import Cleaner
from lowtide.log.cleaner.swap import STEP_CLEANED, STEP_COMMITTED, SWAP_STEPS
from lowtide.log.swap_recovery import complete_interrupted_swaps, swap_range_file_name
from tests.unit.log.cleaner.conftest import NOW, by_key, clean, commit, fill, leftovers, open_log, records_of


class Crash(BaseException):
    """Stands in for kill -9 between two steps of a swap. A test double because a real process
    cannot be made to die between two renames on demand; the integration test kills a real replica
    mid-pass. A BaseException, so that no clean-up code of the cleaner runs, as after a real crash."""


def crash_at(step: str):
    def hook(at: str) -> None:
        if at == step:
            raise Crash(at)
    return hook


def crashed_pass(tmp_path, step: str):
    """A log of 6 keys written 12 times, one small segment per write (so the first group merges
    several segments), whose first cleaning pass dies at ``step``; returns (the latest value of each
    key, every original record by offset)."""
    plog = open_log(tmp_path / "t-0")
    latest = fill(plog, keys=6, rounds=12, roll_each=True)
    assert len(plog.describe()["segments"]) > 10
    originals = {r.offset: (r.key, r.value) for r in records_of(plog)}
    with pytest.raises(Crash):
        clean(plog, NOW, cleaner=Cleaner(swap_hook=crash_at(step)))
    plog.close()  # only closes descriptors: the directory stays as the crash left it
    return latest, originals


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_a_crash_after_each_step_of_a_swap_reopens_to_a_readable_log_with_every_latest_value(tmp_path, step):
    latest, originals = crashed_pass(tmp_path, step)

    reopened = open_log(tmp_path / "t-0")
    commit(reopened)

    assert by_key(reopened) == latest
    records = records_of(reopened)
    assert all(originals[r.offset] == (r.key, r.value) for r in records)  # offsets unchanged
    assert leftovers(reopened.dir) == []
    if step == STEP_CLEANED:
        assert len(records) == len(originals)  # not committed: the old segments stand
    else:
        assert len(records) < len(originals)  # committed: the cleaned segment replaced them
    reopened.close()


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_after_a_crash_the_next_pass_cleans_the_whole_log(tmp_path, step):
    latest, _ = crashed_pass(tmp_path, step)
    reopened = open_log(tmp_path / "t-0")
    commit(reopened)
    clean(reopened, NOW)
    assert by_key(reopened) == latest and len(records_of(reopened)) == len(latest)
    reopened.close()


def test_recovering_twice_is_the_same_as_once(tmp_path):
    crashed_pass(tmp_path, STEP_COMMITTED)
    dir = tmp_path / "t-0"
    assert complete_interrupted_swaps(dir) == [0]
    after_once = sorted(os.listdir(dir))
    assert complete_interrupted_swaps(dir) == []
    assert sorted(os.listdir(dir)) == after_once


def test_a_swap_without_its_range_file_replaces_only_the_segment_with_its_name(tmp_path):
    latest, _ = crashed_pass(tmp_path, STEP_COMMITTED)
    dir = tmp_path / "t-0"
    swap = [n for n in os.listdir(dir) if n.endswith(".log.swap")]
    assert swap == [filenames.log_file_name(0) + ".swap"]
    merged_end = int((dir / swap_range_file_name(0)).read_text().split()[1])
    (dir / swap_range_file_name(0)).unlink()

    reopened = open_log(dir)
    commit(reopened)
    assert by_key(reopened) == latest  # the other old segments stay: duplicates, nothing lost
    assert any(0 < base < merged_end for base, _, _ in reopened.describe()["segments"])
    reopened.close()


def test_with_its_range_file_a_swap_replaces_every_segment_of_its_group(tmp_path):
    crashed_pass(tmp_path, STEP_COMMITTED)
    dir = tmp_path / "t-0"
    merged_end = int((dir / swap_range_file_name(0)).read_text().split()[1])
    assert merged_end > 6  # the group merged several segments (6 offsets each)
    reopened = open_log(dir)
    assert not any(0 < base < merged_end for base, _, _ in reopened.describe()["segments"])
    reopened.close()


def test_a_directory_without_cleaner_files_is_left_alone(tmp_path):
    plog = open_log(tmp_path / "t-0")
    fill(plog, keys=2, rounds=3)
    plog.close()
    before = sorted(os.listdir(tmp_path / "t-0"))
    assert complete_interrupted_swaps(tmp_path / "t-0") == []
    assert sorted(os.listdir(tmp_path / "t-0")) == before
    assert complete_interrupted_swaps(tmp_path / "missing") == []
