"""The writer of a coordinator shard's SQLite state: applies replicated metadata records, in a
process of its own (the default) or on a thread of the shard's process.

Why a process: a shard is one Python process, and under CommitFile load its threads (gRPC, the
checks, the appends, the apply) share one GIL; the apply was the largest share (2-3 ms of CPU per
100-batch file, SQLite plus the Python feeding it). In a process of its own it runs on the other
core, and the shard keeps only the check, the appends and the answers. The shard still reads the
database (FindBatches, ListOffsets, the checks' cache misses) through a connection of its own:
WAL mode lets one process write while others read.

Caches: a ``CoordinatorState`` caches the partition and producer rows every check reads, written
through by its applies. The shard's reading copy cannot see the applier's writes, so each apply
answers with what it did to its own caches (``state.CacheChanges``), and the shard mirrors them
before it drops the records from its pending overlay: from then on its cached rows are the
committed ones. A failed apply rolls back and drops the applier's caches; the shard then reloads
and drops its own.

Pipe protocol (the child's stdin and a duplicate of its stdout; stdout itself is pointed at stderr,
so nothing but frames reaches the pipe)::

    frame    = length uint32 big-endian | pickle (protocol 5) of a tuple
    requests   ("apply", [(record value bytes, metadata offset), ...], contiguous: bool)
    replies    ("ready", applied offset)                   once, when the database is open
               ("ok", records applied, applied offset, CacheChanges)
               ("error", exception class name, message)    the transaction was rolled back
    EOF on stdin: close the database and exit (the shard stopped, or died: the child never
    outlives it by more than a read).

The child is ``python -m lowtide.coordinator.applier --db PATH --shard K``; it runs WAL checkpoints
on a thread of its own after applies (``CoordinatorState.checkpoint``), and restarts the WAL
between transactions once it is large (``restart_wal``).
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

from lowtide.common.gc_tuning import young_collections_less_often
from lowtide.common.logs import JsonFormatter, configure_logging
from lowtide.coordinator.records import MetadataRecord, decode_entry
from lowtide.coordinator.state import CacheChanges, CoordinatorState
from lowtide.errors import KafkaStorageError, RequestTimedOut

log = logging.getLogger(__name__)

FRAME = struct.Struct(">I")
# 1 s, not 0.1 s: at 200 files/s a checkpoint every 0.1 s copied each partition's last index page
# every ~16 files and cost ~180 us of the applier's CPU per file; every 1 s, ~45 us (in-process,
# /tmp/cf/micro2.py). The WAL then holds about a second of commits (~4,000 1 KiB pages at that
# rate), far below ``WAL_RESTART_PAGES``.
CHECKPOINT_INTERVAL_S = 1.0
PROCESS, THREAD = "process", "thread"
APPLIER_KINDS = (PROCESS, THREAD)


class ApplyResult(NamedTuple):
    applied: int           # records new to the state
    applied_offset: int    # the state's applied metadata offset after the transaction
    changes: CacheChanges  # what the transaction did to the writer's cached rows


class Applier(Protocol):
    def apply(self, entries: Sequence[tuple[bytes, int]], *, records: Sequence[MetadataRecord] | None = None,
              epochs: Sequence[int] | None = None, contiguous: bool = False) -> ApplyResult: ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...


class ApplyWorker:
    """Applies to a ``CoordinatorState`` it owns, one transaction per call, and checkpoints its
    WAL on a background thread. Used by the child process and by ``ThreadApplier``.
    Thread-safety: ``apply`` from one thread at a time."""

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self._applied = threading.Event()
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, daemon=True,
                                              name=f"coordinator-{state.coordinator_id}-checkpointer")
        self._checkpointer.start()

    def apply(self, entries: Sequence[tuple[bytes, int]], *, records: Sequence[MetadataRecord] | None = None,
              epochs: Sequence[int] | None = None, contiguous: bool = False) -> ApplyResult:
        """Apply ``entries`` (record values at their metadata offsets, log order) in one
        transaction; ``records`` are their decoded values when the caller has them, with their
        coordinator ``epochs`` (else each value's epoch is read from it). With
        ``contiguous`` the first new offset must follow the applied one: a group behind a failed
        apply must not leave a hole in the state."""
        state = self.state
        applied = state.applied_offset
        if contiguous:
            fresh = [o for _, o in entries if o > applied]
            if fresh and fresh[0] != applied + 1:
                raise RequestTimedOut(f"coordinator {state.coordinator_id}: metadata offsets from {fresh[0]} follow "
                                      f"a failed apply (applied {applied})")
        if records is not None:
            count = state.apply_all(zip(records, (o for _, o in entries), epochs or [0] * len(entries), strict=True))
        else:
            count = state.apply_all((record, offset, value_epoch) for (value_epoch, record), (_, offset)
                                    in zip(map(decode_entry, (v for v, _ in entries)), entries, strict=True))
        changes = state.take_cache_changes()
        self._applied.set()
        try:
            state.restart_wal()
        except Exception as exc:  # noqa: BLE001 - the WAL only grows meanwhile; retried next apply
            log.warning("WAL restart failed", extra={"fields": {"error": str(exc)}})
        return ApplyResult(count, max(applied, entries[-1][1]) if count else applied, changes)

    def _checkpoint_loop(self) -> None:
        """A background checkpoint after an apply, at most every ``CHECKPOINT_INTERVAL_S``: each
        copies every page the commits since the last one touched and fsyncs, so spaced out, a page
        many commits rewrite (a partition's last index page) is copied once."""
        while not self._stop.is_set():
            if not self._applied.wait(1.0):
                continue
            self._applied.clear()
            try:
                self.state.checkpoint()
            except Exception as exc:  # noqa: BLE001 - retried after the next apply; commits go on
                if not self._stop.is_set():
                    log.warning("WAL checkpoint failed", extra={"fields": {"error": str(exc)}})
            self._stop.wait(CHECKPOINT_INTERVAL_S)

    def close(self) -> None:
        self._stop.set()
        self._applied.set()
        self._checkpointer.join(timeout=5)
        self.state.close()


class ThreadApplier:
    """The applier on the caller's thread, over a ``CoordinatorState`` of its own (the same
    interface as ``ProcessApplier``, without the pipe): ``--applier thread``."""

    def __init__(self, *, db_path: Path, shard: int) -> None:
        self._worker = ApplyWorker(CoordinatorState(db_path, coordinator_id=shard, background_checkpoints=True))
        self._lock = threading.Lock()

    def apply(self, entries: Sequence[tuple[bytes, int]], *, records: Sequence[MetadataRecord] | None = None,
              epochs: Sequence[int] | None = None, contiguous: bool = False) -> ApplyResult:
        with self._lock:
            return self._worker.apply(entries, records=records, epochs=epochs, contiguous=contiguous)

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._worker.close()


def _write_frame(out: BinaryIO, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=5)
    out.write(FRAME.pack(len(payload)) + payload)
    out.flush()


def _read_frame(source: BinaryIO) -> tuple | None:
    """The next frame, or None at EOF."""
    header = source.read(FRAME.size)
    if len(header) < FRAME.size:
        return None
    size = FRAME.unpack(header)[0]
    payload = source.read(size)
    if len(payload) < size:
        return None
    return pickle.loads(payload)  # noqa: S301 - our own child process's frames


class ProcessApplier:
    """The applier in a child process (``python -m lowtide.coordinator.applier``), one request at
    a time over its pipes. Contract: ``apply`` returns once the child has committed the
    transaction; a child that died or answered an error raises (the shard then reloads, and
    ``alive`` tells it to start a new one). Thread-safety: every method may be called from any
    thread; requests are serialised."""

    def __init__(self, *, db_path: Path, shard: int, nice: int = 0) -> None:
        import lowtide

        package_root = str(Path(lowtide.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        root = logging.getLogger()
        # The child logs as the shard does (configure_logging's formats).
        fmt = "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
        self.shard = shard
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lowtide.coordinator.applier", "--db", str(db_path), "--shard", str(shard),
             "--log-level", logging.getLevelName(root.getEffectiveLevel()), "--log-format", fmt, "--nice", str(nice)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        ready = self._receive()
        if ready[0] != "ready":
            self.close()
            raise KafkaStorageError(f"coordinator {shard}: the applier process answered {ready[0]!r} at start")

    def _receive(self) -> tuple:
        reply = _read_frame(self._proc.stdout)
        if reply is None:
            code = self._proc.wait(timeout=5)
            raise KafkaStorageError(f"coordinator {self.shard}: the applier process exited (code {code})")
        return reply

    def apply(self, entries: Sequence[tuple[bytes, int]], *, records: Sequence[MetadataRecord] | None = None,
              epochs: Sequence[int] | None = None, contiguous: bool = False) -> ApplyResult:
        # ``records`` and ``epochs`` stay here: the child decodes the values, epochs included.
        with self._lock:
            try:
                _write_frame(self._proc.stdin, ("apply", list(entries), contiguous))
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise KafkaStorageError(f"coordinator {self.shard}: the applier process is gone: {exc}") from None
            reply = self._receive()
        if reply[0] == "ok":
            return ApplyResult(reply[1], reply[2], reply[3])
        if reply[0] == "error" and reply[1] == RequestTimedOut.__name__:
            raise RequestTimedOut(reply[2])
        raise KafkaStorageError(f"coordinator {self.shard}: applying metadata records failed: {reply[1]}: {reply[2]}")

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        """Close its stdin (the child closes the database and exits) and wait for it."""
        with self._lock:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()


def open_applier(kind: str, *, db_path: Path, shard: int, nice: int = 0) -> Applier:
    """An applier of ``kind``; ``nice``: the child process's niceness (``ProcessApplier`` only)."""
    if kind == PROCESS:
        return ProcessApplier(db_path=db_path, shard=shard, nice=nice)
    if kind == THREAD:
        return ThreadApplier(db_path=db_path, shard=shard)
    raise ValueError(f"applier must be one of {APPLIER_KINDS}, got {kind!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """The child: open the database, answer ``ready``, then apply until stdin ends."""
    parser = argparse.ArgumentParser(prog="python -m lowtide.coordinator.applier")
    parser.add_argument("--db", required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", default="json")
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args(argv)
    if args.nice:
        # Below the shard and the replicas: the apply is off every request's path (answers go out
        # when replicated), so its bursts of work should take a core only when nothing on a
        # request's path wants it (docs/design/diskless.md#cost-per-commit).
        os.nice(args.nice)
    configure_logging(service=f"coordinator-{args.shard}-applier", level=args.log_level, fmt=args.log_format)
    # The shard stops us by closing our stdin; a Ctrl-C meant for a foreground cluster is its to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the frames
    source = sys.stdin.buffer
    worker = ApplyWorker(CoordinatorState(Path(args.db), coordinator_id=args.shard, background_checkpoints=True))
    young_collections_less_often()  # each apply makes a few thousand short-lived tuples
    try:
        _write_frame(replies, ("ready", worker.state.applied_offset))
        while (request := _read_frame(source)) is not None:
            _kind, entries, contiguous = request
            try:
                result = worker.apply(entries, contiguous=contiguous)
            except Exception as exc:  # noqa: BLE001 - rolled back; the shard decides (it reloads)
                log.warning("apply failed", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
                _write_frame(replies, ("error", type(exc).__name__, str(exc)))
                continue
            _write_frame(replies, ("ok", result.applied, result.applied_offset, result.changes))
    except BrokenPipeError:
        pass  # the shard is gone
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
