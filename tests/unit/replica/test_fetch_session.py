"""Both halves of a fetch session (lowtide/replica/fetch_session.py), without a network: what a
follower lists, what a leader marks dirty, answers and refuses."""

from __future__ import annotations

import pytest

from lowtide.errors import FetchSessionIdNotFound, InvalidFetchSessionEpoch, NotLeaderOrFollower
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.replica.fetch_session import FetchSession, FetchSessions, FollowerSession


class Registry:
    def __init__(self):
        self.watchers = []

    def watch(self, w):
        self.watchers.append(w)

    def unwatch(self, w):
        self.watchers.remove(w)


class Wake:
    def __init__(self):
        self.fired = 0

    def set(self):
        self.fired += 1


def pos(p, offset, *, lso=0, epoch=3):
    return FetchPosition(topic="t", partition=p, fetch_offset=offset, log_start_offset=lso, current_leader_epoch=epoch)


def fetched(p, *, records=b"", hw=0, lso=0, epoch=3, error=None):
    return FetchedPartition(topic="t", partition=p, records=records, high_watermark=hw, log_start_offset=lso,
                            leader_epoch=epoch, error=error)


# -- the follower's half ----------------------------------------------------------------------------
def test_a_new_follower_session_lists_every_partition_and_opens_at_epoch_one():
    f = FollowerSession()
    listed, round_ = f.plan({("t", 0): pos(0, 5), ("t", 1): pos(1, 7)}, following=None)
    assert [p.partition for p in listed] == [0, 1]
    assert round_.epoch == 1 and round_.session_id != 0 and round_.forgotten == ()


def test_a_follower_lists_what_moved_and_what_the_last_answer_carried_and_nothing_else():
    f = FollowerSession()
    f.plan({("t", 0): pos(0, 5), ("t", 1): pos(1, 7), ("t", 2): pos(2, 9)}, following=None)
    f.answered([fetched(1, records=b"x")])
    assert f.recheck() == {("t", 1)}
    # partition 1 was in the answer (listed though unchanged), 0 moved, 2 did not
    listed, round_ = f.plan({("t", 0): pos(0, 6), ("t", 1): pos(1, 7), ("t", 2): pos(2, 9)}, following=None)
    assert sorted(p.partition for p in listed) == [0, 1]
    assert round_.epoch == 2
    f.answered([])
    listed, round_ = f.plan({("t", 0): pos(0, 6), ("t", 2): pos(2, 9)}, following=None)
    assert listed == [] and round_.epoch == 3


def test_a_follower_forgets_partitions_it_no_longer_follows_and_those_left_for_truncation():
    f = FollowerSession()
    f.plan({("t", 0): pos(0, 5), ("t", 1): pos(1, 7), ("t", 2): pos(2, 9)}, following=None)
    f.answered([])
    f.leave([("t", 2)])
    _, round_ = f.plan({("t", 0): pos(0, 5)}, following={("t", 0): object(), ("t", 2): object()})
    assert sorted(round_.forgotten) == [("t", 1), ("t", 2)]
    f.answered([])
    # back from truncation: not told any more, so listed as new
    listed, round_ = f.plan({("t", 2): pos(2, 4)}, following=None)
    assert [p.partition for p in listed] == [2] and round_.forgotten == ()


def test_a_reset_follower_session_opens_a_new_one_listing_everything():
    f = FollowerSession()
    _, first = f.plan({("t", 0): pos(0, 5)}, following=None)
    f.answered([])
    f.reset()
    listed, again = f.plan({("t", 0): pos(0, 5)}, following=None)
    assert len(listed) == 1 and again.epoch == 1 and not f.recheck()


# -- the leader's half ------------------------------------------------------------------------------
def test_a_leader_session_is_dirty_for_its_own_partitions_only_and_wakes_the_parked_round():
    s = FetchSession(session_id=1, replica_id=2)
    s.update([pos(0, 5), pos(1, 5)], ())
    assert sorted(s.take_dirty()) == [("t", 0), ("t", 1)]
    wake = s.wake = Wake()
    s.changed([("u", 0), ("t", 9, "appended")])
    assert s.take_dirty() == [] and wake.fired == 0
    s.changed([("t", 1, "hw")])
    assert s.take_dirty() == [("t", 1)] and wake.fired == 1
    s.changed(None)
    assert sorted(s.take_dirty()) == [("t", 0), ("t", 1)]


