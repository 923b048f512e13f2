"""Records of delivered chunks into Arrow batches of ``RECORD_SCHEMA``.

``chunk_arrays`` is the measured fast path: a chunk of at least ``VECTOR_MIN_RECORDS``
messages of one common shape is cut out with numpy, keys and values as slices of the
chunk's own buffer. Smaller or odd chunks go through ``amqp.decode_chunk`` into lists,
chunks with sub-entry batches through ``codecs.chunk_messages``.
``Columns`` collects both kinds and cuts batches of the size the reader asks for; the
records of an entry that cannot be decoded are collected apart, as dead letters
(``DEAD_LETTER_SCHEMA``: one per offset, the reason naming the entry's offset range).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from rstream import schema

from reconciler.streams.base import RECORD_SCHEMA
from reconciler.streams.rabbitmq.amqp import U32, decode_chunk, decode_message
from reconciler.streams.rabbitmq.codecs import Undecodable, chunk_messages

VECTOR_MIN_RECORDS = 32  # chunks at least this large are cut out with numpy


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


class Columns:
    """Records not yet handed out: Arrow pieces, plus lists for small chunks."""

    def __init__(self, partition: str):
        self.partition = partition
        self.pieces: list[list[pa.Array]] = []  # [offsets, keys, values, stamps]
        self.rows = 0
        self._offsets: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes] = []
        self._stamps: list[int] = []
        self._part_cache: dict[int, pa.Array] = {}
        self.dead: list[tuple[int, bytes | None, str]] = []  # (offset, value, reason)

    def __len__(self) -> int:
        return self.rows

    def add_chunk(self, frame: schema.Deliver, start: int, end: int) -> None:
        """Append the records of one chunk that lie in ``[start, end)``."""
        first = frame.chunk_first_offset
        lo = max(0, start - first)
        hi = min(frame.num_records, end - first)
        if hi <= lo:
            return
        k = hi - lo
        if k >= VECTOR_MIN_RECORDS and frame.num_records == frame.num_entries:
            arrays = chunk_arrays(frame.data, frame.num_entries, lo, hi)
            if arrays is not None:
                self._flush_lists()
                self.pieces.append(
                    [
                        pa.array(np.arange(first + lo, first + hi, dtype=np.int64)),
                        arrays[0],
                        arrays[1],
                        pa.array(np.full(k, frame.timestamp, dtype=np.int64)),
                    ]
                )
                self.rows += k
                return
        decoded = decode_chunk(frame.data, frame.num_entries, lo, hi)
        if decoded is None:  # sub-entry batches (possibly compressed)
            index, messages, dead = chunk_messages(
                frame.data, frame.num_entries, frame.num_records, lo, hi
            )
            for entry in dead:
                self._dead_letters(first, entry, lo, hi)
            pairs = [decode_message(m) for m in messages]
            decoded = [p[0] for p in pairs], [p[1] for p in pairs]
            offsets = [first + i for i in index]
        else:
            offsets = list(range(first + lo, first + hi))
        self._keys.extend(decoded[0])
        self._values.extend(decoded[1])
        self._offsets.extend(offsets)
        self._stamps.extend([frame.timestamp] * len(offsets))
        self.rows += len(offsets)

    def _dead_letters(self, first: int, entry: Undecodable, lo: int, hi: int) -> None:
        """One dead letter per offset of ``entry`` in ``[lo, hi)``; the first of them
        carries the entry's bytes, so what the producer wrote is kept once."""
        start, stop = first + entry.first, first + entry.first + entry.count
        reason = f"undecodable {entry.what} at offsets [{start}, {stop}): {entry.reason}"
        offsets = range(first + max(entry.first, lo), first + min(entry.first + entry.count, hi))
        for n, offset in enumerate(offsets):
            self.dead.append((offset, entry.raw if n == 0 else None, reason))

    def dead_batch(self) -> pa.RecordBatch:
        """The dead letters collected so far (``DEAD_LETTER_SCHEMA``), handed over once."""
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

    def batch(self, n: int) -> pa.RecordBatch:
        """The next ``n`` records (n <= len(self)) as one batch."""
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
