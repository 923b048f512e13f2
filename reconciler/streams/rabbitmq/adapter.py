"""``RabbitStreamAdapter``: partitions and positions of a set of RabbitMQ streams.

Each stream of a supervisor's stream set is one partition, named by the stream name.
Every call opens its own connections on a private loop (``bridge.Loop``) and closes them.

* ``earliest``: the first chunk delivered to a subscription at ``first`` (an empty
  stream: 0), or StreamStats ``first_chunk_id`` on a server that has StreamStats.
* ``latest`` (the committed end): RabbitMQ 3.10 has no StreamStats command (3.11 added
  it, and rstream has no call for it), so the end is read from the chunk header of
  the first chunk delivered to a subscription at ``last``: that is the last chunk,
  and a chunk is delivered only once committed, so ``first offset + number of
  records`` is a committed end. Nothing delivered means no record (0), and that is
  known for certain, never concluded from a quiet second: see
  ``client.Subscription.next_known``; a broker too slow to answer is a
  ``RetryableError``. On a server that answers StreamStats, ``committed_offset + 1`` is
  used when present (``committed_chunk_id`` alone does not give the end, so the chunk
  header is still read then).
* ``offsets_for_time``: a subscription at ``timestamp``; the first delivered chunk
  whose timestamp is >= the time gives the offset (all records of a chunk share the
  chunk's timestamp, which is also their ``stream_time``); none: the end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from rstream import exceptions as rexc
from rstream import schema
from rstream.constants import OffsetType

from reconciler.errors import ReconcilerError
from reconciler.model import RabbitSource
from reconciler.spec import secrets
from reconciler.streams.base import SourceMissing
from reconciler.streams.rabbitmq.bridge import Loop
from reconciler.streams.rabbitmq.client import (
    Connections,
    first_chunk,
    offset_spec,
    subscribe,
    translate,
)
from reconciler.streams.rabbitmq.stats import stream_stats
from reconciler.streams.rabbitmq.uri import parse_stream_uri

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0  # seconds: connecting, each request, waiting for a range
MAX_SUBSCRIPTIONS = 200  # per connection (the protocol allows 256 ids)


def held_time(frame: schema.Deliver | None, offset: int) -> tuple[int, int] | None:
    """Pure: ``(offset, chunk timestamp)`` when the delivered chunk holds ``offset``, else None
    (no chunk: the end; a chunk starting after it: the first chunk kept after retention)."""
    if frame is None or not frame.chunk_first_offset <= offset < frame.chunk_first_offset + frame.num_records:
        return None
    return offset, int(frame.timestamp)


class RabbitStreamAdapter:
    """Positions of a set of RabbitMQ streams; each stream is one partition."""

    # Each stream is its own source, deleted and declared again alone: a stream found
    # re-declared moves only its own checkpoint (``runtime.truncation.decide``).
    independent_partitions = True

    def __init__(
        self,
        source: RabbitSource,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        empty_wait: float | None = None,
    ):
        # ``empty_wait`` is accepted for old callers and unused: emptiness is no longer
        # concluded from waiting (see ``client.Subscription.next_known``).
        del empty_wait
        self.source = source
        self.timeout = timeout
        self.where = secrets.redact_uri(source.uri)

    # -- plumbing ---------------------------------------------------------------------

    def _run(self, doing: str, work: Callable[[Connections], Awaitable[T]]) -> T:
        endpoint = parse_stream_uri(self.source.uri)  # resolves references, now
        loop = Loop()

        async def main() -> T:
            conns = Connections(endpoint, self.timeout, "stream-reconciler-positions")
            try:
                return await work(conns)
            finally:
                await conns.close()

        try:
            return loop.run(main())
        except BaseException as exc:  # noqa: BLE001 - translated for the caller
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise translate(exc, doing, self.where, self.timeout) from None
        finally:
            loop.close()

    async def _per_stream(
        self, conns: Connections, fn: Callable[[Connections, str], Awaitable[int]]
    ) -> dict[str, int]:
        streams = list(self.source.streams)
        out: dict[str, int] = {}
        for i in range(0, len(streams), MAX_SUBSCRIPTIONS):
            group = streams[i : i + MAX_SUBSCRIPTIONS]
            values = await asyncio.gather(*(self._named(fn, conns, s) for s in group))
            out.update(zip(group, values, strict=True))
        return out

    async def _named(
        self, fn: Callable[[Connections, str], Awaitable[int]], conns: Connections, stream: str
    ) -> int:
        try:
            return await fn(conns, stream)
        except rexc.StreamDoesNotExist:
            raise self._missing(stream) from None

    def _missing(self, stream: str) -> SourceMissing:
        vhost = "?"
        try:
            vhost = parse_stream_uri(self.source.uri).vhost
        except ReconcilerError:
            pass
        return SourceMissing(f"stream {stream!r} does not exist in vhost {vhost!r} on {self.where}")

    async def _first_chunk(
        self, conns: Connections, stream: str, spec: schema.OffsetSpec
    ) -> schema.Deliver | None:
        return await first_chunk(conns, stream, spec, self.timeout)

    async def _stats(self, conns: Connections, stream: str) -> dict[str, int] | None:
        """StreamStats where the server has it; None (use subscriptions) on any trouble.

        No server here has StreamStats (3.10.8), so this path falls back on every error
        rather than let an untested exchange break positions.
        """
        try:
            return await asyncio.wait_for(stream_stats(conns, stream), self.timeout)
        except rexc.StreamDoesNotExist:
            raise
        except Exception as exc:  # noqa: BLE001
            log.debug("StreamStats for %r failed (%s); using subscriptions", stream, exc)
            return None

    async def _earliest(self, conns: Connections, stream: str) -> int:
        stats = await self._stats(conns, stream)
        if stats is not None and "first_chunk_id" in stats:
            return max(0, stats["first_chunk_id"])
        frame = await self._first_chunk(conns, stream, offset_spec(OffsetType.FIRST))
        return frame.chunk_first_offset if frame is not None else 0

    async def _latest(self, conns: Connections, stream: str) -> int:
        stats = await self._stats(conns, stream)
        if stats is not None:
            if stats.get("committed_offset", -1) >= 0:
                return stats["committed_offset"] + 1
            if stats.get("committed_chunk_id", 0) < 0:
                return max(0, stats.get("first_chunk_id", 0))  # empty
        frame = await self._first_chunk(conns, stream, offset_spec(OffsetType.LAST))
        if frame is None:
            return 0
        return frame.chunk_first_offset + frame.num_records

    async def _for_time(self, conns: Connections, stream: str, ts: int) -> int:
        # The end, looked up alongside: it says when the chunks before ``ts`` ran out.
        latest = asyncio.ensure_future(self._latest(conns, stream))
        spec = offset_spec(OffsetType.TIMESTAMP, ts)
        sub = await subscribe(conns, stream, spec, 1, leader=True)
        try:
            while True:
                frame = await sub.next_known(self.timeout)
                if frame is None:
                    break
                if frame.timestamp >= ts:
                    return frame.chunk_first_offset
                chunk_end = frame.chunk_first_offset + frame.num_records
                if latest.done() and chunk_end >= latest.result():
                    return chunk_end
                await sub.credit(1)
        finally:
            await sub.stop()
            if not latest.done():
                await asyncio.wait([latest])
        return latest.result()

    async def _time_at(self, conns: Connections, stream: str, offset: int) -> int | None:
        """The timestamp of the first chunk delivered at ``offset`` (its records share it): the
        chunk holding it, or the first chunk still kept when retention deleted it; None at the end."""
        frame = await self._first_chunk(conns, stream, offset_spec(OffsetType.OFFSET, offset))
        return None if frame is None else int(frame.timestamp)

    async def _held_at(self, conns: Connections, stream: str, offset: int) -> tuple[int, int] | None:
        frame = await self._first_chunk(conns, stream, offset_spec(OffsetType.OFFSET, offset))
        return held_time(frame, offset)

    # -- StreamAdapter ----------------------------------------------------------------

    def partitions(self) -> list[str]:
        async def check(conns: Connections) -> list[str]:
            loc = await conns.locator()
            for stream in self.source.streams:
                if not await loc.stream_exists(stream):
                    raise self._missing(stream)
            return list(self.source.streams)

        return self._run("listing streams", check)

    def earliest(self) -> dict[str, int]:
        return self._run("reading the first offsets", lambda c: self._per_stream(c, self._earliest))

    def latest(self) -> dict[str, int]:
        return self._run("reading the committed ends", lambda c: self._per_stream(c, self._latest))

    def offsets_for_time(self, timestamp_ms: int) -> dict[str, int]:
        ts = int(timestamp_ms)

        async def per(conns: Connections, stream: str) -> int:
            return await self._for_time(conns, stream, ts)

        return self._run("looking up offsets by time", lambda c: self._per_stream(c, per))

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        """The broker's timestamp of the first record at or after each stream's offset
        (``streams.lagtime``): one subscription per asked stream, at that offset, for its first
        chunk. Below the first chunk still kept (retention deleted the offset) the subscription
        is served from that chunk, so the time answered is of a LATER offset: right for a lag
        (the oldest record not read), never a fingerprint of the offset (``records_at``)."""
        return self._per_offset("reading record times", offsets, self._time_at)

    def records_at(self, offsets: Mapping[str, int]) -> dict[str, tuple[int, int] | None]:
        """Per stream, ``(offset, timestamp)`` of the record at the offset (``runtime.fingerprint``),
        from the chunk that holds it; None when the stream does not hold it: past its end, or
        below its first chunk still kept (the chunk delivered starts after the offset). None
        is "not held", not "replaced": the caller reads the earliest offsets again and takes
        an offset retention passed for retention."""
        return self._per_offset("reading the records at offsets", offsets, self._held_at)

    def _per_offset(self, doing: str, offsets: Mapping[str, int], fn: Callable[..., Awaitable[T]]) -> dict[str, T]:
        wanted = {s: int(o) for s, o in offsets.items() if s in self.source.streams}

        async def work(conns: Connections) -> dict[str, T]:
            out: dict[str, T] = {}
            names = list(wanted)
            for i in range(0, len(names), MAX_SUBSCRIPTIONS):
                group = names[i : i + MAX_SUBSCRIPTIONS]
                values = await asyncio.gather(*(fn(conns, s, wanted[s]) for s in group))
                out.update(zip(group, values, strict=True))
            return out

        return self._run(doing, work) if wanted else {}

    def identity(self) -> str | None:
        """RabbitMQ gives a stream no id that survives a look from outside: None, and the end
        below a checkpoint (``holds``) is the sign of a stream deleted and declared again."""
        return None

    def holds(self, partition: str, offset: int) -> bool:
        """A stream's committed end is exact (never under-reported): an offset at or past it
        is not held, which below a checkpoint means the stream was deleted and declared again."""
        async def end(conns: Connections) -> int:
            return await self._latest(conns, partition)

        return int(offset) < self._run("reading the committed end", end)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connections."""