def test_a_leader_answers_a_partition_again_only_when_its_records_error_or_offsets_changed():
    s = FetchSession(session_id=1, replica_id=2)
    s.update([pos(0, 5)], ())
    first = fetched(0, hw=5, lso=0)
    assert s.worth_answering(first)
    s.answered([first])
    assert not s.worth_answering(fetched(0, hw=5, lso=0))
    assert s.worth_answering(fetched(0, hw=6, lso=0))
    assert s.worth_answering(fetched(0, hw=5, lso=2))
    assert s.worth_answering(fetched(0, hw=5, lso=0, epoch=4))
    assert s.worth_answering(fetched(0, hw=5, lso=0, records=b"r"))
    error = fetched(0, hw=5, error=NotLeaderOrFollower("moved"))
    assert s.worth_answering(error)
    s.answered([error])
    assert s.worth_answering(fetched(0, hw=5, lso=0)), "after an error the next good answer goes out"


def test_a_leader_refuses_rounds_out_of_turn_and_sessions_it_does_not_hold():
    registry = Registry()
    sessions = FetchSessions(registry=registry)
    opened = sessions.begin(2, FetchSessionRound(session_id=11, epoch=1), [pos(0, 5)])
    assert registry.watchers == [opened]
    sessions.begin(2, FetchSessionRound(session_id=11, epoch=2), [])
    with pytest.raises(InvalidFetchSessionEpoch):
        sessions.begin(2, FetchSessionRound(session_id=11, epoch=2), [])
    with pytest.raises(FetchSessionIdNotFound):
        sessions.begin(2, FetchSessionRound(session_id=12, epoch=3), [])
    with pytest.raises(FetchSessionIdNotFound):
        sessions.begin(3, FetchSessionRound(session_id=11, epoch=2), [])
    assert sessions.seen_ms(2, ("t", 0)) > 0
    assert sessions.seen_ms(2, ("t", 1)) == 0 and sessions.seen_ms(3, ("t", 0)) == 0
    # a new session of the same follower replaces the old one, whose watcher goes
    replaced = sessions.begin(2, FetchSessionRound(session_id=13, epoch=1), [pos(1, 0)])
    assert registry.watchers == [replaced]
    sessions.begin(2, FetchSessionRound(session_id=13, epoch=2, forgotten=(("t", 1),)), [])
    assert sessions.seen_ms(2, ("t", 1)) == 0
    sessions.close()
    assert registry.watchers == []


def test_a_leader_session_remembers_the_partitions_whose_isr_lacks_its_follower_until_it_joins():
    class Led:
        role = "leader"

        def __init__(self, isr):
            self.isr = isr

    class Parts:
        def __init__(self):
            self.by_key = {("t", 0): Led({1}), ("t", 1): Led({1, 2})}

        def find(self, topic, partition):
            return self.by_key.get((topic, partition))

    parts = Parts()
    s = FetchSession(session_id=1, replica_id=2)
    s.update([pos(0, 5), pos(1, 5)], ())
    s.note_isr(parts, [pos(0, 5), pos(1, 5)])
    assert s.outside_isr() == [("t", 0)], "recorded again every round: a refused expansion is tried again"
    parts.by_key[("t", 0)] = Led({1, 2})
    s.note_isr(parts, [pos(0, 5)])
    assert s.outside_isr() == []


def test_a_follower_this_leader_dropped_from_an_isr_is_offered_the_partition_again_though_it_did_not_move():
    sessions = FetchSessions(registry=Registry())
    s = sessions.begin(2, FetchSessionRound(session_id=7, epoch=1), [pos(0, 5), pos(1, 5)])
    s.note_isr(_LedBy({("t", 0): {1, 2}, ("t", 1): {1, 2}}), [pos(0, 5), pos(1, 5)])
    assert s.outside_isr() == []

    sessions.left_isr({2, 3}, ("t", 1))  # 3 has no session here: nothing to tell
    sessions.left_isr({2}, ("t", 9))  # not in 2's session

    assert s.outside_isr() == [("t", 1)]


class _LedBy:
    """Partitions led here, by key, with their ISR."""

    def __init__(self, isrs):
        self.by_key = {k: type("Led", (), {"role": "leader", "isr": isr})() for k, isr in isrs.items()}

    def find(self, topic, partition):
        return self.by_key.get((topic, partition))
