"""``RabbitRangeReader``: exactly ``[start, end)`` of one stream as Arrow batches.

Offsets are positions, not record counts: a stream also holds entries no consumer is
ever sent (each ``store_offset`` of an application writes a tracking entry that takes
an offset), so offsets may skip, a range may hold fewer records than its size and a
checkpoint or range boundary may sit on such an entry (the reader then starts at the
next record). ``latest`` is the end of the last record, not of the last entry.

Records that cannot be decoded (a sub-entry batch whose data is corrupt, of an unknown
codec or larger than ``codecs.MAX_SUB_ENTRY_BYTES``) come as batches of
``arrow.DEAD_LETTER_SCHEMA`` instead, one row per offset with the reason; the records
around them are read as usual.

Batches hold at most ``max_batch_rows`` records and about ``arrow.MAX_BATCH_BYTES``:
each chunk is decoded into batches as soon as it is taken, so the records held between
takes are less than one batch, however many chunks a take brings or how far their
sub-entries inflate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pyarrow as pa
from rstream import exceptions as rexc
from rstream import schema
from rstream.constants import OffsetType

from reconciler.errors import PermanentError, RetryableError
from reconciler.model import PartitionRange, RabbitSource
from reconciler.spec import secrets
from reconciler.streams.rabbitmq.adapter import DEFAULT_TIMEOUT
from reconciler.streams.rabbitmq.arrow import Columns
from reconciler.streams.rabbitmq.bridge import Loop
from reconciler.streams.rabbitmq.client import (
    Connections,
    Subscription,
    first_chunk,
    offset_spec,
    subscribe,
    translate,
)
from reconciler.streams.rabbitmq.uri import parse_stream_uri

T = TypeVar("T")

READ_CREDIT = 128  # chunks in flight per read subscription (the measured knee)


class RabbitRangeReader:
    """Reads exactly ``[start, end)`` of one stream as Arrow batches.

    ``timeout`` bounds every wait: when no chunk arrives for that long (the range is
    not committed yet, or the node went away) ``RetryableError`` is raised.
    """

    def __init__(
        self, source: RabbitSource, *, timeout: float = DEFAULT_TIMEOUT, credit: int = READ_CREDIT
    ):
        self.source = source
        self.timeout = timeout
        self.credit = max(1, credit)
        self.where = secrets.redact_uri(source.uri)
        self.empty_sub_entries = 0  # met by every read: bytes with no offset, logged as warnings

    def close(self) -> None:
        """Nothing to release: every ``read`` opens and closes its own connections."""

    async def _check_gap(
        self, conns: Connections, stream: str, start: int, delivered: int, doing: str
    ) -> None:
        """Offsets ``[start, delivered)`` hold no record that can be read: bookkeeping entries
        (offsets stored by consumers, never sent to anyone), or records retention deleted.

        Retention deletes whole segments from the head of the stream, so when the stream's
        first record is at or before ``start`` nothing after it was deleted and the gap is
        bookkeeping only: normal. Otherwise the broker cannot tell the two apart; the
        supervisor's retention check (run after any failed batch) records the loss or
        stops, so this batch fails retryably rather than guess."""
        first = await first_chunk(conns, stream, offset_spec(OffsetType.FIRST), self.timeout)
        if first is not None and first.chunk_first_offset <= start:
            return
        retained = first.chunk_first_offset if first is not None else delivered
        raise RetryableError(
            f"{doing}: offsets [{start}, {delivered}) of stream {stream!r} cannot be read: the "
            f"stream's first record is now at offset {retained}, so they were deleted by "
            "retention (or are offsets stored by consumers, which hold no record); the "
            "supervisor checks retention before its next batch"
        )

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        if rng.end <= rng.start:
            return
        if rng.partition not in self.source.streams:
            raise PermanentError(
                f"stream {rng.partition!r} is not one of this source's streams {list(self.source.streams)}"
            )
        max_batch_rows = max(1, int(max_batch_rows))
        start, end = int(rng.start), int(rng.end)
        stream = rng.partition
        doing = f"reading offsets [{start}, {end}) of stream {stream!r}"
        endpoint = parse_stream_uri(self.source.uri)
        loop = Loop()
        conns = Connections(endpoint, self.timeout, "stream-reconciler-reader")
        sub: Subscription | None = None
        cols = Columns(stream, max_batch_rows)

        def run(coro: Awaitable[T]) -> T:
            try:
                return loop.run(coro)
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
                    raise
                if isinstance(exc, rexc.StreamDoesNotExist):
                    raise PermanentError(
                        f"{doing}: stream {stream!r} does not exist in vhost {endpoint.vhost!r} on {self.where}"
                    ) from None
                raise translate(exc, doing, self.where, self.timeout) from None

        async def take() -> list[schema.Deliver]:
            assert sub is not None
            frame = await sub.next(self.timeout)
            if frame is None:
                return []
            frames = [frame, *sub.drain()]
            await sub.credit(len(frames))
            return frames

        try:
            sub = run(
                subscribe(
                    conns, stream, offset_spec(OffsetType.OFFSET, start), self.credit, leader=False
                )
            )
            position = start
            first = True
            while position < end:
                frames = run(take())
                if not frames:
                    raise RetryableError(
                        f"{doing}: offsets from {position} are not committed on {self.where} "
                        f"within {self.timeout:g}s (the range end was taken from a position the "
                        "stream does not serve yet)"
                    )
                for frame in frames:
                    if first:
                        first = False
                        if frame.chunk_first_offset > start:
                            run(
                                self._check_gap(
                                    conns, stream, start, frame.chunk_first_offset, doing
                                )
                            )
                    chunk_end = frame.chunk_first_offset + frame.num_records
                    if chunk_end <= position:
                        continue  # a chunk before the position (the chunk holding start comes first)
                    cols.add_chunk(frame, position, end)
                    yield from cols.batches()
                    position = max(position, min(chunk_end, end))
                    if position >= end:
                        break
            yield from cols.batches(final=True)
        finally:
            self.empty_sub_entries += cols.empty_sub_entries
            try:
                if sub is not None:
                    loop.run(asyncio.wait_for(sub.stop(), 3.0))
                loop.run(asyncio.wait_for(conns.close(), 3.0))
            except BaseException:  # noqa: BLE001 - best effort
                pass
            loop.close()
