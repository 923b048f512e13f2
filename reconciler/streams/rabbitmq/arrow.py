"""Records of delivered chunks into Arrow batches of ``RECORD_SCHEMA``.

``chunk_arrays`` is the measured fast path: a chunk of at least ``VECTOR_MIN_RECORDS``
messages of one common shape is cut out with numpy, keys and values as slices of the
chunk's own buffer. Smaller or odd chunks go through ``amqp.decode_chunk`` into lists,
chunks with sub-entry batches through ``codecs.chunk_entries``.
``Columns`` collects both kinds and cuts batches of at most the rows the reader asks
for and about ``MAX_BATCH_BYTES``: chunks are decoded as batches are taken, one
sub-entry at a time, so what is held is about one sub-entry and one batch, however far
a chunk's sub-entries inflate. The records of an entry that cannot be decoded are
collected apart, as dead letters (``DEAD_LETTER_SCHEMA``: one per offset, the reason
naming the entry's offset range; the entry's bytes at its first offset only, so the
same offsets give the same rows wherever a range boundary cuts the entry).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rstream import schema

from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.rabbitmq.amqp import U32, decode_chunk, decode_message
from reconciler.streams.rabbitmq.codecs import Undecodable, chunk_entries

log = logging.getLogger(__name__)

VECTOR_MIN_RECORDS = 32  # chunks at least this large are cut out with numpy
MAX_BATCH_BYTES = 64 * 1024 * 1024  # keys and values of one batch, about (one entry more at most)


def _walk(data: bytes, num_entries: int, hi: int) -> np.ndarray | None:
    """Entry boundaries ``[e0, e1, ..., e_hi]`` of a chunk of simple entries; None for
    sub-entry batches or sizes that do not fit the data."""
    bounds = [0] * (hi + 1)
    pos = 0
    u32 = U32
    for i in range(min(num_entries, hi)):
        bounds[i] = pos
        size = u32(data, pos)[0]
        if size & 0x80000000:  # a sub-entry batch's type byte
            return None
        pos += 4 + size
    bounds[hi] = pos
    if pos > len(data):
        return None
    return np.asarray(bounds, dtype=np.int64)


_PAD = bytes(512)  # indexes computed from one length byte stay inside data + padding


def _u32_at(a: np.ndarray, p: np.ndarray) -> np.ndarray:
    return (
        (a[p].astype(np.int64) << 24)
        | (a[p + 1].astype(np.int64) << 16)
        | (a[p + 2].astype(np.int64) << 8)
        | a[p + 3]
    )


def _section_at(a: np.ndarray, p: np.ndarray, code: int, ctor: int) -> np.ndarray:
    """Where ``00 53 code ctor`` (a described section) starts at each position."""
    return (a[p] == 0x00) & (a[p + 1] == 0x53) & (a[p + 2] == code) & (a[p + 3] == ctor)


def _data_section(a: np.ndarray, p: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(matches, value start)`` for one data section (vbin8 or vbin32) from p to end."""
    d8 = _section_at(a, p, 0x75, 0xA0) & (p + 5 + a[p + 4] == end)
    d32 = _section_at(a, p, 0x75, 0xB0) & (p + 8 + _u32_at(a, p + 4) == end)
    return d8 | d32, np.where(d8, p + 5, p + 8)


def chunk_arrays(
    data: bytes, num_entries: int, lo: int, hi: int
) -> tuple[pa.Array, pa.Array] | None:
    """Keys and values of records ``lo .. hi-1`` as Arrow arrays, cut out with numpy.

    Handles chunks whose messages all have one of the common shapes (a properties
    list8 whose message_id is a short string or binary, then one data section; or a
    data section alone). None otherwise: the caller decodes message by message.
    """
    bounds = _walk(data, num_entries, hi)
    if bounds is None:
        return None
    a = np.frombuffer(data + _PAD, dtype=np.uint8)
    ms = bounds[lo:hi] + 4  # message starts
    me = bounds[lo + 1 : hi + 1]  # message ends
    k = hi - lo
    if bool(np.all(_section_at(a, ms, 0x75, 0xA0) | _section_at(a, ms, 0x75, 0xB0))):
        ok, vs = _data_section(a, ms, me)
        if not bool(np.all(ok)):
            return None
        offsets = np.empty(2 * k, dtype=np.int64)
        offsets[0::2] = vs
        offsets[1::2] = me
        keys: pa.Array = pa.nulls(k, pa.binary())
        pick = [0]
    else:
        first = a[ms + 6]
        kl = a[ms + 7].astype(np.int64)
        le = ms + 5 + a[ms + 4]  # end of the properties list
        ok = (
            _section_at(a, ms, 0x73, 0xC0)
            & (a[ms + 5] > 0)
            & ((first == 0xA1) | (first == 0xA0))
            & (ms + 8 + kl <= le)
            & (le < me)
        )
        dok, vs = _data_section(a, le, me)
        if not bool(np.all(ok & dok)):
            return None
        offsets = np.empty(4 * k, dtype=np.int64)
        offsets[0::4] = ms + 8
        offsets[1::4] = ms + 8 + kl
        offsets[2::4] = vs
        offsets[3::4] = me
        keys = None  # type: ignore[assignment]
        pick = [0, 2]
    if offsets[-1] >= 2**31:
        return None
    width = len(offsets) // k
    segments = pa.BinaryArray.from_buffers(
        pa.binary(),
        len(offsets) - 1,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
    )
    taken = [segments.take(pa.array(np.arange(j, len(offsets) - 1, width))) for j in pick]
    if keys is None:
        return taken[0], taken[1]
    return keys, taken[0]


