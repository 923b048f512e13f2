"""AMQP 1.0 messages to ``(key, value)``: positional cuts for the common shapes, rstream's
own decoder for everything else.

``value`` is the message body: the data section, or an amqp-value holding binary or a
string (any other amqp-value: its AMQP encoding); a message that is not AMQP 1.0 encoded,
or that rstream's decoder refuses, is taken whole. Messages of odd shapes are decoded as
rstream decodes them: of several data sections the last one is the body, and a signed
integer key is taken as its text like an unsigned one. ``key`` is ``properties.message_id`` when set, else
the application property ``"key"``, else None; a string is its UTF-8 bytes, a number or
UUID its text (the producer helpers set message_id to the record key).

Large chunks of common shapes are cut out with numpy instead (``arrow.chunk_arrays``).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from rstream import AMQPMessage, amqp_decoder

U32 = struct.Struct(">I").unpack_from
_PROPS8 = b"\x00Ss\xc0"  # properties section, list8
_DATA8 = b"\x00Su\xa0"  # data section, vbin8
_DATA32 = b"\x00Su\xb0"  # data section, vbin32


def _key_bytes(v: Any) -> bytes | None:
    """A message id / property value as bytes (strings UTF-8, numbers and UUIDs as text)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bool):
        return None
    if isinstance(v, int | uuid.UUID):
        return str(v).encode()
    return None


def _body(message: Any) -> bytes:
    body = message.body
    if body is not None:
        return bytes(body)
    value = message.value
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    # any other amqp-value: its AMQP encoding (the section without its 3-byte descriptor)
    return bytes(AMQPMessage(value=value))[3:]


def decode_message(b: bytes) -> tuple[bytes | None, bytes]:
    """``(key, value)`` of one stream message (see the module doc for which key)."""
    if len(b) < 4 or b[0] != 0x00 or b[1] != 0x53 or not (0x70 <= b[2] <= 0x78):
        return None, bytes(b)
    try:
        message = amqp_decoder(bytes(b))
        props = message.properties
        key = _key_bytes(props.message_id) if props is not None else None
        if key is None and message.application_properties:
            app = message.application_properties
            key = _key_bytes(app.get(b"key", app.get("key")))
        return key, _body(message)
    except Exception:  # noqa: BLE001 - rstream's decoder raises many kinds on bad input
        return None, bytes(b)


def decode_chunk(
    data: bytes, num_entries: int, lo: int, hi: int
) -> tuple[list[bytes | None], list[bytes]] | None:
    """Keys and values of records ``lo .. hi-1`` of a chunk's data, in one pass.

    The common message shapes (a properties list whose message_id is a short string or
    binary, then one data section; or a data section alone) are cut out by position;
    anything else goes through ``decode_message``. None when the chunk holds sub-entry
    batches, whose records rstream unpacks (and decompresses).
    """
    keys: list[bytes | None] = []
    values: list[bytes] = []
    kput = keys.append
    vput = values.append
    pos = 0
    for idx in range(min(num_entries, hi)):
        if data[pos] & 0x80:
            return None
        m = pos + 4
        pos = m + U32(data, pos)[0]
        if idx < lo:
            continue
        if data.startswith(_PROPS8, m) and pos - m > 8:
            le = m + 5 + data[m + 4]  # end of the properties list
            c = data[m + 6]
            if data[m + 5] and (c == 0xA1 or c == 0xA0) and m + 8 + data[m + 7] <= le < pos:
                if data.startswith(_DATA8, le) and le + 5 + data[le + 4] == pos:
                    kput(data[m + 8 : m + 8 + data[m + 7]])
                    vput(data[le + 5 : pos])
                    continue
                if data.startswith(_DATA32, le) and le + 8 + U32(data, le + 4)[0] == pos:
                    kput(data[m + 8 : m + 8 + data[m + 7]])
                    vput(data[le + 8 : pos])
                    continue
        elif data.startswith(_DATA8, m) and pos - m > 4 and m + 5 + data[m + 4] == pos:
            kput(None)
            vput(data[m + 5 : pos])
            continue
        key, value = decode_message(data[m:pos])
        kput(key)
        vput(value)
    return keys, values
