"""Connections and subscriptions on rstream's ``Client``, and its exceptions translated.

The reader talks to rstream's ``Client`` (one connection per broker) rather than its
``Consumer``: the Consumer hands messages one by one to a callback and reconnects on its
own, while a range read wants whole chunks (the chunk header carries the first offset,
the record count and the timestamp) and wants failures reported, not hidden.
Private-attribute workarounds live in ``_rstream``.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
from typing import Any

from rstream import exceptions as rexc
from rstream import schema
from rstream.client import Client
from rstream.connection import ConnectionClosed
from rstream.constants import OffsetType

from reconciler.errors import PermanentError, ReconcilerError, RetryableError
from reconciler.streams.base import SourceMissing
from reconciler.streams.rabbitmq._rstream import close_quickly, frames_waiting, read_whole_frames
from reconciler.streams.rabbitmq.uri import StreamEndpoint


def translate(exc: BaseException, doing: str, where: str, timeout: float) -> ReconcilerError:
    """rstream's (and the socket's) exceptions as ours, with what a person can check."""
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
            "node is up and its stream port is reachable"
        )
    if isinstance(exc, OSError | ConnectionClosed | ConnectionError | EOFError):
        return RetryableError(
            f"{doing}: cannot reach the RabbitMQ stream port at {where} ({type(exc).__name__}: "
            f"{exc}); check the URI's host and port (default 5552), that the node is up and "
            "that the rabbitmq_stream plugin is enabled"
        )
    if isinstance(exc, rexc.StreamNotAvailable | rexc.LeaderNotAvailable | rexc.InternalError):
        return RetryableError(f"{doing}: RabbitMQ at {where}: the stream is not available yet")
    if isinstance(exc, rexc.ServerError) or exc.__class__ is rexc.ServerError:
        return RetryableError(f"{doing}: RabbitMQ at {where}: {type(exc).__name__} {exc}")
    return RetryableError(f"{doing}: RabbitMQ at {where}: {type(exc).__name__}: {exc}")


async def _ignore_close(*_: Any) -> None:
    return None


class Connections:
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
            read_whole_frames(client)
            await asyncio.wait_for(
                client.authenticate(ep.vhost, ep.username, ep.password), self.timeout
            )
        except BaseException:
            await close_quickly(client)
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
        await asyncio.gather(*(close_quickly(c) for c in clients), return_exceptions=True)


class Subscription:
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
        return not self.queue.empty() or frames_waiting(self.client, self.sub_id)

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
            raise TimeoutError(
                f"a chunk of stream {self.stream!r} was received but not handed over"
            )
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


async def subscribe(
    conns: Connections, stream: str, spec: schema.OffsetSpec, credit: int, *, leader: bool
) -> Subscription:
    client = await conns.for_stream(stream, leader=leader)
    sub = Subscription(client, conns.next_id(client), stream)
    try:
        await sub.start(spec, credit)
    except BaseException:
        await sub.stop()
        raise
    return sub


async def first_chunk(
    conns: Connections, stream: str, spec: schema.OffsetSpec, timeout: float
) -> schema.Deliver | None:
    """The first chunk of user records at ``spec``; None when the stream has none there."""
    sub = await subscribe(conns, stream, spec, 1, leader=True)
    try:
        return await sub.next_known(timeout)
    finally:
        await sub.stop()


def offset_spec(kind: OffsetType, value: int | None = None) -> schema.OffsetSpec:
    return schema.OffsetSpec.from_params(kind, value)