_TS = pa.timestamp("ms", tz="UTC")

# What the reader yields for records it cannot decode: the pipeline's dead-letter columns
# (``pipeline.transform.DEAD_COLUMNS``), told from record batches by ``reason``.
DEAD_LETTER_SCHEMA = pa.schema(
    [("partition", pa.string()), ("offset", pa.int64()), ("key", pa.binary()),
     ("value", pa.binary()), ("reason", pa.string())]
)


def _payload(*arrays: pa.Array) -> int:
    return sum(pc.sum(pc.binary_length(a)).as_py() or 0 for a in arrays)


class Columns:
    """Records not yet handed out: Arrow pieces, plus lists for small chunks, plus the
    chunks added and not decoded yet, which ``batches`` decodes as it goes."""

    def __init__(self, partition: str, max_rows: int = 65536, max_bytes: int = MAX_BATCH_BYTES):
        self.partition = partition
        self.max_rows = max(1, int(max_rows))
        self.max_bytes = max(1, int(max_bytes))
        self.pieces: list[list[pa.Array]] = []  # [offsets, keys, values, stamps]
        self.rows = 0
        self.nbytes = 0  # of the keys and values held
        self._offsets: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes] = []
        self._stamps: list[int] = []
        self._part_cache: dict[int, pa.Array] = {}
        self._pending: deque[Iterator[None]] = deque()
        self.dead: list[tuple[int, bytes | None, str]] = []  # (offset, value, reason)
        self.empty_sub_entries = 0  # sub-entries holding bytes but no record (no offset)
        self._full = False  # hand over what is held before the next sub-entry is decompressed

    def add_chunk(self, frame: schema.Deliver, start: int, end: int) -> None:
        """Take the records of one chunk that lie in ``[start, end)``; ``batches`` decodes them."""
        first = frame.chunk_first_offset
        lo = max(0, start - first)
        hi = min(frame.num_records, end - first)
        if hi > lo:
            self._pending.append(self._decode(frame, lo, hi))

    def batches(self, final: bool = False) -> Iterator[pa.RecordBatch]:
        """Record batches as they fill (``max_rows`` records or ``max_bytes`` bytes), then
        the dead letters met; with ``final``, also the records left. Records short of a
        full batch are kept for the chunks added next."""
        while True:
            while self.rows and (
                self.rows >= self.max_rows or self.nbytes >= self.max_bytes or self._full
            ):
                yield self._batch(min(self.rows, self.max_rows))
            self._full = False
            if not self._pending:
                break
            if next(self._pending[0], StopIteration) is StopIteration:
                self._pending.popleft()
        if self.dead:
            yield self.dead_batch()
        while final and self.rows:
            yield self._batch(min(self.rows, self.max_rows))

    def _decode(self, frame: schema.Deliver, lo: int, hi: int) -> Iterator[None]:
        """Records ``lo .. hi-1`` of a chunk into the columns; a step per sub-entry."""
        first, k = frame.chunk_first_offset, hi - lo
        if k >= VECTOR_MIN_RECORDS and frame.num_records == frame.num_entries:
            arrays = chunk_arrays(frame.data, frame.num_entries, lo, hi)
            if arrays is not None:
                self._flush_lists()
                self.pieces.append([pa.array(np.arange(first + lo, first + hi, dtype=np.int64)),
                                    arrays[0], arrays[1],
                                    pa.array(np.full(k, frame.timestamp, dtype=np.int64))])
                self.rows += k
                self.nbytes += _payload(*arrays)
                return
        decoded = decode_chunk(frame.data, frame.num_entries, lo, hi)
        if decoded is not None:
            self._extend(range(first + lo, first + hi), *decoded, frame.timestamp)
            return
        for entry in chunk_entries(frame.data, frame.num_entries, frame.num_records, lo, hi):
            if isinstance(entry, int):  # a sub-entry of this size is decompressed next
                self._full = self.nbytes + entry > self.max_bytes
            elif isinstance(entry, Undecodable):
                self._dead_letters(first, entry, lo, hi)
            else:
                pairs = [decode_message(m) for m in entry[1]]
                at = first + entry[0]
                self._extend(range(at, at + len(pairs)), [p[0] for p in pairs],
                             [p[1] for p in pairs], frame.timestamp)
                del pairs
            del entry  # a sub-entry's messages are let go before the next is decompressed
            yield

    def _extend(self, offsets: range, keys: list[bytes | None], values: list[bytes], stamp: int) -> None:
        self._keys.extend(keys)
        self._values.extend(values)
        self._offsets.extend(offsets)
        self._stamps.extend([stamp] * len(offsets))
        self.rows += len(offsets)
        self.nbytes += sum(map(len, values)) + sum(len(k) for k in keys if k is not None)

    def _dead_letters(self, first: int, entry: Undecodable, lo: int, hi: int) -> None:
        """One dead letter per offset of ``entry`` in ``[lo, hi)``. The entry's bytes go
        to its first offset, whichever range reads it, and the others carry none: what
        the producer wrote is kept once, and the rows do not depend on where ranges cut."""
        start, stop = first + entry.first, first + entry.first + entry.count
        if not entry.count:
            if entry.raw:
                self.empty_sub_entries += 1
                log.warning(
                    "stream %r, chunk at offset %d: a %s of %d bytes is skipped: %s, so no "
                    "offset can carry it as a dead letter (the producer's bytes are lost)",
                    self.partition, first, entry.what, len(entry.raw), entry.reason)
            return
        reason = f"undecodable {entry.what} at offsets [{start}, {stop}): {entry.reason}"
        for offset in range(first + max(entry.first, lo), first + min(entry.first + entry.count, hi)):
            self.dead.append((offset, entry.raw if offset == start and entry.raw else None, reason))

    def dead_batch(self) -> pa.RecordBatch:
        """The dead letters of the chunks added so far (``DEAD_LETTER_SCHEMA``), handed
        over once. Chunks not decoded yet are decoded now, their records kept whole:
        ``batches`` is the bounded way, and calls this when nothing is left to decode."""
        for chunk in self._pending:
            for _ in chunk:
                pass
        self._pending.clear()
        dead, self.dead = self.dead, []
        return pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(self.partition, pa.string()), len(dead)),
                pa.array([d[0] for d in dead], pa.int64()),
                pa.nulls(len(dead), pa.binary()),
                pa.array([d[1] for d in dead], pa.binary()),
                pa.array([d[2] for d in dead], pa.string()),
            ],
            schema=DEAD_LETTER_SCHEMA,
        )

    def _flush_lists(self) -> None:
        if self._offsets:
            self.pieces.append(
                [
                    pa.array(self._offsets, pa.int64()),
                    pa.array(self._keys, pa.binary()),
                    pa.array(self._values, pa.binary()),
                    pa.array(self._stamps, pa.int64()),
                ]
            )
            self._offsets, self._keys, self._values, self._stamps = [], [], [], []

    def _batch(self, n: int) -> pa.RecordBatch:
        """The next ``n`` records (n <= self.rows) as one batch."""
        self._flush_lists()
        columns = [
            pa.concat_arrays([p[i] for p in self.pieces])
            if len(self.pieces) > 1
            else self.pieces[0][i]
            for i in range(4)
        ]
        rest = [c.slice(n) for c in columns]
        self.pieces = [rest] if len(rest[0]) else []
        self.rows -= n
        self.nbytes = _payload(rest[1], rest[2]) if self.rows else 0
        part = self._part_cache.get(n)
        if part is None:
            part = pa.repeat(pa.scalar(self.partition, pa.string()), n)
            if len(self._part_cache) < 8:
                self._part_cache[n] = part
        return pa.RecordBatch.from_arrays(
            [
                part,
                columns[0].slice(0, n),
                columns[1].slice(0, n),
                columns[2].slice(0, n),
                columns[3].slice(0, n).cast(_TS),
            ],
            schema=RECORD_SCHEMA,
        )
