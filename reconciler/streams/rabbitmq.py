"""RabbitMQ Streams partitions, positions and range reads with rstream.

Each stream of a supervisor's stream set is one partition, named by the stream name.
rstream is an asyncio library and the callers here are synchronous (the daemon's
threads, Spark Python workers): every adapter and reader owns a private event loop
(``_Loop``) that it drives itself, so it works from a thread without a loop and even
from a thread that is running one.

The reader talks to rstream's ``Client`` (one connection per broker) rather than its
``Consumer``: the Consumer hands messages one by one to a callback and reconnects on
its own, while a range read wants whole chunks (the chunk header carries the first
offset, the record count and the timestamp) and wants failures reported, not hidden.

Positions:

* ``earliest``: the first chunk delivered to a subscription at ``first`` (an empty
  stream: 0), or StreamStats ``first_chunk_id`` on a server that has StreamStats.
* ``latest`` (the committed end): RabbitMQ 3.10 has no StreamStats command (3.11 added
  it, and rstream has no call for it), so the end is read from the chunk header of
  the first chunk delivered to a subscription at ``last``: that is the last chunk,
  and a chunk is delivered only once committed, so ``first offset + number of
  records`` is a committed end. Nothing delivered means no record (0), and that is
  known for certain, never concluded from a quiet second: see
  ``_Subscription.next_known``; a broker too slow to answer is a ``RetryableError``. On
  a server that answers StreamStats, ``committed_offset + 1`` is used when present
  (``committed_chunk_id`` alone does not give the end, so the chunk header is still
  read then).
* ``offsets_for_time``: a subscription at ``timestamp``; the first delivered chunk
  whose timestamp is >= the time gives the offset (all records of a chunk share the
  chunk's timestamp, which is also their ``stream_time``); none: the end.

Offsets are positions, not record counts: a stream also holds entries no consumer is
ever sent (each ``store_offset`` of an application writes a tracking entry that takes
an offset), so offsets may skip, a range may hold fewer records than its size and a
checkpoint or range boundary may sit on such an entry (the reader then starts at the
next record). ``latest`` is the end of the last record, not of the last entry.

Records: ``value`` is the message body (the AMQP 1.0 data sections, or an
amqp-value holding binary or a string; a message that is not AMQP 1.0 encoded is
taken whole), ``key`` is the AMQP ``properties.message_id`` when set, else the
application property ``"key"``, else null (the producer helpers set message_id to the
record key). The stream URI may hold ``${env:..}`` / ``${file:..}`` references; they
are resolved just before connecting and messages only ever show ``redact_uri``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import re
import ssl
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
from rstream import exceptions as rexc
from rstream import schema
from rstream.client import Client
from rstream.connection import Connection, ConnectionClosed
from rstream.constants import OffsetType

from reconciler.errors import PermanentError, ReconcilerError, RetryableError
from reconciler.spec import secrets
from reconciler.spec.model import RabbitSource
from reconciler.streams.base import RECORD_SCHEMA, PartitionRange, SourceMissing

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0  # seconds: connecting, each request, waiting for a range
READ_CREDIT = 128  # chunks in flight per read subscription (the measured knee)
MAX_SUBSCRIPTIONS = 200  # per connection (the protocol allows 256 ids)

_REF = re.compile(r"\$\{(?:env|file):[^}]+\}")


# --------------------------------------------------------------------------- the URI


@dataclass(frozen=True)
class StreamEndpoint:
    host: str
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    tls: bool = False


def parse_stream_uri(uri: str) -> StreamEndpoint:
    """``rabbitmq-stream[+tls]://user:pass@host:port/vhost`` with references resolved.

    References (``${env:..}``, ``${file:/path}``) may stand anywhere in the user
    information; they are replaced by their values after the URI is split, so a value
    may hold any character. Literal parts are percent-decoded; the vhost ``%2f`` is ``/``.
    """
    refs: list[str] = []

    def hide(m: re.Match[str]) -> str:
        refs.append(m.group(0))
        return f"REFERENCE{len(refs) - 1}X"

    masked = _REF.sub(hide, uri)
    shown = secrets.redact_uri(uri)
    try:
        parts = urlsplit(masked)
        port = parts.port
    except ValueError as exc:
        raise PermanentError(f"invalid RabbitMQ stream URI {shown}: {exc}") from None
    if parts.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls"):
        raise PermanentError(
            f"invalid RabbitMQ stream URI {shown}: the scheme must be rabbitmq-stream:// "
            "or rabbitmq-stream+tls://"
        )
    if not parts.hostname:
        raise PermanentError(f"invalid RabbitMQ stream URI {shown}: no host")
    tls = parts.scheme.endswith("+tls")

    def reveal(text: str | None, default: str) -> str:
        if text is None:
            return default
        out = unquote(re.sub(r"REFERENCE(\d+)X", lambda m: f"\x00{m.group(1)}\x00", text))
        return re.sub(r"\x00(\d+)\x00", lambda m: secrets.resolve(refs[int(m.group(1))]), out)

    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return StreamEndpoint(
        host=parts.hostname,
        port=port or (5551 if tls else 5552),
        vhost=unquote(path) if path else "/",
        username=reveal(parts.username, "guest"),
        password=reveal(parts.password, "guest"),
        tls=tls,
    )


# --------------------------------------------------------------------------- event loop


class _Loop:
    """A private event loop, driven by whoever calls ``run``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def run(self, coro: Awaitable[T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        # Called from a coroutine of some other loop: drive ours on a helper thread.
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rabbit-loop")
        return self._pool.submit(self._loop.run_until_complete, coro).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def _drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2)

        try:
            self.run(_drain())
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        self._loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


# --------------------------------------------------------------------------- errors


def _translate(exc: BaseException, doing: str, where: str, timeout: float) -> ReconcilerError:
    if isinstance(exc, ReconcilerError):
        return exc
    if isinstance(exc, rexc.AuthenticationFailure | rexc.SASLAuthenticationFailureLoopback):
        return PermanentError(
            f"{doing}: RabbitMQ at {where} refused the user name or password; check the "
            "credentials in the stream URI (and the secret it references)"
        )
    if isinstance(exc, rexc.VirtualHostAccessFailure):
        return PermanentError(
            f"{doing}: RabbitMQ at {where}: the virtual host does not exist or the user may "
            "not access it (the vhost is the URI path, URL-encoded: %2f is /)"
        )
    if isinstance(exc, rexc.AccessRefused):
        return PermanentError(
            f"{doing}: RabbitMQ at {where} refused access; check the user's permissions"
        )
    if isinstance(exc, rexc.StreamDoesNotExist):
        return SourceMissing(f"{doing}: the stream does not exist on {where}")
    if isinstance(
        exc, rexc.SASLMechanismNotSupported | rexc.SASLError | ssl.SSLCertVerificationError
    ):
        return PermanentError(f"{doing}: RabbitMQ at {where}: {type(exc).__name__} {exc}")
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return RetryableError(
            f"{doing}: RabbitMQ at {where} did not answer within {timeout:g}s; check that the "
            "node is up and its stream port is reachable",
            retry_after=min(5.0, timeout),
        )
    if isinstance(exc, OSError | ConnectionClosed | ConnectionError | EOFError):
        return RetryableError(
            f"{doing}: cannot reach the RabbitMQ stream port at {where} ({type(exc).__name__}: "
            f"{exc}); check the URI's host and port (default 5552), that the node is up and "
            "that the rabbitmq_stream plugin is enabled",
            retry_after=min(5.0, timeout),
        )
    if isinstance(exc, rexc.StreamNotAvailable | rexc.LeaderNotAvailable | rexc.InternalError):
        return RetryableError(f"{doing}: RabbitMQ at {where}: the stream is not available yet")
    if isinstance(exc, rexc.ServerError) or exc.__class__ is rexc.ServerError:
        return RetryableError(f"{doing}: RabbitMQ at {where}: {type(exc).__name__} {exc}")
    return RetryableError(f"{doing}: RabbitMQ at {where}: {type(exc).__name__}: {exc}")


async def _ignore_close(*_: Any) -> None:
    return None


# --------------------------------------------------------------------------- connections


class _WholeFrameConnection(Connection):
    """rstream's connection, reading each frame whole instead of 256 bytes at a time.

    Installed on a started client (``__class__`` swap), so it first drains what the
    original reader had already buffered.
    """

    async def _exactly(self, n: int) -> bytes:
        assert self._reader is not None
        buf = self._buffer
        try:
            if buf:
                if len(buf) >= n:
                    data = bytes(buf[:n])
                    del buf[:n]
                    return data
                head = bytes(buf)
                buf.clear()
                return head + await self._reader.readexactly(n - len(head))
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ConnectionClosed() from None

    async def _read_frame_raw(self) -> bytes:  # type: ignore[override]
        return await self._exactly(int.from_bytes(await self._exactly(4), "big"))


class _Connections:
    """A locator connection plus one connection per broker that serves a stream."""

    def __init__(self, endpoint: StreamEndpoint, timeout: float, name: str):
        self.endpoint = endpoint
        self.timeout = timeout
        self.name = name
        self._locator: Client | None = None
        self._brokers: dict[tuple[str, int], Client] = {}
        self._ids: dict[int, int] = {}  # id(client) -> next subscription id

    async def _open(self, host: str, port: int) -> Client:
        ep = self.endpoint
        ctx = None
        if ep.tls:
            ctx = ssl.create_default_context()
        client = Client(
            host=host,
            port=port,
            ssl_context=ctx,
            frame_max=8 * 1024 * 1024,
            heartbeat=0,  # readers pause between batches; our own timeouts bound every wait
            connection_name=self.name,
            connection_closed_handler=_ignore_close,
        )
        try:
            await asyncio.wait_for(client.start(), self.timeout)
            if type(client._conn) is Connection:
                client._conn.__class__ = _WholeFrameConnection
            await asyncio.wait_for(
                client.authenticate(ep.vhost, ep.username, ep.password), self.timeout
            )
        except BaseException:
            await _close_client(client)
            raise
        return client

    async def locator(self) -> Client:
        if self._locator is None or not self._locator.is_connection_alive():
            self._locator = await self._open(self.endpoint.host, self.endpoint.port)
        return self._locator

    def server_version(self) -> tuple[int, ...]:
        props = (self._locator.server_properties if self._locator else None) or {}
        nums = re.findall(r"\d+", str(props.get("version", "")))[:3]
        return tuple(int(n) for n in nums)

    async def for_stream(self, stream: str, *, leader: bool) -> Client:
        loc = await self.locator()
        lead, replicas = await loc.query_leader_and_replicas(stream)
        broker = lead if leader or not replicas else random.choice(replicas)
        addr = (broker.host, int(broker.port))
        props = loc.server_properties or {}
        if addr == (
            props.get("advertised_host"),
            int(props.get("advertised_port", -1)),
        ) or addr == (
            self.endpoint.host,
            self.endpoint.port,
        ):
            return loc
        client = self._brokers.get(addr)
        if client is None or not client.is_connection_alive():
            client = self._brokers[addr] = await self._open(*addr)
        return client

    def next_id(self, client: Client) -> int:
        n = self._ids.get(id(client), 0)
        self._ids[id(client)] = n + 1
        if n >= 255:
            raise RetryableError("too many subscriptions on one RabbitMQ connection")
        return n

    async def close(self) -> None:
        clients = list(self._brokers.values())
        if self._locator is not None:
            clients.append(self._locator)
        self._brokers.clear()
        self._locator = None
        await asyncio.gather(*(_close_client(c) for c in clients), return_exceptions=True)


async def _close_client(client: Client) -> None:
    """Close a connection without rstream's fixed 0.2 s pause."""
    try:
        if client.is_connection_alive() and client.is_started:
            await asyncio.wait_for(
                client.sync_request(
                    schema.Close(client._corr_id_seq.next(), code=1, reason="OK"),
                    resp_schema=schema.CloseResponse,
                ),
                1.0,
            )
    except BaseException:  # noqa: BLE001 - the connection may already be gone
        pass
    try:
        client._is_not_closed = False
        for name in list(client._tasks):
            await client.stop_task(name)
        conn = client._conn
        client._conn = None
        if conn is not None and conn._writer is not None:
            conn._writer.close()
            try:
                await asyncio.wait_for(conn._writer.wait_closed(), 1.0)
            except BaseException:  # noqa: BLE001
                pass
    except AttributeError:  # a future rstream: fall back to its own close
        await client.close()


class _Subscription:
    """Chunks delivered to one subscription, in a queue; credit is granted as they are taken."""

    def __init__(self, client: Client, sub_id: int, stream: str):
        self.client = client
        self.sub_id = sub_id
        self.stream = stream
        self.queue: asyncio.Queue[schema.Deliver] = asyncio.Queue()
        self._active = False

    def _on_frame(self, frame: schema.Deliver) -> None:
        if frame.subscription_id == self.sub_id:
            self.queue.put_nowait(frame)

    async def start(self, spec: schema.OffsetSpec, credit: int) -> None:
        name = str(self.sub_id)
        self.client.add_handler(schema.Deliver, self._on_frame, name=name)
        await self.client.run_queue_listener_task(self.sub_id, self._on_frame)
        self._active = True
        await self.client.subscribe(self.stream, self.sub_id, spec, initial_credit=credit)

    async def next(self, timeout: float) -> schema.Deliver | None:
        try:
            frame = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            if not self.client.is_connection_alive():
                raise ConnectionClosed() from None
            return None
        return frame

    def _received(self) -> bool:
        # A Deliver the connection has read sits in rstream's per-subscription queue until
        # its delivery task hands it to ``_on_frame``: it has been received either way.
        waiting = getattr(self.client, "_frames", {}).get(self.sub_id)
        return not self.queue.empty() or bool(waiting is not None and not waiting.empty())

    async def next_known(self, timeout: float) -> schema.Deliver | None:
        """The next chunk the server has for this subscription now, or None when it has none.

        Certain, not a guess from silence: the server sends the chunks it has for a
        subscription (after Subscribe, after Credit) while it handles that request, before
        it reads the next one from the connection. So once the answer to a later request on
        the same connection (a Metadata request, the fence) is in, a chunk not received
        before it does not exist. A fence that is not answered within ``timeout`` raises
        (retryable): a slow broker is never taken for an empty stream.
        """
        if not self._received():
            if not await asyncio.wait_for(self.client.stream_exists(self.stream), timeout):
                raise rexc.StreamDoesNotExist(self.stream)
            if not self._received():
                return None
        frame = await self.next(timeout)
        if frame is None:
            raise TimeoutError(f"a chunk of stream {self.stream!r} was received but not handed over")
        return frame

    def drain(self) -> list[schema.Deliver]:
        out = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out

    async def credit(self, n: int) -> None:
        if n > 0:
            await self.client.credit(self.sub_id, n)

    async def stop(self) -> None:
        if not self._active:
            return
        self._active = False
        try:
            if self.client.is_connection_alive():
                await asyncio.wait_for(self.client.unsubscribe(self.sub_id), 2.0)
        except BaseException:  # noqa: BLE001 - best effort
            pass
        self.client.remove_handler(schema.Deliver, name=str(self.sub_id))
        await self.client.stop_queue_listener_task(self.sub_id)


async def _subscribe(
    conns: _Connections, stream: str, spec: schema.OffsetSpec, credit: int, *, leader: bool
) -> _Subscription:
    client = await conns.for_stream(stream, leader=leader)
    sub = _Subscription(client, conns.next_id(client), stream)
    try:
        await sub.start(spec, credit)
    except BaseException:
        await sub.stop()
        raise
    return sub


async def _first_chunk(
    conns: _Connections, stream: str, spec: schema.OffsetSpec, timeout: float
) -> schema.Deliver | None:
    """The first chunk of user records at ``spec``; None when the stream has none there."""
    sub = await _subscribe(conns, stream, spec, 1, leader=True)
    try:
        return await sub.next_known(timeout)
    finally:
        await sub.stop()


def _spec(kind: OffsetType, value: int | None = None) -> schema.OffsetSpec:
    return schema.OffsetSpec.from_params(kind, value)


# --------------------------------------------------------------------------- StreamStats


class _StatsKey:
    """Stands for command key 28 (StreamStats), which rstream's ``Key`` enum lacks."""

    value = 28


@dataclass
class _StreamStatsRequest(schema.Frame):
    key = _StatsKey  # type: ignore[assignment]
    correlation_id: int = field(metadata={"type": schema.T.uint32})
    stream: str = field(metadata={"type": schema.T.string})


_StreamStatsRequest.prepare()


def decode_stream_stats_response(payload: bytes) -> tuple[int, int, dict[str, int]]:
    """``(correlation id, response code, stats)`` from a StreamStats response frame body
    (the bytes after the 4-byte frame length)."""
    pos = 4  # key (0x801c) + version
    corr = int.from_bytes(payload[pos : pos + 4], "big")
    code = int.from_bytes(payload[pos + 4 : pos + 6], "big")
    pos += 6
    stats: dict[str, int] = {}
    if len(payload) >= pos + 4:
        count = int.from_bytes(payload[pos : pos + 4], "big", signed=True)
        pos += 4
        for _ in range(max(0, count)):
            n = int.from_bytes(payload[pos : pos + 2], "big")
            name = payload[pos + 2 : pos + 2 + n].decode("utf-8")
            pos += 2 + n
            stats[name] = int.from_bytes(payload[pos : pos + 8], "big", signed=True)
            pos += 8
    return corr, code, stats


async def _stream_stats(conns: _Connections, stream: str) -> dict[str, int] | None:
    """StreamStats (RabbitMQ >= 3.11) on a connection of its own; None where unsupported.

    rstream cannot decode the response (its command enum has no StreamStats), so this
    one request/response exchange is done on a separate plain connection: the
    handshake frames are rstream's, the StreamStats frames are encoded here.
    """
    await conns.locator()
    if conns.server_version() < (3, 11):
        return None
    from rstream.encoding import decode_frame

    ep = conns.endpoint
    conn = Connection(ep.host, ep.port, ssl.create_default_context() if ep.tls else None)
    await conn.open()
    try:
        corr = 0

        async def request(frame: schema.Frame) -> schema.Frame:
            await conn.write_frame(frame)
            while True:
                got = decode_frame(await conn._read_frame_raw())
                if isinstance(got, schema.Tune):
                    await conn.write_frame(schema.Tune(frame_max=got.frame_max, heartbeat=0))
                    continue
                if getattr(got, "correlation_id", None) == frame.correlation_id:  # type: ignore[attr-defined]
                    got.check_response_code()
                    return got

        def cid() -> int:
            nonlocal corr
            corr += 1
            return corr

        await request(schema.PeerProperties(cid(), properties=[]))
        await request(schema.SaslHandshake(cid()))
        auth = b"\0" + ep.username.encode() + b"\0" + ep.password.encode()
        await request(schema.SaslAuthenticate(cid(), mechanism="PLAIN", data=auth))
        # the server sends Tune next; answer it, then open the vhost
        tune = decode_frame(await conn._read_frame_raw())
        if isinstance(tune, schema.Tune):
            await conn.write_frame(schema.Tune(frame_max=tune.frame_max, heartbeat=0))
        await request(schema.Open(cid(), virtual_host=ep.vhost))
        req = _StreamStatsRequest(cid(), stream)
        await conn.write_frame(req)
        while True:
            raw = bytes(await conn._read_frame_raw())
            key = int.from_bytes(raw[:2], "big")
            if key == 0x8000 | 28:
                got_corr, code, stats = decode_stream_stats_response(raw)
                if got_corr != req.correlation_id:
                    continue
                if code == rexc.StreamDoesNotExist.code:
                    raise rexc.StreamDoesNotExist()
                if code > 1:
                    return None
                return stats
    finally:
        await conn.close()


# --------------------------------------------------------------------------- AMQP 1.0


_FIXED_WIDTH = {
    **dict.fromkeys((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0),
    **dict.fromkeys((0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56), 1),
    **dict.fromkeys((0x60, 0x61), 2),
    **dict.fromkeys((0x70, 0x71, 0x72, 0x73, 0x74), 4),
    **dict.fromkeys((0x80, 0x81, 0x82, 0x83, 0x84), 8),
    **dict.fromkeys((0x94, 0x98), 16),
}
_SHORT = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_LONG = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))
_STR_SHORT = frozenset((0xA0, 0xA1, 0xA3))
_STR_LONG = frozenset((0xB0, 0xB1, 0xB3))


