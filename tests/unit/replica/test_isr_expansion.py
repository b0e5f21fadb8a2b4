"""The HW while an ISR expansion is being written (Kafka's "maximal ISR").

The leader writes the ISR with a follower added to the metadata store before it adopts it. While
that write is in flight the store may already list the follower, and elections pick from the
store's ISR: an HW that moved past the follower's LEO meanwhile would make an electable replica
that lacks acknowledged records. Found by the EOS copier test: a batch acknowledged at
ISR {0, 1} while the expansion of 2 was in flight, then 2 elected, and the batch was gone.
"""

from __future__ import annotations

from dataclasses import replace


def _expansion_of_2_in_flight(make_replicas):
    r = make_replicas(isr=(0, 1))
    r.produce(5)
    r.replicate(1)  # follower 1 holds 0-4, follower 2 nothing yet
    r.fetch_once(2)
    r.fetch_once(2)
    leader = r.leader
    assert (leader.log.high_watermark, r.follower(2).log.log_end_offset) == (5, 5)
    assert leader.isr_expansion_candidate(2) == frozenset({0, 1, 2})
    return r, leader


def test_the_hw_does_not_pass_a_follower_whose_isr_expansion_is_being_written(make_replicas):
    r, leader = _expansion_of_2_in_flight(make_replicas)

    r.produce(5)
    r.replicate(1)  # at ISR {0, 1} alone this made the HW 10

    assert leader.log.high_watermark == 5
    r.fetch_once(2)  # takes 5-9
    r.fetch_once(2)  # tells the leader
    assert leader.log.high_watermark == 10


def test_an_expansion_the_store_accepted_keeps_the_follower_counted(make_replicas):
    r, leader = _expansion_of_2_in_flight(make_replicas)
    r.produce(5)

    r.shrink_isr((0, 1, 2))  # the leader adopts what the store accepted (set_isr)
    leader.end_isr_expansion({2}, known=True)
    r.fetch_once(1)

    assert leader.log.high_watermark == 5


def test_an_expansion_the_store_refused_stops_holding_the_hw_back(make_replicas):
    r, leader = _expansion_of_2_in_flight(make_replicas)
    r.produce(5)
    r.fetch_once(1)

    leader.end_isr_expansion({2}, known=True)  # refused: the ISR stays {0, 1}
    r.fetch_once(1)

    assert leader.log.high_watermark == 10


def test_an_expansion_with_no_answer_holds_the_hw_back_until_a_record_from_the_store_says_how_it_ended(
        make_replicas):
    r, leader = _expansion_of_2_in_flight(make_replicas)
    r.produce(5)

    leader.end_isr_expansion({2}, known=False)  # etcd did not answer: it may have landed
    r.fetch_once(1)
    assert leader.log.high_watermark == 5

    leader.apply_state(replace(r.state, partition_epoch=r.state.partition_epoch + 1))  # it did not
    r.fetch_once(1)
    assert leader.log.high_watermark == 10


def test_a_follower_with_an_expansion_in_flight_is_not_offered_a_second_one(make_replicas):
    _, leader = _expansion_of_2_in_flight(make_replicas)

    assert leader.isr_expansion_candidate(2) is None
    leader.end_isr_expansion({2}, known=True)
    assert leader.isr_expansion_candidate(2) == frozenset({0, 1, 2})


def test_a_new_leadership_forgets_expansions_of_the_last_one(make_replicas):
    r, leader = _expansion_of_2_in_flight(make_replicas)

    r.elect(0, leader_epoch=2)
    r.produce(5)
    r.replicate(1)

    assert leader.log.high_watermark == 10
