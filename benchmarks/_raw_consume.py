"""Baselines: how fast one bare client drains ranges, with no Arrow, parsing or Spark.

The benchmarks compare the product's readers (``reconciler.streams``) and pipeline
against these numbers, measured on the same broker in the same run:

* ``raw_kafka_consume_rate``: one confluent-kafka consumer (``fetch.queue.backoff.ms=10``,
  which is what lifts librdkafka from ~180 k to over 1 M records/s on loopback), every
  partition assigned at once, counting records until each partition reaches its end.
* ``raw_rabbit_consume_rate``: one rstream connection per stream's broker, one
  subscription per stream at offset 0 with generous credit, counting the records in
  each delivered chunk header (no message is decoded).

Each returns ``{"records", "seconds", "records_per_s"}``; time runs from before the
client connects (as it does for the product's readers) until the last record arrived.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def _rate(records: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": round(seconds, 4),
        "records_per_s": round(records / seconds, 1) if seconds > 0 else None,
    }


def raw_kafka_consume_rate(
    bootstrap: str,
    topic: str,
    partitions_ends: Mapping[int | str, int],
    *,
    timeout: float = 30.0,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Consume offsets ``[0, end)`` of each partition with one tuned consumer."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ends = {int(p): int(e) for p, e in partitions_ends.items() if int(e) > 0}
    started = time.perf_counter()
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"raw-baseline-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.queue.backoff.ms": 10,
        "auto.offset.reset": "earliest",
        "log_level": 2,
    }
    conf.update(config or {})
    consumer = Consumer(conf)
    records = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        pending = set(ends)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"raw Kafka baseline: partitions {sorted(pending)} of {topic} did not reach "
                    f"their ends within {timeout:g}s"
                )
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                p = msg.partition()
                if err is None:
                    if p in pending and msg.offset() < ends[p]:
                        records += 1
                        if msg.offset() + 1 >= ends[p]:
                            pending.discard(p)
                elif err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends.get(p, 0):
                        pending.discard(p)
                else:
                    raise RuntimeError(f"raw Kafka baseline: {err.str()}")
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return _rate(records, elapsed)


def raw_rabbit_consume_rate(
    uri: str,
    streams: Sequence[str],
    ends: Mapping[str, int],
    *,
    timeout: float = 30.0,
    credit: int = 128,
) -> dict[str, Any]:
    """Receive offsets ``[0, end)`` of each stream, counting records per chunk header."""
    from rstream import schema
    from rstream.client import Client
    from rstream.constants import OffsetType

    from reconciler.streams.rabbitmq import parse_stream_uri

    endpoint = parse_stream_uri(uri)
    wanted = {s: int(ends[s]) for s in streams if int(ends.get(s, 0)) > 0}

    async def ignore(*_: Any) -> None:
        return None

    async def main() -> tuple[int, float]:
        started = time.perf_counter()
        client = Client(
            endpoint.host,
            endpoint.port,
            frame_max=8 * 1024 * 1024,
            heartbeat=0,
            connection_name="raw-baseline",
            connection_closed_handler=ignore,
        )
        await client.start()
        await client.authenticate(endpoint.vhost, endpoint.username, endpoint.password)
        counted = dict.fromkeys(wanted, 0)
        done = asyncio.Event()
        by_id = dict(enumerate(wanted))
        pending = set(wanted)

        async def on_chunk(sub_id: int, frame: schema.Deliver) -> None:
            # every handler sees every Deliver frame of the connection: keep our own
            stream = by_id[sub_id]
            if frame.subscription_id != sub_id or stream not in pending:
                return
            await client.credit(frame.subscription_id, 1)
            end = wanted[stream]
            first = frame.chunk_first_offset
            counted[stream] += max(0, min(end, first + frame.num_records) - first)
            if first + frame.num_records >= end:
                pending.discard(stream)
                if not pending:
                    done.set()

        try:
            for sub_id, stream in by_id.items():
                handler = functools.partial(on_chunk, sub_id)
                client.add_handler(schema.Deliver, handler, name=str(sub_id))
                await client.run_queue_listener_task(sub_id, handler)
                await client.subscribe(
                    stream,
                    sub_id,
                    schema.OffsetSpec.from_params(OffsetType.OFFSET, 0),
                    initial_credit=credit,
                )
            if pending:
                await asyncio.wait_for(done.wait(), timeout)
            elapsed = time.perf_counter() - started
        finally:
            await client.close()
        return sum(counted.values()), elapsed

    records, seconds = asyncio.run(main())
    return _rate(records, seconds)