def _skip(b: bytes, i: int) -> int:
    """The position after the AMQP value that starts at ``i``."""
    c = b[i]
    i += 1
    n = _FIXED_WIDTH.get(c)
    if n is not None:
        return i + n
    if c in _SHORT:
        return i + 1 + b[i]
    if c in _LONG:
        return i + 4 + int.from_bytes(b[i : i + 4], "big")
    if c == 0x00:  # described value: descriptor, then value
        return _skip(b, _skip(b, i))
    raise ValueError(f"unknown AMQP constructor 0x{c:02x}")


def _id_bytes(b: bytes, i: int) -> bytes | None:
    """A message id / property value as bytes (strings UTF-8, numbers and UUIDs as text)."""
    c = b[i]
    if c in _STR_SHORT:
        n = b[i + 1]
        return b[i + 2 : i + 2 + n]
    if c in _STR_LONG:
        n = int.from_bytes(b[i + 1 : i + 5], "big")
        return b[i + 5 : i + 5 + n]
    if c == 0x40:
        return None
    if c == 0x98:
        return str(uuid.UUID(bytes=bytes(b[i + 1 : i + 17]))).encode()
    if c == 0x44 or c == 0x43:
        return b"0"
    if c in (0x53, 0x52, 0x50):
        return str(b[i + 1]).encode()
    if c in (0x80, 0x70, 0x60):
        width = _FIXED_WIDTH[c]
        return str(int.from_bytes(b[i + 1 : i + 1 + width], "big")).encode()
    return None


