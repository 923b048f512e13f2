"""A chunk's entries as messages: sub-entry batches unpacked and decompressed, within a bound.

A chunk entry whose first bit is set is a sub-entry batch (the stream protocol's
``SubEntry``): a type byte (the top bit, then the codec in the next three bits), the
record count (u16), the uncompressed length (u32), the data length (u32) and the data,
which once decompressed is ``[size u32][message]`` per record. The codecs are the
protocol's: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. What the Java and .NET clients write
is the format each codec's stream classes write: a gzip member, Snappy's framing format
(``sNaPpY``), an LZ4 frame, a zstd frame (which may not state its content size).

rstream decodes only none and gzip (the others raise ``TypeError`` from its codec
registry) and gunzips without a limit, so we do it ourselves:

* Every codec decompresses at most the uncompressed length the header declares, plus one
  byte to see that it would go on; that length itself may not exceed
  ``MAX_SUB_ENTRY_BYTES``. A few bytes on the wire that claim or inflate to gigabytes
  cost no more than that.
* An entry that cannot be decoded (unknown codec, corrupt data, a size that does not
  match, a record list that does not fill the data) is returned as an ``Undecodable``
  with its records' positions in the chunk and the reason: the reader makes them dead
  letters and goes on with the next entry. An entry whose own length runs past the
  chunk leaves nothing to walk by, so the chunk's remaining records are one
  ``Undecodable``. A sub-entry that holds bytes but no record has no offset to be a
  dead letter at: it is an ``Undecodable`` of count 0, which the reader reports.
* Entries wholly outside the records asked for are skipped, not decompressed.
* ``chunk_entries`` is a generator that decompresses one sub-entry per step: the bound
  is on what one step holds, so a chunk of a few KiB whose sub-entries each inflate to
  the bound never holds more than one of them decompressed (the caller drops each
  step's messages before asking for the next).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MAX_SUB_ENTRY_BYTES = 64 * 1024 * 1024  # what one sub-entry may decompress to

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_SUB_HEADER = 11  # type, record count, uncompressed length, data length
_SNAPPY_ID = b"sNaPpY"
_SNAPPY_MAX_CHUNK = 65536  # the framing format's limit on one chunk's uncompressed data


class Refused(ValueError):
    """The data of one sub-entry cannot be decoded; the message says why."""


@dataclass(frozen=True)
class Undecodable:
    """Records ``first .. first + count - 1`` of a chunk, which could not be decoded."""

    first: int  # counted from the chunk's first record
    count: int
    what: str  # "sub-entry (zstd)", "entry", "chunk"
    reason: str
    raw: bytes  # the entry as it is in the chunk (header included), for the dead letter


def codec_name(entry_type: int) -> str:
    code = (entry_type >> 4) & 0x7
    return CODECS.get(code, f"unknown codec {code}")


def _over(size: int, codec: str) -> Refused:
    return Refused(f"{codec} data decompresses to more than the {size} bytes its header declares")


def _streamed(decompress, data: bytes, size: int, codec: str) -> bytes:
    """Concatenated frames (gzip members, LZ4 frames) through ``decompress(data, limit)``,
    which returns ``(output, the input after its frame or b"")``."""
    out: list[bytes] = []
    got = 0
    rest = data
    while rest:
        part, rest = decompress(rest, size + 1 - got)
        out.append(part)
        got += len(part)
        if got > size:
            raise _over(size, codec)
    return b"".join(out)


def _gzip(data: bytes, size: int) -> bytes:
    def one(chunk: bytes, limit: int) -> tuple[bytes, bytes]:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        part = d.decompress(chunk, limit)
        if len(part) < limit and not d.eof:
            raise Refused("gzip data is cut short")
        return part, d.unused_data

    try:
        return _streamed(one, data, size, "gzip")
    except zlib.error as exc:
        raise Refused(f"gzip: {exc}") from None


def _lz4(data: bytes, size: int) -> bytes:
    import lz4.frame

    def one(chunk: bytes, limit: int) -> tuple[bytes, bytes]:
        d = lz4.frame.LZ4FrameDecompressor()
        part = d.decompress(chunk, max_length=limit)
        if len(part) < limit and not d.eof:
            raise Refused("lz4 frame is cut short")
        return part, d.unused_data or b""

    try:
        return _streamed(one, data, size, "lz4")
    except RuntimeError as exc:  # lz4's error for a corrupt frame
        raise Refused(f"lz4: {exc}") from None


_ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)  # magic numbers of skippable frames


def _zstd_frames(data: bytes) -> Iterator[bytes]:
    """The frames of ``data`` (skippable frames left out), cut by walking each frame's
    block headers: zstandard's one-shot decompress reads one frame and ignores the rest."""
    import zstandard

    pos = 0
    while pos < len(data):
        if int.from_bytes(data[pos : pos + 4], "little") in _ZSTD_SKIPPABLE:
            if pos + 8 > len(data):
                raise Refused("zstd: the frame is cut short")
            pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
            continue
        try:
            head = data[pos : pos + 18]  # a frame header is at most 18 bytes
            checksum = zstandard.get_frame_parameters(head).has_checksum
            end = pos + zstandard.frame_header_size(head)
        except zstandard.ZstdError as exc:
            raise Refused(f"zstd: {exc}") from None
        last = False
        while not last:
            if end + 3 > len(data):
                raise Refused("zstd: the frame is cut short")
            block = int.from_bytes(data[end : end + 3], "little")
            last = bool(block & 1)
            end += 3 + (1 if (block >> 1) & 3 == 1 else block >> 3)  # an RLE block is 1 byte
        end += 4 if checksum else 0
        if end > len(data):
            raise Refused("zstd: the frame is cut short")
        yield data[pos:end]
        pos = end


