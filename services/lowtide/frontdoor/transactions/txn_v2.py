"""The transaction states' names and KIP-890's transactions version 2 rules, for the coordinator
(``transactions.py``), which loads a state, asks these functions what EndTxn does to it, and
writes what they answer.

Version 1 (KIP-98): a producer keeps its epoch across transactions; EndTxn writes the markers
with it. Version 2 (KIP-890 part 2, EndTxn v5): every EndTxn, commit or abort, bumps the epoch.
The Prepare* state is saved with the bumped epoch (before any marker), the markers carry it, and
the EndTxn answer hands it to the producer, which starts its next transaction there, sequences
from 0. So a produce or TxnOffsetCommit of a transaction already ended carries an epoch the
replicas and the coordinator fence, however late it arrives.

EndTxn in version 2, on the stored state (Kafka's table; "retry": the request's epoch is the
stored one minus 1, i.e. the EndTxn that bumped it is asked again; "current": the stored epoch)::

    state            commit, retry   commit, current   abort, retry   abort, current
    Ongoing          -               prepare commit    -              prepare abort
    Empty            PRODUCER_FENCED INVALID_TXN_STATE PRODUCER_FENCED prepare abort (no partitions)
    CompleteCommit   done            INVALID_TXN_STATE INVALID_TXN_STATE prepare abort (no partitions)
    CompleteAbort    INVALID_TXN_STATE INVALID_TXN_STATE done         prepare abort (no partitions)
    PrepareCommit    complete it     PRODUCER_FENCED   INVALID_TXN_STATE PRODUCER_FENCED
    PrepareAbort     INVALID_TXN_STATE PRODUCER_FENCED complete it    PRODUCER_FENCED

(Kafka answers a retry in Prepare* CONCURRENT_TRANSACTIONS while its marker channel works; here
the call that finds it completes it, as version 1 does.) Any other epoch is PRODUCER_FENCED;
another producer id is INVALID_PRODUCER_ID_MAPPING.

Epoch overflow: a producer's epoch never reaches MAX_EPOCH (32767) in its hands, so the
coordinator can always fence it. A prepare from epoch MAX_EPOCH - 1 takes a new producer id into
the Prepare* state (``next_producer_id``: persisted, so whoever completes the state after a crash
hands out the same one); the markers carry the old id at MAX_EPOCH, and the Complete* state
holds the new id at epoch 0 with the old one as ``previous_producer_id``, whose EndTxn retry (old
id, MAX_EPOCH - 1) is answered with the new id.

Fencing (a timed-out transaction, or InitProducerId from a new instance): the epoch goes up by 2
in version 2 (Kafka's PrepareEpochFence, then the abort's own bump), so the fenced producer's
EndTxn, one below the abort's epoch only in version 1, never passes for a retry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lowtide.errors import InvalidProducerIdMapping, InvalidTxnState, ProducerFenced
from lowtide.messages.admin import TRANSACTION_VERSION_2, TxnState

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
MAX_EPOCH = 32767


def is_version_2(st: TxnState) -> bool:
    return st.transaction_version >= TRANSACTION_VERSION_2


def answer_of(st: TxnState) -> tuple[int, int]:
    """The (producer id, epoch) the producer continues with once ``st`` (a Prepare* or Complete*
    state) is complete."""
    if st.next_producer_id >= 0:
        return st.next_producer_id, 0
    return st.producer_id, st.producer_epoch


def completed(st: TxnState) -> TxnState:
    """The Complete* state of the Prepare* state ``st``: no partitions; a new producer id taken
    at the prepare (epoch overflow) becomes the producer's, at epoch 0."""
    done = replace(st, state=COMPLETE_COMMIT if st.state == PREPARE_COMMIT else COMPLETE_ABORT,
                   partitions=frozenset())
    if st.next_producer_id >= 0:
        done = replace(done, producer_id=st.next_producer_id, producer_epoch=0, next_producer_id=-1,
                       previous_producer_id=st.producer_id)
    return done


def fenced_epoch(st: TxnState) -> int:
    """The epoch of the abort that fences ``st``'s producer (module docstring)."""
    step = 2 if is_version_2(st) else 1
    return min(st.producer_epoch + step, MAX_EPOCH)


def decide_end_txn(st: TxnState | None, *, producer_id: int, producer_epoch: int, commit: bool,
                   new_producer_id: Callable[[], int], now_ms: int) -> TxnState:
    """What EndTxn v5 does to ``st`` (module docstring's table). Returns the Prepare* state to
    save and complete (the bumped one, or ``st`` itself when it is the Prepare* of this EndTxn
    asked again), or the Complete* state ``st`` when the EndTxn already finished (nothing to
    write: answer ``answer_of`` it). Raises the table's errors; nothing is written then.
    ``new_producer_id`` is called only when the epoch overflows."""
    if st is None:
        raise InvalidProducerIdMapping(f"producer id {producer_id} has no transactional state")
    retry_on_bump = st.producer_id == producer_id and st.producer_epoch == producer_epoch + 1
    retry_on_overflow = (st.previous_producer_id == producer_id != st.producer_id
                         and producer_epoch == MAX_EPOCH - 1 and st.producer_epoch == 0)
    if st.producer_id != producer_id and not retry_on_overflow:
        raise InvalidProducerIdMapping(f"producer id {producer_id} is not the one of {st.transactional_id!r}")
    current = producer_epoch == st.producer_epoch and st.producer_id == producer_id
    if st.state in (ONGOING, EMPTY):
        valid = current
    elif st.state in (PREPARE_COMMIT, PREPARE_ABORT):
        valid = retry_on_bump
    else:
        valid = retry_on_bump or retry_on_overflow or current
    if not valid:
        raise ProducerFenced(f"producer epoch {producer_epoch} of {st.transactional_id!r} is not the current "
                             f"epoch {st.producer_epoch} ({st.state}) nor its EndTxn retried")
    retry = retry_on_bump or retry_on_overflow
    prepare = PREPARE_COMMIT if commit else PREPARE_ABORT
    finished = COMPLETE_COMMIT if commit else COMPLETE_ABORT
    if st.state == ONGOING:
        return _prepared(st, state=prepare, new_producer_id=new_producer_id, now_ms=now_ms)
    if retry and st.state in (prepare, finished):
        return st
    if not commit and not retry and st.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
        # A version-2 producer may abort a transaction no partition reached (its produce failed
        # before the implicit add): the epoch is bumped all the same, fencing what it sent.
        return _prepared(replace(st, partitions=frozenset(), start_ms=now_ms), state=prepare,
                         new_producer_id=new_producer_id, now_ms=now_ms)
    raise InvalidTxnState(f"cannot {'commit' if commit else 'abort'} the transaction of {st.transactional_id!r}: "
                          f"it is {st.state}")


def _prepared(st: TxnState, *, state: str, new_producer_id: Callable[[], int], now_ms: int) -> TxnState:
    """``st`` moved to the Prepare* ``state`` with its epoch bumped (a new producer id taken when
    the bumped epoch is the last one)."""
    epoch = st.producer_epoch + 1
    next_id = new_producer_id() if epoch >= MAX_EPOCH else -1
    return replace(st, state=state, producer_epoch=epoch, next_producer_id=next_id,
                   transaction_version=TRANSACTION_VERSION_2,
                   start_ms=st.start_ms if st.start_ms >= 0 else now_ms)