def _compound(b: bytes, i: int) -> tuple[int, int, int]:
    """``(first item position, item count, end position)`` of a list or map at ``i``."""
    c = b[i]
    if c == 0x45:
        return i + 1, 0, i + 1
    if c in (0xC0, 0xC1):
        return i + 3, b[i + 2], i + 2 + b[i + 1]
    if c in (0xD0, 0xD1):
        size = int.from_bytes(b[i + 1 : i + 5], "big")
        return i + 9, int.from_bytes(b[i + 5 : i + 9], "big"), i + 5 + size
    raise ValueError("not a list or map")


def decode_message(b: bytes) -> tuple[bytes | None, bytes]:
    """``(key, value)`` of one stream message (see the module doc for which key)."""
    if len(b) < 4 or b[0] != 0x00 or b[1] != 0x53 or not (0x70 <= b[2] <= 0x78):
        return None, bytes(b)
    try:
        return _decode_sections(b)
    except (IndexError, ValueError):
        return None, bytes(b)


_U32 = struct.Struct(">I").unpack_from
_PROPS8 = b"\x00Ss\xc0"  # properties section, list8
_DATA8 = b"\x00Su\xa0"  # data section, vbin8
_DATA32 = b"\x00Su\xb0"  # data section, vbin32


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
        pos = m + _U32(data, pos)[0]
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
                if data.startswith(_DATA32, le) and le + 8 + _U32(data, le + 4)[0] == pos:
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