def _zstd(data: bytes, size: int) -> bytes:
    """Each frame decompressed in one shot into a buffer of at most the bytes still due
    (plus one): a one-shot decompress writes straight into that buffer, so the window a
    frame declares (128 MiB at level 22, whatever its content) costs nothing, and the
    bound is the output buffer. A frame stating its content size is refused before
    decompressing when that size is over, since zstandard then allocates that size."""
    import zstandard

    out: list[bytes] = []
    got = 0
    dctx = zstandard.ZstdDecompressor()
    for frame in _zstd_frames(data):
        stated = -1  # unknown
        try:
            stated = zstandard.frame_content_size(frame)
            if stated > size - got:
                raise _over(size, "zstd")
            part = dctx.decompress(frame, max_output_size=size + 1 - got)
        except zstandard.ZstdError as exc:
            if stated < 0 and "did not decompress full frame" in str(exc):
                raise _over(size, "zstd") from None  # the buffer of size + 1 - got filled up
            raise Refused(f"zstd: {exc}") from None
        out.append(part)
        got += len(part)
    return b"".join(out)  # one frame: the same bytes, not a copy


def _varint(data: bytes) -> int:
    n = shift = 0
    for b in data[:5]:
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
    raise Refused("snappy chunk: bad length prefix")


def _snappy(data: bytes, size: int) -> bytes:
    """Snappy's framing format, chunk by chunk: each chunk states its length, so nothing
    is decompressed beyond ``size``. The chunks' CRC-32C is not checked: the chunk's own
    CRC-32, which the client checks, already covers these bytes."""
    import snappy

    out: list[bytes] = []
    got = pos = 0
    seen_id = False
    while pos < len(data):
        if pos + 4 > len(data):
            raise Refused("snappy frame is cut short")
        kind = data[pos]
        length = int.from_bytes(data[pos + 1 : pos + 4], "little")
        body = data[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if len(body) < length:
            raise Refused("snappy frame is cut short")
        if kind == 0xFF:
            if body != _SNAPPY_ID:
                raise Refused("not Snappy's framing format (bad stream identifier)")
            seen_id = True
            continue
        if not seen_id:
            raise Refused("not Snappy's framing format (no stream identifier)")
        if kind in (0x00, 0x01):
            if length < 4:
                raise Refused("snappy chunk is cut short")
            n = _varint(body[4:]) if kind == 0x00 else length - 4
            if n > _SNAPPY_MAX_CHUNK:
                raise Refused(f"snappy chunk of {n} bytes (the format allows {_SNAPPY_MAX_CHUNK})")
            if got + n > size:
                raise _over(size, "snappy")
            try:
                part = snappy.uncompress(body[4:]) if kind == 0x00 else body[4:]
            except Exception as exc:  # noqa: BLE001 - the binding raises several kinds
                raise Refused(f"snappy: {exc}") from None
            if len(part) != n:
                raise Refused("snappy chunk is not the length it states")
            out.append(bytes(part))
            got += n
        elif kind <= 0x7F:
            raise Refused(f"snappy frame holds a chunk of unknown type {kind:#04x}")
        # 0x80 .. 0xfe: padding and skippable chunks
    return b"".join(out)


_DECOMPRESS = {0: None, 1: _gzip, 2: _snappy, 3: _lz4, 4: _zstd}


def decompress(entry_type: int, data: bytes, size: int) -> bytes:
    """A sub-entry's data, decompressed to exactly ``size`` bytes, or ``Refused``."""
    code = (entry_type >> 4) & 0x7
    if code not in _DECOMPRESS:
        raise Refused(f"compression type {code} is not one the stream protocol defines")
    if size > MAX_SUB_ENTRY_BYTES:
        raise Refused(
            f"its header declares {size} bytes uncompressed, more than the "
            f"{MAX_SUB_ENTRY_BYTES} one sub-entry may hold"
        )
    fn = _DECOMPRESS[code]
    out = data if fn is None else fn(data, size)
    if len(out) != size:
        raise Refused(f"{CODECS[code]} data is {len(out)} bytes uncompressed, its header declares {size}")
    return out


def split_records(data: bytes, count: int) -> list[bytes]:
    """``count`` messages of ``[size u32][message]``, which must fill ``data`` exactly."""
    out: list[bytes] = []
    pos = 0
    for i in range(count):
        if pos + 4 > len(data) or pos + 4 + _U32(data, pos)[0] > len(data):
            raise Refused(f"record {i} of {count} runs past the uncompressed data")
        end = pos + 4 + _U32(data, pos)[0]
        out.append(data[pos + 4 : end])
        pos = end
    if pos != len(data):
        raise Refused(f"{len(data) - pos} bytes follow its {count} records")
    return out


def _sub_entry(data: bytes, pos: int, end: int, count: int) -> list[bytes]:
    """The messages of the sub-entry at ``data[pos:end]``, or ``Refused``. Its own function
    so that the decompressed data is let go as soon as it is split."""
    kind = data[pos]
    raw = decompress(kind, data[pos + _SUB_HEADER : end], _U32(data, pos + 3)[0])
    return split_records(raw, count)


def chunk_entries(
    data: bytes, num_entries: int, num_records: int, lo: int, hi: int
) -> Iterator[int | tuple[int, list[bytes]] | Undecodable]:
    """Records ``lo .. hi-1`` of a chunk, entry by entry: ``(position of the first, their
    messages)`` for an entry that decodes, an ``Undecodable`` for one that does not (which
    may reach outside ``lo .. hi-1``). One sub-entry is decompressed per step, announced
    first by the size its header declares (an ``int``)."""
    pos = rec = 0
    for e in range(num_entries):
        if rec >= hi and hi < num_records:  # at the chunk's end, entries of no record remain
            return
        kind = data[pos] if pos < len(data) else 0
        header = _SUB_HEADER if kind & 0x80 else 4
        if pos + header > len(data):
            yield _rest(data, pos, rec, num_records, f"entry {e} is cut short")
            return
        if not kind & 0x80:
            end = pos + 4 + _U32(data, pos)[0]
            count = 1
        else:
            count = _U16(data, pos + 1)[0]
            end = pos + _SUB_HEADER + _U32(data, pos + 7)[0]
        if end > len(data):
            yield _rest(data, pos, rec, num_records, f"entry {e} runs past the chunk's end")
            return
        if not kind & 0x80:
            if lo <= rec < hi:
                yield rec, [data[pos + 4 : end]]
        elif count == 0:
            # its bytes have no offset: whichever read holds its position reports it, once
            if end > pos + _SUB_HEADER and lo <= rec and (rec < hi or rec == num_records):
                yield Undecodable(rec, 0, f"sub-entry ({codec_name(kind)})",
                                  "it holds data but no record", data[pos:end])
        elif rec + count > lo and rec < hi:
            declared = _U32(data, pos + 3)[0]
            if declared <= MAX_SUB_ENTRY_BYTES:
                yield declared  # what decompressing it will take: the caller may hand over what it holds
            try:
                records = _sub_entry(data, pos, end, count)
            except Refused as exc:
                yield Undecodable(rec, count, f"sub-entry ({codec_name(kind)})", str(exc),
                                  data[pos:end])
            else:
                a, b = max(lo, rec) - rec, min(hi, rec + count) - rec
                wanted = records[a:b]
                del records  # the caller holds what it keeps
                yield rec + a, wanted
                del wanted
        rec += count
        pos = end
    if rec < min(hi, num_records):
        yield Undecodable(rec, num_records - rec, "chunk", (
            f"the chunk's entries hold {rec} records, its header {num_records}"), b"")


def _rest(data: bytes, pos: int, rec: int, num_records: int, why: str) -> Undecodable:
    kind = data[pos] if pos < len(data) else 0
    what = f"sub-entry ({codec_name(kind)})" if kind & 0x80 else "entry"
    return Undecodable(rec, max(0, num_records - rec), what, why, data[pos:])
