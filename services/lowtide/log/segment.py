"""One log segment: ``<base>.log`` plus its sparse ``<base>.index`` and ``<base>.timeindex``.

``<base>.log`` is concatenated RecordBatch v2 batches (format: records.py), offsets increasing, the
first batch's base offset >= the segment's base offset (the file name, see filenames.py). There is
no per-file header: the batch CRCs make a torn tail detectable, and ``recover`` cuts it off.

Index files: index.py. They are derived data: missing, inconsistent or pointing past the end of the
.log, they are rebuilt by scanning the batch headers.

Every read of file data is ``os.pread`` on the segment's fd and every append is one ``os.write`` of
the whole (already validated, offset-assigned) buffer; batches are handled by their 61-byte headers
and records are never decoded except for timestamp lookups.

The fd is opened with the segment and given back while the segment sits unused
(``release_idle_file``, from the partition log's housekeeping): a replica of 10,000 idle partitions
then holds no descriptor for them, where it held one per segment (issue 48). The next use opens the
file again; the caller's lock makes that safe, as no other thread uses the segment meanwhile.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from lowtide.clock import now_ms
from lowtide.errors import KafkaStorageError, LowtideError
from lowtide.log import filenames
from lowtide.log.checkpoint import fsync
from lowtide.log.index import OffsetIndex, TimeIndex
from lowtide.record import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    BatchHeader,
    crc32c,
    decode_batch,
    read_header,
)

_OFFSET_AND_LENGTH = struct.Struct(">qi")
_SCAN_CHUNK = 1 << 20  # recovery reads the .log in 1 MiB windows, not one pread per batch
_MAX_RELATIVE_OFFSET = 0xFFFFFFFF
DEFAULT_MAX_MESSAGE_BYTES = 1048588


class LogSegment:
    """A segment of a partition log.

    Contract: ``append`` takes whole validated batches with offsets >= ``next_offset``; ``read``
    returns raw bytes; offsets in ``truncate_to`` are expected to be batch boundaries (a mid-batch
    offset drops the whole batch containing it, as Kafka does). ``size_bytes`` and ``next_offset``
    always describe the batches written so far.

    Not thread-safe: callers (PartitionLog) hold their lock around every call.
    """

    def __init__(
        self,
        *,
        dir: Path,
        base_offset: int,
        index_interval_bytes: int,
        fd: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
    ) -> None:
        self.dir = dir
        self._base_offset = base_offset
        self._index_interval_bytes = index_interval_bytes
        self._fd = fd
        self._closed = False
        # Set by every use of the fd; a housekeeping pass that finds it clear releases the fd.
        self._touched = True
        self.offset_index = offset_index
        self.time_index = time_index
        self._size = 0
        self._next_offset = base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = base_offset
        self._bytes_since_last_index_entry = 0
        # Like Kafka's LogSegment.created: wall clock when this object was made (also after a restart).
        self.created_ms = now_ms()

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def create(cls, dir: Path, base_offset: int, *, index_interval_bytes: int = 4096) -> LogSegment:
        """Create a new empty segment (any stale files with its name are emptied)."""
        log_name, index_name, time_name = filenames.segment_file_names(base_offset)
        for name in (log_name, index_name, time_name):
            (dir / name).unlink(missing_ok=True)
        return cls.open(dir, base_offset, index_interval_bytes=index_interval_bytes)

    @classmethod
    def open(
        cls,
        dir: Path,
        base_offset: int,
        *,
        index_interval_bytes: int = 4096,
        recover: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> LogSegment:
        """Open a segment, creating missing files; rebuild its indexes if they are missing or
        inconsistent. CRCs are only checked with ``recover=True`` (a full ``recover`` scan)."""
        log_name, index_name, time_name = filenames.segment_file_names(base_offset)
        indexes_existed = (dir / index_name).exists() and (dir / time_name).exists()
        try:
            fd = os.open(dir / log_name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open segment {dir / log_name}: {exc}") from exc
        rebuild = not indexes_existed
        try:
            offset_index = OffsetIndex.open(dir / index_name, base_offset=base_offset)
        except KafkaStorageError:
            (dir / index_name).unlink(missing_ok=True)
            offset_index = OffsetIndex.open(dir / index_name, base_offset=base_offset)
            rebuild = True
        try:
            time_index = TimeIndex.open(dir / time_name, base_offset=base_offset)
        except KafkaStorageError:
            (dir / time_name).unlink(missing_ok=True)
            time_index = TimeIndex.open(dir / time_name, base_offset=base_offset)
            rebuild = True
        segment = cls(
            dir=dir,
            base_offset=base_offset,
            index_interval_bytes=index_interval_bytes,
            fd=fd,
            offset_index=offset_index,
            time_index=time_index,
        )
        segment._size = os.fstat(fd).st_size
        last = offset_index.last_entry
        if last is not None and last[1] >= segment._size:
            rebuild = True
        # A missing/bad index or a tail that does not parse cleanly means the files were not closed
        # consistently: fall back to a full recovery scan (Kafka does the same).
        if recover or (rebuild and segment._size) or not segment._load_tail() or segment._time_index_overruns():
            segment.recover(max_message_bytes=max_message_bytes)
        return segment

    # -- properties -------------------------------------------------------------------------------

    @property
    def base_offset(self) -> int:
        return self._base_offset

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def next_offset(self) -> int:
        """Offset after the last batch; ``base_offset`` when the segment is empty."""
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch max timestamp in the segment, -1 when empty."""
        return self._max_timestamp

    @property
    def last_modified_ms(self) -> int:
        return int((os.fstat(self._fd) if self._fd >= 0 else os.stat(self.log_path)).st_mtime * 1000)

    @property
    def log_path(self) -> Path:
        return self.dir / filenames.log_file_name(self._base_offset)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, next_offset={self._next_offset}, size={self._size})"

    # -- writes -----------------------------------------------------------------------------------

    def append(self, buf: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        """Append validated batches (offsets already assigned) with one write; index per batch."""
        if not headers:
            return
        first, last = headers[0], headers[-1]
        if first.base_offset < self._next_offset:
            raise KafkaStorageError(
                f"append at offset {first.base_offset} to {self.log_path} whose next offset is {self._next_offset}"
            )
        if last.last_offset - self._base_offset > _MAX_RELATIVE_OFFSET:
            raise KafkaStorageError(f"offset {last.last_offset} does not fit segment {self.log_path}")
        position = self._size
        view = memoryview(buf)
        try:
            while view:
                written = os.write(self._file(), view)
                view = view[written:]
        except OSError as exc:
            # A partial write leaves a torn tail; cut it so the segment stays consistent.
            os.ftruncate(self._file(), position)
            raise KafkaStorageError(f"cannot append to {self.log_path}: {exc}") from exc
        for header in headers:
            self._index_batch(header, position)
            position += header.batch_length + LOG_OVERHEAD
        self._size = position
        self._next_offset = last.last_offset + 1

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        # Kafka's rule: update the max timestamp first, then add an index entry for this batch when
        # more than index_interval_bytes were appended since the last entry.
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.last_offset
        if self._bytes_since_last_index_entry > self._index_interval_bytes:
            self.offset_index.append(offset=header.last_offset, position=position)
            self.time_index.maybe_append(timestamp=self._max_timestamp, offset=self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.batch_length + LOG_OVERHEAD

    def truncate_to(self, offset: int) -> int:
        """Drop the batch containing ``offset`` and every later batch; return the bytes removed."""
        position = self.translate_offset(offset)
        if position is None:
            return 0
        removed = self._size - position
        os.ftruncate(self._file(), position)
        self._size = position
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to(offset)
        self._load_tail()
        return removed

    def seal(self) -> None:
        """Called when the segment stops being active: final time index entry, then fsync."""
        if self._max_timestamp != NO_TIMESTAMP:
            self.time_index.maybe_append(timestamp=self._max_timestamp, offset=self._offset_of_max_timestamp)
        self.flush()

    def flush(self) -> None:
        """fsync the log and both indexes."""
        fsync(self._file())
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.close()
        self.time_index.close()

    def delete(self) -> None:
        """Close and unlink the three files (missing files are fine)."""
        self.close()
        for name in filenames.segment_file_names(self._base_offset):
            (self.dir / name).unlink(missing_ok=True)

    def recycle(self, base_offset: int) -> None:
        """Become an empty segment at ``base_offset`` (> every offset in it) on the same files:
        truncate them, then rename them to the new base offset's names.

        Used when the log start offset passes the whole active segment: creating three new files
        costs 0.3-0.7 ms each on the benchmark machine, a truncate and a rename tens of
        microseconds. Crash-safe in any order: a half-renamed set is an empty segment, a stray
        index (removed on open) or an empty .log below the durable log start offset.
        """
        if base_offset < self._next_offset:
            raise KafkaStorageError(
                f"cannot recycle segment {self.dir / filenames.log_file_name(self._base_offset)} at "
                f"{base_offset}, below its next offset {self._next_offset}")
        os.ftruncate(self._file(), 0)
        self.offset_index.reset()
        self.time_index.reset()
        log_name, index_name, time_name = filenames.segment_file_names(base_offset)
        os.rename(self.dir / filenames.log_file_name(self._base_offset), self.dir / log_name)
        self.offset_index.rename(self.dir / index_name)
        self.time_index.rename(self.dir / time_name)
        self.offset_index.base_offset = self.time_index.base_offset = base_offset
        self._base_offset = self._next_offset = self._offset_of_max_timestamp = base_offset
        self._size = self._bytes_since_last_index_entry = 0
        self._max_timestamp = NO_TIMESTAMP
        self.created_ms = now_ms()

    def rename_to_deleted(self) -> list[Path]:
        """Close and rename the files to ``*.deleted`` (for delayed deletion); return the new paths."""
        self.close()
        renamed = []
        for name in filenames.segment_file_names(self._base_offset):
            source = self.dir / name
            target = self.dir / filenames.deleted_file_name(name)
            try:
                os.rename(source, target)
            except FileNotFoundError:
                continue
            renamed.append(target)
        return renamed

    # -- the file descriptor ----------------------------------------------------------------------

    def _file(self) -> int:
        """The .log's fd, opened again if it was released while the segment sat unused."""
        self._touched = True
        fd = self._fd
        if fd >= 0:
            return fd
        if self._closed:
            raise KafkaStorageError(f"segment {self.log_path} is closed")
        try:
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open segment {self.log_path}: {exc}") from exc
        return self._fd

    def release_idle_file(self) -> bool:
        """Close the fd if the segment was not used since the last call; True if it was closed.
        Nothing is lost: appends are already in the file (the page cache), a flush opens it again."""
        if self._touched:
            self._touched = False
            return False
        if self._fd < 0:
            return False
        os.close(self._fd)
        self._fd = -1
        return True

    @property
    def file_open(self) -> bool:
        return self._fd >= 0

    # -- reads ------------------------------------------------------------------------------------

    def read(self, position: int, max_bytes: int) -> bytes:
        """Raw bytes from ``position``, at most ``max_bytes``, never past the end of the segment."""
        length = min(max_bytes, self._size - position)
        if length <= 0:
            return b""
        return os.pread(self._file(), length, position)

    def read_batches(self, position: int, *, end_position: int, max_bytes: int) -> bytes:
        """Whole batches in [position, end_position): as many as fit in ``max_bytes``, but at least
        the first one even if it is larger (Kafka's minOneMessage)."""
        end_position = min(end_position, self._size)
        if position >= end_position:
            return b""
        first_size = self._read_batch_size(position)
        if first_size >= max_bytes or position + first_size >= end_position:
            return self.read(position, min(first_size, end_position - position))
        data = self.read(position, min(max_bytes, end_position - position))
        cut = 0
        length = len(data)
        while length - cut >= LOG_OVERHEAD:
            size = _OFFSET_AND_LENGTH.unpack_from(data, cut)[1] + LOG_OVERHEAD
            if cut + size > length:
                break
            cut += size
        return data if cut == length else data[:cut]

    def translate_offset(self, offset: int) -> int | None:
        """File position of the batch containing ``offset`` or of the first batch after it; None
        if ``offset`` >= next_offset."""
        if offset >= self._next_offset:
            return None
        position = self.offset_index.lookup(offset)
        while position < self._size:
            header = self._read_header_at(position)
            if header.last_offset >= offset:
                return position
            position += header.size_in_bytes
        return None

    def position_of_offset_bound(self, offset: int) -> int:
        """Position where batches holding offsets >= ``offset`` start (size_bytes if none): reads
        capped there never return an offset >= ``offset`` (for batch-aligned bounds like the HW)."""
        position = self.translate_offset(offset)
        return self._size if position is None else position

    def find_offset_by_timestamp(self, timestamp: int, *, starting_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp`` and offset >=
        ``starting_offset``, searching batches whose max timestamp >= ``timestamp``; None if none."""
        start = max(self.time_index.lookup(timestamp), starting_offset)
        position = self.offset_index.lookup(start)
        while position < self._size:
            header = self._read_header_at(position)
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                found = self._find_record(position, header, starting_offset, lambda ts: ts >= timestamp)
                if found is not None:
                    return found
            position += header.size_in_bytes
        return None

    def find_max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record carrying the segment's max timestamp."""
        if self._max_timestamp == NO_TIMESTAMP:
            return None
        position = self.translate_offset(self._offset_of_max_timestamp)
        if position is None:
            return None
        header = self._read_header_at(position)
        max_ts = self._max_timestamp
        return self._find_record(position, header, 0, lambda ts: ts == max_ts) or (
            header.last_offset,
            max_ts,
        )

    def _find_record(
        self, position: int, header: BatchHeader, starting_offset: int, predicate: Callable[[int], bool]
    ) -> tuple[int, int] | None:
        try:
            _, records = decode_batch(self.read(position, header.size_in_bytes))
        except LowtideError:
            # A codec lowtide cannot decode: answer at batch granularity, as Kafka did before v2.
            if header.last_offset >= starting_offset and predicate(header.max_timestamp):
                return max(header.base_offset, starting_offset), header.max_timestamp
            return None
        for record in records:
            if record.offset >= starting_offset and predicate(record.timestamp):
                return record.offset, record.timestamp
        return None

    def iter_headers(self, position: int = 0) -> Iterator[tuple[BatchHeader, int]]:
        """(header, position) of each batch from ``position`` (no CRC check)."""
        while position < self._size:
            header = self._read_header_at(position)
            yield header, position
            position += header.size_in_bytes

    def _read_header_at(self, position: int) -> BatchHeader:
        data = os.pread(self._file(), BATCH_HEADER_SIZE, position)
        try:
            return read_header(data)
        except LowtideError as exc:
            raise KafkaStorageError(f"{self.log_path} at position {position}: {exc}") from exc

    def _read_batch_size(self, position: int) -> int:
        data = os.pread(self._file(), LOG_OVERHEAD, position)
        if len(data) < LOG_OVERHEAD:
            raise KafkaStorageError(f"{self.log_path} at position {position}: truncated batch")
        length = _OFFSET_AND_LENGTH.unpack(data)[1]
        if length < MIN_BATCH_LENGTH:
            raise KafkaStorageError(f"{self.log_path} at position {position}: bad batch length {length}")
        return length + LOG_OVERHEAD

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> int:
        """Validate every batch (length, magic, CRC, increasing offsets), rebuild both indexes and
        truncate a torn tail (partial batch or bad CRC). Returns the number of bytes truncated.

        ``max_message_bytes`` is only a hint for read sizes: a complete batch with a valid CRC is kept
        even if larger, because a follower append or an older config may have written it.
        """
        file_size = os.fstat(self._file()).st_size
        self._reset_state()
        valid_end = 0
        chunk_size = max(_SCAN_CHUNK, min(max_message_bytes, 64 << 20))
        for header, position in self._scan_valid_batches(file_size, chunk_size):
            self._index_batch(header, position)
            self._next_offset = header.last_offset + 1
            valid_end = position + header.size_in_bytes
        self._size = valid_end
        truncated = file_size - valid_end
        if truncated:
            os.ftruncate(self._file(), valid_end)
        return truncated

    def _scan_valid_batches(self, file_size: int, chunk_size: int) -> Iterator[tuple[BatchHeader, int]]:
        # Reads the file in large windows and stops at the first batch that is incomplete, has a bad
        # header or CRC, or goes back in offsets: everything from there on is a torn tail.
        window = b""
        window_start = 0
        position = 0
        next_offset = self._base_offset
        while position < file_size:
            if position + BATCH_HEADER_SIZE > window_start + len(window):
                window = os.pread(self._file(), chunk_size, position)
                window_start = position
            try:
                header = read_header(window, position - window_start)
            except LowtideError:
                return
            end = position + header.size_in_bytes
            if end > file_size or header.base_offset < next_offset:
                return
            if header.last_offset - self._base_offset > _MAX_RELATIVE_OFFSET:
                return
            if end > window_start + len(window):
                window = os.pread(self._file(), max(chunk_size, header.size_in_bytes), position)
                window_start = position
            view = memoryview(window)
            rel = position - window_start
            if crc32c(view[rel + 21 : rel + header.size_in_bytes]) != header.crc:
                return
            yield header, position
            next_offset = header.last_offset + 1
            position = end

    def _time_index_overruns(self) -> bool:
        last = self.time_index.last_entry
        return last is not None and last[1] >= self._next_offset

    def _reset_state(self) -> None:
        self.offset_index.reset()
        self.time_index.reset()
        self._next_offset = self._base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = self._base_offset
        self._bytes_since_last_index_entry = 0

    def _load_tail(self) -> bool:
        """Restore next offset and max timestamp without a full scan; False if the tail is torn.

        The time index's last entry covers everything up to it; the batches after the last offset
        index entry are scanned by header.
        """
        last_time = self.time_index.last_entry
        if last_time is not None:
            self._max_timestamp, self._offset_of_max_timestamp = last_time
        else:
            self._max_timestamp, self._offset_of_max_timestamp = NO_TIMESTAMP, self._base_offset
        last_index = self.offset_index.last_entry
        start = last_index[1] if last_index is not None else 0
        self._next_offset = self._base_offset
        position = start
        try:
            while position < self._size:
                header = self._read_header_at(position)
                if header.max_timestamp > self._max_timestamp:
                    self._max_timestamp = header.max_timestamp
                    self._offset_of_max_timestamp = header.last_offset
                self._next_offset = header.last_offset + 1
                position += header.size_in_bytes
        except KafkaStorageError:
            return False
        self._bytes_since_last_index_entry = self._size - start
        return position == self._size