def _decode_sections(b: bytes) -> tuple[bytes | None, bytes]:
    n = len(b)
    i = 0
    key: bytes | None = None
    app_key: bytes | None = None
    body: bytes | None = None
    parts: list[bytes] | None = None
    while i < n:
        if b[i] != 0x00:
            raise ValueError("not a section")
        d = b[i + 1]
        if d == 0x53:
            code = b[i + 2]
            i += 3
        elif d == 0x80:
            code = int.from_bytes(b[i + 2 : i + 10], "big")
            i += 10
        else:
            raise ValueError("unsupported section descriptor")
        if code == 0x75:  # data
            c = b[i]
            if c == 0xA0:
                chunk = b[i + 2 : i + 2 + b[i + 1]]
                i += 2 + b[i + 1]
            elif c == 0xB0:
                size = int.from_bytes(b[i + 1 : i + 5], "big")
                chunk = b[i + 5 : i + 5 + size]
                i += 5 + size
            else:
                raise ValueError("data section is not binary")
            if body is None:
                body = chunk
            else:
                parts = parts or [body]
                parts.append(chunk)
        elif code == 0x73:  # properties: message_id is the first field
            first, count, end = _compound(b, i)
            if count:
                key = _id_bytes(b, first)
            i = end
        elif code == 0x74 and key is None:  # application-properties: "key"
            pos, count, end = _compound(b, i)
            for _ in range(count // 2):
                name = _id_bytes(b, pos)
                pos = _skip(b, pos)
                if name == b"key":
                    app_key = _id_bytes(b, pos)
                    break
                pos = _skip(b, pos)
            i = end
        elif code == 0x77 and body is None:  # amqp-value
            c = b[i]
            end = _skip(b, i)
            if c in _STR_SHORT or c in _STR_LONG:
                body = _id_bytes(b, i)
            else:
                body = b[i:end]
            i = end
        else:
            i = _skip(b, i)
    if i != n:
        raise ValueError("trailing bytes")
    if parts is not None:
        value = b"".join(parts)
    else:
        value = bytes(body) if body is not None else b""
    k = key if key is not None else app_key
    return (bytes(k) if k is not None else None), value


# --------------------------------------------------------------------------- the adapter


class RabbitStreamAdapter:
    """Positions of a set of RabbitMQ streams; each stream is one partition."""

    def __init__(
        self,
        source: RabbitSource,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        empty_wait: float | None = None,
    ):
        # ``empty_wait`` is accepted for old callers and unused: emptiness is no longer
        # concluded from waiting (see ``_Subscription.next_known``).
        del empty_wait
        self.source = source
        self.timeout = timeout
        self.where = secrets.redact_uri(source.uri)

    # -- plumbing ---------------------------------------------------------------------

    def _run(self, doing: str, work: Callable[[_Connections], Awaitable[T]]) -> T:
        endpoint = parse_stream_uri(self.source.uri)  # resolves references, now
        loop = _Loop()

        async def main() -> T:
            conns = _Connections(endpoint, self.timeout, "stream-reconciler-positions")
            try:
                return await work(conns)
            finally:
                await conns.close()

        try:
            return loop.run(main())
        except BaseException as exc:  # noqa: BLE001 - translated for the caller
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise _translate(exc, doing, self.where, self.timeout) from None
        finally:
            loop.close()

    async def _per_stream(
        self, conns: _Connections, fn: Callable[[_Connections, str], Awaitable[int]]
    ) -> dict[str, int]:
        streams = list(self.source.streams)
        out: dict[str, int] = {}
        for i in range(0, len(streams), MAX_SUBSCRIPTIONS):
            group = streams[i : i + MAX_SUBSCRIPTIONS]
            values = await asyncio.gather(*(self._named(fn, conns, s) for s in group))
            out.update(zip(group, values, strict=True))
        return out

    async def _named(
        self, fn: Callable[[_Connections, str], Awaitable[int]], conns: _Connections, stream: str
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
        return SourceMissing(
            f"stream {stream!r} does not exist in vhost {vhost!r} on {self.where}"
        )

    async def _first_chunk(
        self, conns: _Connections, stream: str, spec: schema.OffsetSpec
    ) -> schema.Deliver | None:
        return await _first_chunk(conns, stream, spec, self.timeout)

    async def _stats(self, conns: _Connections, stream: str) -> dict[str, int] | None:
        """StreamStats where the server has it; None (use subscriptions) on any trouble.

        No server here has StreamStats (3.10.8), so this path falls back on every error
        rather than let an untested exchange break positions.
        """
        try:
            return await asyncio.wait_for(_stream_stats(conns, stream), self.timeout)
        except rexc.StreamDoesNotExist:
            raise
        except Exception as exc:  # noqa: BLE001
            log.debug("StreamStats for %r failed (%s); using subscriptions", stream, exc)
            return None

    async def _earliest(self, conns: _Connections, stream: str) -> int:
        stats = await self._stats(conns, stream)
        if stats is not None and "first_chunk_id" in stats:
            return max(0, stats["first_chunk_id"])
        frame = await self._first_chunk(conns, stream, _spec(OffsetType.FIRST))
        return frame.chunk_first_offset if frame is not None else 0

    async def _latest(self, conns: _Connections, stream: str) -> int:
        stats = await self._stats(conns, stream)
        if stats is not None:
            if stats.get("committed_offset", -1) >= 0:
                return stats["committed_offset"] + 1
            if stats.get("committed_chunk_id", 0) < 0:
                return max(0, stats.get("first_chunk_id", 0))  # empty
        frame = await self._first_chunk(conns, stream, _spec(OffsetType.LAST))
        if frame is None:
            return 0
        return frame.chunk_first_offset + frame.num_records

    async def _for_time(self, conns: _Connections, stream: str, ts: int) -> int:
        # The end, looked up alongside: it says when the chunks before ``ts`` ran out.
        latest = asyncio.ensure_future(self._latest(conns, stream))
        sub = await _subscribe(conns, stream, _spec(OffsetType.TIMESTAMP, ts), 1, leader=True)
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

    # -- StreamAdapter ----------------------------------------------------------------

    def partitions(self) -> list[str]:
        async def check(conns: _Connections) -> list[str]:
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

        async def per(conns: _Connections, stream: str) -> int:
            return await self._for_time(conns, stream, ts)

        return self._run("looking up offsets by time", lambda c: self._per_stream(c, per))

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connections."""


# --------------------------------------------------------------------------- the reader


VECTOR_MIN_RECORDS = 32  # chunks at least this large are cut out with numpy


def _walk(data: bytes, num_entries: int, hi: int) -> np.ndarray | None:
    """Entry boundaries ``[e0, e1, ..., e_hi]`` of a chunk of simple entries; None for
    sub-entry batches or sizes that do not fit the data."""
    bounds = [0] * (hi + 1)
    pos = 0
    u32 = _U32
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


class _Columns:
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
        if decoded is None:  # sub-entry batches (possibly compressed): rstream unpacks them
            pairs = [decode_message(m) for m in frame.get_messages()[lo:hi]]
            decoded = [p[0] for p in pairs], [p[1] for p in pairs]
        self._keys.extend(decoded[0])
        self._values.extend(decoded[1])
        self._offsets.extend(range(first + lo, first + hi))
        self._stamps.extend([frame.timestamp] * k)
        self.rows += k

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

    def close(self) -> None:
        """Nothing to release: every ``read`` opens and closes its own connections."""

    async def _check_gap(
        self, conns: _Connections, stream: str, start: int, delivered: int, doing: str
    ) -> None:
        """Offsets ``[start, delivered)`` hold no record that can be read: bookkeeping entries
        (offsets stored by consumers, never sent to anyone), or records retention deleted.

        Retention deletes whole segments from the head of the stream, so when the stream's
        first record is at or before ``start`` nothing after it was deleted and the gap is
        bookkeeping only: normal. Otherwise the broker cannot tell the two apart; the
        supervisor's retention check (run after any failed batch) records the loss or
        stops, so this batch fails retryably rather than guess."""
        first = await _first_chunk(conns, stream, _spec(OffsetType.FIRST), self.timeout)
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
        loop = _Loop()
        conns = _Connections(endpoint, self.timeout, "stream-reconciler-reader")
        sub: _Subscription | None = None
        cols = _Columns(stream)

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
                raise _translate(exc, doing, self.where, self.timeout) from None

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
                _subscribe(
                    conns, stream, _spec(OffsetType.OFFSET, start), self.credit, leader=False
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
                            run(self._check_gap(conns, stream, start, frame.chunk_first_offset, doing))
                    chunk_end = frame.chunk_first_offset + frame.num_records
                    if chunk_end <= position:
                        continue  # a chunk before the position (the chunk holding start comes first)
                    cols.add_chunk(frame, position, end)
                    position = max(position, min(chunk_end, end))
                    if position >= end:
                        break
                while len(cols) >= max_batch_rows:
                    yield cols.batch(max_batch_rows)
            if len(cols):
                yield cols.batch(len(cols))
        finally:
            try:
                if sub is not None:
                    loop.run(asyncio.wait_for(sub.stop(), 3.0))
                loop.run(asyncio.wait_for(conns.close(), 3.0))
            except BaseException:  # noqa: BLE001 - best effort
                pass
            loop.close()
