"""Sub-entry batches written by a real client: rstream's Producer, with the codecs it lacks.

rstream writes sub-entries of any codec registered in its ``StreamCompressionCodecs`` but
ships only none and gzip. ``codecs_registered`` registers Snappy, LZ4 and zstd written
as the Java client writes them (``CompressionUtils``: Snappy's framing format, an LZ4
frame stating its content size, a streamed zstd frame that does not), for as long as
the block runs, then puts rstream's registry back: the reader must decode them without
rstream's help. ``Forged`` is a codec that writes given bytes with a given header, for
entries no honest producer writes (corrupt data, an unknown codec, a gzip bomb).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rstream import AMQPMessage, CompressionType, Producer, Properties
from rstream.compression import ICompressionCodec, StreamCompressionCodecs


def _plain(messages: Sequence[object]) -> bytes:
    return b"".join(len(bytes(m)).to_bytes(4, "big") + bytes(m) for m in messages)


def snappy_framed(data: bytes) -> bytes:
    import snappy

    return snappy.StreamCompressor().add_chunk(data)


def lz4_frame(data: bytes) -> bytes:
    import lz4.frame

    return lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, store_size=True)


def zstd_streamed(data: bytes) -> bytes:
    import zstandard

    c = zstandard.ZstdCompressor().compressobj()  # a stream: no content size in the header
    return c.compress(data) + c.flush()


def gzip_member(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def gzip_of_zeros(n: int) -> bytes:
    """A gzip bomb: ``n`` zero bytes (a multiple of 1 MiB) in about n / 1000 bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(c.compress(block) for _ in range(n >> 20)) + c.flush()


COMPRESS = {
    CompressionType.No: lambda d: d,
    CompressionType.Gzip: gzip_member,
    CompressionType.Snappy: snappy_framed,
    CompressionType.Lz4: lz4_frame,
    CompressionType.Zstd: zstd_streamed,
}


class Codec(ICompressionCodec):
    """One of the codecs rstream lacks, for its producer."""

    def __init__(self, kind: CompressionType):
        self.kind = kind
        self.count = self.size = 0
        self.buffer = b""

    def compress(self, messages):
        plain = _plain(messages)
        self.count, self.size = len(messages), len(plain)
        self.buffer = COMPRESS[self.kind](plain)

    def uncompress(self, compressed_data, uncompressed_data_size):
        raise AssertionError("the reader must not decode through rstream")

    def compressed_size(self):
        return len(self.buffer)

    def uncompressed_size(self):
        return self.size

    def messages_count(self):
        return self.count

    def compression_type(self):
        return self.kind.value

    def data(self):
        return self.buffer


@dataclass
class Forged(ICompressionCodec):
    """Writes ``payload`` as a sub-entry of ``count`` records whose header says ``code``
    and ``declared`` bytes uncompressed, whatever the messages."""

    code: int
    payload: bytes
    declared: int
    count: int

    def compress(self, messages):
        pass

    def uncompress(self, compressed_data, uncompressed_data_size):
        raise AssertionError("never decoded through rstream")

    def compressed_size(self):
        return len(self.payload)

    def uncompressed_size(self):
        return self.declared

    def messages_count(self):
        return self.count

    def compression_type(self):
        return self.code

    def data(self):
        return self.payload


@contextlib.contextmanager
def codecs_registered(extra: dict[CompressionType, ICompressionCodec] | None = None) -> Iterator[None]:
    registry = StreamCompressionCodecs.available_compress_codecs
    saved = dict(registry)
    for kind in (CompressionType.Snappy, CompressionType.Lz4, CompressionType.Zstd):
        registry[kind] = Codec(kind)
    registry.update(extra or {})
    try:
        yield
    finally:
        registry.clear()
        registry.update(saved)


def message(key: str, value: bytes) -> AMQPMessage:
    return AMQPMessage(body=value, properties=Properties(message_id=key))


Entry = tuple[CompressionType, Sequence[tuple[str, bytes]]] | ICompressionCodec | tuple[str, bytes]


def produce(port: int, stream: str, entries: Sequence[Entry]) -> None:
    """Publish, in order: ``(codec, records)`` as one sub-entry of that codec, a ``Forged``
    entry as it is, or a ``(key, value)`` record as a plain entry. Each entry is confirmed
    before the next is sent, so they take their offsets in this order."""

    async def go() -> None:
        async with Producer("127.0.0.1", port, username="guest", password="guest") as producer:
            for entry in entries:
                if isinstance(entry, ICompressionCodec):
                    with codecs_registered({CompressionType.Zstd: entry}):
                        await _sub_entry(producer, stream, [message("forged", b"")], CompressionType.Zstd)
                elif isinstance(entry[0], CompressionType):
                    kind, records = entry
                    with codecs_registered():
                        await _sub_entry(producer, stream, [message(k, v) for k, v in records], kind)
                else:
                    await producer.send_wait(stream, message(*entry))

    asyncio.run(go())


async def _sub_entry(producer: Producer, stream: str, messages: list, kind: CompressionType) -> None:
    confirmed = asyncio.get_running_loop().create_future()

    def on_confirm(status) -> None:
        if not confirmed.done():
            confirmed.set_result(status.is_confirmed)

    # rstream compresses here and sends on its 0.5 s timer
    await producer.send_sub_entry(stream, messages, compression_type=kind, on_publish_confirm=on_confirm)
    assert await asyncio.wait_for(confirmed, 30), "the broker refused a sub-entry"
