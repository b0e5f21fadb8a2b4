from __future__ import annotations

from lowtide.log.file_deleter import FileDeleter
from tests.waiting import wait_until


def test_scheduled_files_are_unlinked_in_the_background(tmp_path):
    paths = [tmp_path / f"{i}.log.deleted" for i in range(3)]
    for p in paths:
        p.write_bytes(b"x")
    pending = FileDeleter().schedule(paths)
    wait_until(lambda: pending.done, what="the scheduled files unlinked")
    assert not any(p.exists() for p in paths)


def test_a_later_due_time_does_not_hold_back_an_earlier_one(tmp_path):
    late, early = tmp_path / "late.deleted", tmp_path / "early.deleted"
    late.write_bytes(b"x")
    early.write_bytes(b"x")
    deleter = FileDeleter()
    slow = deleter.schedule([late], delay_s=3600)
    fast = deleter.schedule([early])
    wait_until(lambda: fast.done, what="the file due now unlinked")
    assert late.exists() and not slow.done


def test_finish_unlinks_at_once_and_tolerates_files_already_gone(tmp_path):
    there, gone = tmp_path / "there.deleted", tmp_path / "gone.deleted"
    there.write_bytes(b"x")
    pending = FileDeleter().schedule([there, gone], delay_s=3600)
    pending.finish()
    assert pending.done and not there.exists()
