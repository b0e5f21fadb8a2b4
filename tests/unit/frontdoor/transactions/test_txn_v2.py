"""KIP-890's EndTxn rules (``frontdoor/transactions/txn_v2.py``), as pure decisions on a state: the
table of its module docstring, cell by cell, the epoch overflow, and the fencing bump."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lowtide.errors import InvalidProducerIdMapping, InvalidTxnState, ProducerFenced
from lowtide.frontdoor.transactions.txn_v2 import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    MAX_EPOCH,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    answer_of,
    completed,
    decide_end_txn,
    fenced_epoch,
)
from lowtide.messages.admin import TRANSACTION_VERSION_2, TxnState

PID, EPOCH, NEW_PID = 40, 7, 41
BASE = TxnState(transactional_id="tx", producer_id=PID, producer_epoch=EPOCH, partitions=frozenset({("t", 0)}),
                start_ms=100, transaction_version=TRANSACTION_VERSION_2)


def no_new_id() -> int:
    raise AssertionError("a producer id was taken without an epoch overflow")


def decide(st: TxnState, *, epoch: int, commit: bool, producer_id: int = PID) -> TxnState:
    return decide_end_txn(st, producer_id=producer_id, producer_epoch=epoch, commit=commit,
                          new_producer_id=no_new_id, now_ms=500)


@pytest.mark.parametrize("commit", [True, False])
def test_ending_an_ongoing_transaction_prepares_it_with_the_epoch_bumped(commit):
    got = decide(replace(BASE, state=ONGOING), epoch=EPOCH, commit=commit)
    assert got.state == (PREPARE_COMMIT if commit else PREPARE_ABORT)
    assert (got.producer_id, got.producer_epoch, got.next_producer_id) == (PID, EPOCH + 1, -1)
    assert got.partitions == BASE.partitions and got.transaction_version == TRANSACTION_VERSION_2
    assert answer_of(got) == (PID, EPOCH + 1)


# (state stored at EPOCH, commit?, the request's epoch) -> "prepare" | "done" | "complete" | error
CELLS = [
    (EMPTY, True, EPOCH - 1, ProducerFenced), (EMPTY, True, EPOCH, InvalidTxnState),
    (EMPTY, False, EPOCH - 1, ProducerFenced), (EMPTY, False, EPOCH, "prepare"),
    (COMPLETE_COMMIT, True, EPOCH - 1, "done"), (COMPLETE_COMMIT, True, EPOCH, InvalidTxnState),
    (COMPLETE_COMMIT, False, EPOCH - 1, InvalidTxnState), (COMPLETE_COMMIT, False, EPOCH, "prepare"),
    (COMPLETE_ABORT, True, EPOCH - 1, InvalidTxnState), (COMPLETE_ABORT, True, EPOCH, InvalidTxnState),
    (COMPLETE_ABORT, False, EPOCH - 1, "done"), (COMPLETE_ABORT, False, EPOCH, "prepare"),
    (PREPARE_COMMIT, True, EPOCH - 1, "complete"), (PREPARE_COMMIT, True, EPOCH, ProducerFenced),
    (PREPARE_COMMIT, False, EPOCH - 1, InvalidTxnState), (PREPARE_COMMIT, False, EPOCH, ProducerFenced),
    (PREPARE_ABORT, True, EPOCH - 1, InvalidTxnState), (PREPARE_ABORT, True, EPOCH, ProducerFenced),
    (PREPARE_ABORT, False, EPOCH - 1, "complete"), (PREPARE_ABORT, False, EPOCH, ProducerFenced),
    (ONGOING, True, EPOCH - 1, ProducerFenced), (ONGOING, False, EPOCH + 1, ProducerFenced),
    (COMPLETE_COMMIT, True, EPOCH - 2, ProducerFenced), (COMPLETE_ABORT, False, EPOCH + 1, ProducerFenced),
]


@pytest.mark.parametrize(("state", "commit", "epoch", "want"), CELLS)
def test_each_cell_of_the_end_txn_table(state, commit, epoch, want):
    st = replace(BASE, state=state, partitions=frozenset() if state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)
                 else BASE.partitions)
    if isinstance(want, type):
        with pytest.raises(want):
            decide(st, epoch=epoch, commit=commit)
        return
    got = decide(st, epoch=epoch, commit=commit)
    if want == "prepare":
        # An abort no partition reached: the epoch is bumped all the same (no marker to write).
        assert (got.state, got.producer_epoch, got.partitions, got.start_ms) == (PREPARE_ABORT, EPOCH + 1,
                                                                                 frozenset(), 500)
    else:  # "done": nothing to write; "complete": the Prepare* of this very EndTxn, to finish
        assert got is st
        assert answer_of(got) == (PID, EPOCH)


def test_another_producer_id_is_invalid_producer_id_mapping_and_no_state_is_too():
    with pytest.raises(InvalidProducerIdMapping):
        decide(replace(BASE, state=ONGOING), epoch=EPOCH, commit=True, producer_id=PID + 5)
    with pytest.raises(InvalidProducerIdMapping):
        decide_end_txn(None, producer_id=PID, producer_epoch=0, commit=True, new_producer_id=no_new_id, now_ms=0)


def test_the_last_epoch_takes_a_new_producer_id_which_completing_hands_over_at_epoch_0():
    taken = []

    def new_id() -> int:
        taken.append(NEW_PID)
        return NEW_PID

    st = replace(BASE, state=ONGOING, producer_epoch=MAX_EPOCH - 1)
    prepared = decide_end_txn(st, producer_id=PID, producer_epoch=MAX_EPOCH - 1, commit=True,
                              new_producer_id=new_id, now_ms=500)
    # The markers carry the old id at MAX_EPOCH; the producer gets the new id at 0.
    assert (prepared.producer_id, prepared.producer_epoch, prepared.next_producer_id) == (PID, MAX_EPOCH, NEW_PID)
    assert answer_of(prepared) == (NEW_PID, 0) and taken == [NEW_PID]
    done = completed(prepared)
    assert (done.state, done.producer_id, done.producer_epoch, done.previous_producer_id, done.next_producer_id,
            done.partitions) == (COMPLETE_COMMIT, NEW_PID, 0, PID, -1, frozenset())
    # The EndTxn asked again with the old id and epoch is that one, answered with the new id.
    again = decide(done, epoch=MAX_EPOCH - 1, commit=True)
    assert again is done and answer_of(again) == (NEW_PID, 0)
    with pytest.raises(InvalidTxnState):
        decide(done, epoch=MAX_EPOCH - 1, commit=False)


def test_fencing_bumps_twice_in_version_2_once_in_version_1_and_never_past_the_last_epoch():
    assert fenced_epoch(BASE) == EPOCH + 2
    assert fenced_epoch(replace(BASE, transaction_version=0)) == EPOCH + 1
    assert fenced_epoch(replace(BASE, producer_epoch=MAX_EPOCH - 1)) == MAX_EPOCH
    # The fenced producer's own EndTxn, one below the fence's first bump, is no retry of anything.
    fenced = replace(BASE, state=COMPLETE_ABORT, producer_epoch=fenced_epoch(BASE), partitions=frozenset())
    with pytest.raises(ProducerFenced):
        decide(fenced, epoch=EPOCH, commit=False)


def test_completing_keeps_the_epoch_and_empties_the_partitions():
    done = completed(replace(BASE, state=PREPARE_ABORT, producer_epoch=EPOCH + 1))
    assert (done.state, done.producer_id, done.producer_epoch, done.partitions) == (COMPLETE_ABORT, PID, EPOCH + 1,
                                                                                   frozenset())
