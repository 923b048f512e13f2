"""Test data: ``make_records`` (reproducible JSON records), ``produce_kafka``,
``produce_rabbit`` (the stream protocol) and ``publish_amqp`` (AMQP 0.9.1 with pika):
publish them and wait for every acknowledgement."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from devservices.service import ServiceError, _run_async, _to_bytes

# A fixed instant (2025-11-20T12:00:00Z) so generated data is reproducible.
DEFAULT_TS_START_MS = 1_763_640_000_000


def make_records(
    n: int, *, start: int = 0, ts_start_ms: int = DEFAULT_TS_START_MS, step_ms: int = 1000
) -> list[tuple[str, bytes]]:
    """``n`` JSON records ``(key, value)`` numbered from ``start``, each about 100 bytes.

    ``value`` is ``{"id": "k000123", "ts": <millis>, "user": "u7", "page": "/p3", "bytes": 123}``
    with ``ts = ts_start_ms + (i - start) * step_ms``; ``key`` is the id.
    """
    out: list[tuple[str, bytes]] = []
    dumps = json.dumps
    for i in range(start, start + n):
        key = f"k{i:06d}"
        value = dumps(
            {
                "id": key,
                "ts": ts_start_ms + (i - start) * step_ms,
                "user": f"u{i % 17}",
                "page": f"/p{i % 11}",
                "bytes": 100 + (i * 37) % 9000,
            }
        ).encode()
        out.append((key, value))
    return out


def _default_partition(key: bytes | None, index: int, partitions: int) -> int:
    if key is None:
        return index % partitions
    return zlib.crc32(key) % partitions


def produce_kafka(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    *,
    partition_of: Callable[[bytes | None, bytes | None], int] | None = None,
    one_record_per_batch: bool = False,
    timeout: float = 120.0,
    config: dict[str, Any] | None = None,
) -> dict[int, int]:
    """Produce ``records`` ((key, value) or (key, value, timestamp_ms)) to ``topic``.

    ``partition_of(key_bytes, value_bytes) -> partition``; by default
    ``crc32(key) % partitions`` (round robin for a None key), so the partition of a
    record is known before it is sent. The final record of each partition always goes
    in a single-record batch (after a flush), so Tansu's latest offset / high watermark
    is exact afterwards (see the module docstring); with ``one_record_per_batch`` every
    batch holds one record. Order within a partition is kept.

    Returns, per partition written to, the offset after its last delivered record (the
    partition's true end; the count of records when the topic was empty).
    Raises :class:`ServiceError` on any delivery failure.
    """
    from confluent_kafka import KafkaException, Producer

    admin_md = None
    if partition_of is None:
        from confluent_kafka.admin import AdminClient

        admin_md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2}).list_topics(
            topic=topic, timeout=30
        )
        t = admin_md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            raise ServiceError(
                f"topic {topic!r} not found on {bootstrap}: {t.error if t else 'missing'}"
            )
        nparts = len(t.partitions)

    prepared: list[tuple[int, bytes | None, bytes | None, int | None]] = []
    for i, rec in enumerate(records):
        key, value = _to_bytes(rec[0]), _to_bytes(rec[1])
        ts = rec[2] if len(rec) > 2 else None  # type: ignore[misc]
        part = (
            partition_of(key, value)
            if partition_of is not None
            else _default_partition(key, i, nparts)
        )
        prepared.append((part, key, value, ts))
    if not prepared:
        return {}

    last_index: dict[int, int] = {}
    for i, (part, *_rest) in enumerate(prepared):
        last_index[part] = i
    held_back = set(last_index.values())

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "acks": "all",
        "log_level": 2,
        "max.in.flight.requests.per.connection": 1 if one_record_per_batch else 5,
        "queue.buffering.max.messages": 1_000_000,
    }
    if one_record_per_batch:
        conf.update({"batch.num.messages": 1, "linger.ms": 0})
    else:
        conf.update({"batch.num.messages": 10_000, "batch.size": 1_000_000})
    if config:
        conf.update(config)
    producer = Producer(conf)
    ends: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        p, o = msg.partition(), msg.offset()
        if o is not None and o >= 0 and o + 1 > ends.get(p, 0):
            ends[p] = o + 1

    def send(item: tuple[int, bytes | None, bytes | None, int | None]) -> None:
        part, key, value, ts = item
        kwargs: dict[str, Any] = {"partition": part, "on_delivery": on_delivery}
        if ts is not None:
            kwargs["timestamp"] = int(ts)
        while True:
            try:
                producer.produce(topic, value=value, key=key, **kwargs)
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as e:
                raise ServiceError(f"produce to {topic}: {e}") from e

    def flush() -> None:
        remaining = producer.flush(timeout)
        if remaining:
            raise ServiceError(
                f"produce to {topic}: {remaining} records undelivered after {timeout} s"
            )
        if errors:
            raise ServiceError(
                f"produce to {topic}: {len(errors)} delivery errors, first: {errors[0]}"
            )

    for i, item in enumerate(prepared):
        if i in held_back:
            continue
        send(item)
        if one_record_per_batch:
            producer.poll(0)
    flush()
    for i in sorted(held_back):
        send(prepared[i])
    flush()
    return dict(sorted(ends.items()))


def parse_stream_uri(uri: str) -> dict[str, Any]:
    u = urllib.parse.urlsplit(uri)
    if u.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls"):
        raise ValueError(f"not a rabbitmq-stream URI: {uri!r}")
    vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 5552,
        "username": urllib.parse.unquote(u.username or "guest"),
        "password": urllib.parse.unquote(u.password or "guest"),
        "vhost": vhost,
    }


def produce_rabbit(
    stream_uri: str,
    stream: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    *,
    batch_size: int = 500,
    amqp: bool = True,
    timeout: float = 120.0,
) -> int:
    """Publish ``records`` to ``stream`` with rstream and wait for every confirm.

    With ``amqp`` (default) each record is an AMQP 1.0 message: body = value bytes,
    ``properties.message_id`` = key (str; bytes keys are decoded as UTF-8), and
    ``properties.creation_time`` = the record's timestamp when a 3-tuple gives one.
    With ``amqp=False`` each record is sent raw (the value bytes only; no key).
    Returns the number of records confirmed.
    """
    items = list(records)
    if not items:
        return 0
    params = parse_stream_uri(stream_uri)

    async def go() -> int:
        from rstream import AMQPMessage, ConfirmationStatus, Producer, Properties, RawMessage

        confirmed = 0
        failed: list[int] = []
        done = asyncio.Event()
        total = len(items)

        def on_confirm(status: ConfirmationStatus) -> None:
            nonlocal confirmed
            if status.is_confirmed:
                confirmed += 1
            else:
                failed.append(status.response_code)
            if confirmed + len(failed) >= total:
                done.set()

        def to_message(rec: Any) -> Any:
            value = _to_bytes(rec[1]) or b""
            if not amqp:
                return RawMessage(value)
            key = rec[0]
            if isinstance(key, (bytes, bytearray)):
                key = bytes(key).decode("utf-8")
            ts = rec[2] if len(rec) > 2 else None
            props = Properties(message_id=key, creation_time=int(ts) if ts is not None else None)
            return AMQPMessage(body=value, properties=props)

        async with Producer(
            params["host"],
            params["port"],
            username=params["username"],
            password=params["password"],
            vhost=params["vhost"],
            connection_name="rct-produce",
        ) as producer:
            for i in range(0, total, batch_size):
                batch = [to_message(r) for r in items[i : i + batch_size]]
                await producer.send_batch(stream, batch, on_publish_confirm=on_confirm)
            try:
                await asyncio.wait_for(done.wait(), timeout)
            except TimeoutError as e:
                raise ServiceError(
                    f"produce to stream {stream}: {confirmed} of {total} confirmed after {timeout} s"
                ) from e
        if failed:
            raise ServiceError(
                f"produce to stream {stream}: {len(failed)} records rejected, codes {set(failed)}"
            )
        return confirmed

    return _run_async(go)


def publish_amqp(
    host: str,
    port: int,
    stream: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    *,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
    timeout: float = 120.0,
) -> int:
    """Publish ``records`` to ``stream`` over AMQP 0.9.1 with pika, as most RabbitMQ
    applications do: one channel with publisher confirms, so each message is confirmed
    and the stream keeps their order. The key travels as ``message_id`` (RabbitMQ maps it
    to the AMQP 1.0 message-id the product reads as the key), the value as the body, a
    3-tuple's timestamp (ms) as ``timestamp`` (seconds). Returns the count confirmed;
    raises :class:`ServiceError` on a nack or a lost connection."""
    import pika
    from pika.exceptions import AMQPError

    params = pika.ConnectionParameters(host=host, port=port, virtual_host=vhost,
                                       credentials=pika.PlainCredentials(user, password),
                                       blocked_connection_timeout=timeout, socket_timeout=timeout)
    sent = 0
    try:
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()  # basic_publish now raises on a nack or an unroutable message
            for rec in records:
                key, value = rec[0], rec[1]
                stamp = int(rec[2]) // 1000 if len(rec) > 2 else None
                props = pika.BasicProperties(
                    message_id=key.decode() if isinstance(key, bytes) else key, delivery_mode=2,
                    content_type="application/json", timestamp=stamp)
                ch.basic_publish(exchange="", routing_key=stream, body=_to_bytes(value), properties=props,
                                 mandatory=True)
                sent += 1
        finally:
            conn.close()
    except AMQPError as exc:
        raise ServiceError(f"publishing to stream {stream!r} over AMQP 0.9.1 at {host}:{port} failed after "
                           f"{sent} message(s): {exc!r}") from exc
    return sent
