"""Transactions (KIP-98) on a diskless coordinator shard: per partition, the ongoing transactions,
the last stable offset and the aborted transactions, as Kafka's ``ProducerStateManager`` and
transaction index keep them for a classic partition's log (docs/design/diskless.md#transactions).

Tables (in the shard's SQLite state, coordinator.state, so replicated through the metadata log,
snapshotted and restored with the rest; added in issue 50, ``CREATE ... IF NOT EXISTS``: a state
or snapshot of an older version opens with them empty, which is what its log, holding no
transactional batch, makes of them)::

    txns          (partition_key, producer_id) PK | producer_epoch | first_offset
                  one row per ongoing transaction: the offset of its first batch in the partition
                  index (partition_key, first_offset): the last stable offset is its minimum
    aborted_txns  (partition_key, last_offset) PK | producer_id | first_offset
                  one row per aborted transaction: first_offset = its first batch, last_offset =
                  its ABORT marker's offset (Kafka's AbortedTxn, minus the LSO it never needs here)

What moves them, all in the apply of a FileCommitted record (type 8: records.py) whose batches
carry a kind (messages.coordinator TXN_*), in batch order:

    TXN_DATA    no row for (partition, producer): insert one, first_offset = the batch's offset
    TXN_COMMIT  delete the producer's row
    TXN_ABORT   delete the producer's row; insert (marker offset, producer, its first_offset)

A RecordsDeleted drops the aborted rows wholly below the new log start offset (Kafka deletes its
transaction index with the segments); a TopicDeleted drops every row of the topic. Only accepted
batches reach a record: a marker the check found nothing to end (a retry) is not in it.

The last stable offset (LSO) of a partition = min(first_offset of its txns rows), else its high
watermark. A READ_COMMITTED FindBatches returns batches below the LSO only (a transaction's first
offset is a batch's base offset, so no batch straddles it) and the aborted rows overlapping them:
last_offset >= the fetch offset and first_offset < the end of what is returned.

Thread-safety: plain functions over the cursor or connection the caller owns (the state's writer
inside its transaction, or a reader).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from lowtide.messages.coordinator import TXN_ABORT, TXN_DATA

TXN_SCHEMA = """
CREATE TABLE IF NOT EXISTS txns (
    partition_key INTEGER NOT NULL,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    PRIMARY KEY (partition_key, producer_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS txns_by_first_offset ON txns (partition_key, first_offset);
CREATE TABLE IF NOT EXISTS aborted_txns (
    partition_key INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    producer_id INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    PRIMARY KEY (partition_key, last_offset)
) WITHOUT ROWID;
"""

TXN_TABLES = ("txns", "aborted_txns")

Db = sqlite3.Cursor | sqlite3.Connection


def apply_txn_batches(cur: sqlite3.Cursor, batches: Iterable[tuple[int, int, int, int, int, int]]) -> None:
    """Apply one file's transactional batches: (kind, partition_key, producer_id, producer_epoch,
    base_offset, last_offset), in batch order (module doc: what each kind does)."""
    for kind, pk, pid, epoch, base, last in batches:
        if kind == TXN_DATA:
            cur.execute("INSERT OR IGNORE INTO txns (partition_key, producer_id, producer_epoch, first_offset) "
                        "VALUES (?, ?, ?, ?)", (pk, pid, epoch, base))
            continue
        row = cur.execute("SELECT first_offset FROM txns WHERE partition_key = ? AND producer_id = ?",
                          (pk, pid)).fetchone()
        if row is None:
            continue  # the check accepts a marker only for an ongoing transaction; kept total anyway
        cur.execute("DELETE FROM txns WHERE partition_key = ? AND producer_id = ?", (pk, pid))
        if kind == TXN_ABORT:
            cur.execute("INSERT OR REPLACE INTO aborted_txns (partition_key, last_offset, producer_id, first_offset) "
                        "VALUES (?, ?, ?, ?)", (pk, last, pid, row[0]))


def drop_aborted_below(cur: sqlite3.Cursor, partition_key: int, log_start_offset: int) -> None:
    """DeleteRecords moved the log start offset: aborted transactions wholly below it go."""
    cur.execute("DELETE FROM aborted_txns WHERE partition_key = ? AND last_offset < ?",
                (partition_key, log_start_offset))


def drop_partition(cur: sqlite3.Cursor, partition_key: int) -> None:
    """The partition's topic is deleted: its transactions go with it."""
    cur.execute("DELETE FROM txns WHERE partition_key = ?", (partition_key,))
    cur.execute("DELETE FROM aborted_txns WHERE partition_key = ?", (partition_key,))


def ongoing_first_offset(db: Db, partition_key: int, producer_id: int) -> int | None:
    """The first offset of the producer's ongoing transaction in the partition, or None."""
    row = db.execute("SELECT first_offset FROM txns WHERE partition_key = ? AND producer_id = ?",
                     (partition_key, producer_id)).fetchone()
    return None if row is None else row[0]


def any_ongoing(db: Db) -> bool:
    """Whether any partition of the shard has an ongoing transaction."""
    return db.execute("SELECT 1 FROM txns LIMIT 1").fetchone() is not None


def last_stable_offset(db: Db, partition_key: int, high_watermark: int) -> int:
    """The first offset of the partition's oldest ongoing transaction, else the high watermark."""
    row = db.execute("SELECT min(first_offset) FROM txns WHERE partition_key = ?", (partition_key,)).fetchone()
    return high_watermark if row is None or row[0] is None else min(row[0], high_watermark)


def aborted_between(db: Db, partition_key: int, start: int, end: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions overlapping offsets [start, end),
    oldest first: what a READ_COMMITTED fetch of that range needs to drop their batches."""
    return db.execute("SELECT producer_id, first_offset FROM aborted_txns WHERE partition_key = ? "
                      "AND last_offset >= ? AND first_offset < ? ORDER BY first_offset",
                      (partition_key, start, end)).fetchall()
