"""Smoke tests of the real services the other tests build on (no mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

import devservices
from devservices import make_records, produce_kafka, produce_rabbit


def test_importing_registers_no_exit_hook() -> None:
    """The launchers register their atexit hook when a service starts, not on import."""
    import subprocess
    import sys

    code = (
        "import atexit, logging\n"
        "n = atexit._ncallbacks()\n"
        "import devservices, devservices.spark\n"
        "assert atexit._ncallbacks() == n, (n, atexit._ncallbacks())\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_make_records_shape() -> None:
    recs = make_records(3, start=122, ts_start_ms=1_000, step_ms=10)
    assert [k for k, _ in recs] == ["k000122", "k000123", "k000124"]
    docs = [json.loads(v) for _, v in recs]
    assert [d["id"] for d in docs] == ["k000122", "k000123", "k000124"]
    assert [d["ts"] for d in docs] == [1_000, 1_010, 1_020]
    assert set(docs[0]) == {"id", "ts", "user", "page", "bytes"}
    assert all(isinstance(d["bytes"], int) and d["user"].startswith("u") for d in docs)
    assert 60 <= len(recs[0][1]) <= 120


# --------------------------------------------------------------------------- Kafka


def _latest(broker: devservices.TansuBroker, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = broker.admin()  # keep a reference: a collected client never completes its futures
    res = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
        request_timeout=30,
    )
    return {tp.partition: f.result(timeout=30).offset for tp, f in res.items()}


def _consume_all(bootstrap: str, topic: str, ends: dict[int, int], timeout: float = 60.0):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "rct-smoke",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
            "log_level": 2,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    got: list[tuple[int, int, bytes, bytes]] = []
    done = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + timeout
    try:
        while len(done) < len(ends) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.key(), m.value()))
                if m.offset() + 1 >= ends[m.partition()]:
                    done.add(m.partition())
    finally:
        c.close()
    return got


@pytest.mark.kafka
def test_tansu_round_trip_exact(kafka_broker, topic) -> None:
    name = topic(partitions=3)
    recs = make_records(5_000)
    ends = produce_kafka(kafka_broker.bootstrap, name, recs)
    assert sum(ends.values()) == 5_000
    assert set(ends) == {0, 1, 2}
    # the final batch of each partition held one record: the broker's latest is exact
    assert _latest(kafka_broker, name, 3) == ends

    got = _consume_all(kafka_broker.bootstrap, name, ends)
    by_key = Counter(k.decode() for _, _, k, _ in got)
    assert len(got) == 5_000
    assert set(by_key) == {k for k, _ in recs}
    assert set(by_key.values()) == {1}
    assert {k.decode(): v for _, _, k, v in got} == dict(recs)
    # offsets are dense per partition and the partitioner is crc32(key) % 3
    for p, end in ends.items():
        assert sorted(o for q, o, _, _ in got if q == p) == list(range(end))
    import zlib

    assert all(zlib.crc32(k) % 3 == p for p, _, k, _ in got)


@pytest.mark.kafka
def test_tansu_latest_exact_after_second_load(kafka_broker, topic) -> None:
    name = topic(partitions=2)
    first = produce_kafka(
        kafka_broker.bootstrap, name, make_records(1_000), partition_of=lambda k, v: 0
    )
    assert first == {0: 1_000}
    second = produce_kafka(
        kafka_broker.bootstrap,
        name,
        make_records(300, start=1_000),
        partition_of=lambda k, v: int(k[1:]) % 2,
        one_record_per_batch=True,
    )
    assert second == {0: 1_150, 1: 150}
    assert _latest(kafka_broker, name, 2) == {0: 1_150, 1: 150}


# --------------------------------------------------------------------------- RabbitMQ


async def _consume_stream(uri: str, stream: str, n: int, timeout: float = 60.0):
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    params = devservices.parse_stream_uri(uri)
    got: list[tuple[int, str, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg, ctx) -> None:
        key = msg.properties.message_id
        body = msg.body
        if isinstance(body, list):  # a list of AMQP data sections
            body = b"".join(body)
        got.append((ctx.offset, key.decode() if isinstance(key, bytes) else key, bytes(body)))
        if len(got) >= n:
            done.set()

    consumer = Consumer(
        params["host"],
        params["port"],
        username=params["username"],
        password=params["password"],
        vhost=params["vhost"],
    )
    await consumer.start()
    try:
        await consumer.subscribe(
            stream,
            on_message,
            decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await asyncio.wait_for(done.wait(), timeout)
        await asyncio.sleep(0.3)  # anything beyond n would show up as an extra record
    finally:
        await consumer.close()
    return got


@pytest.mark.rabbitmq
def test_rabbit_stream_round_trip_exact(rabbit_node, stream) -> None:
    name = stream()
    recs = make_records(2_000)
    assert produce_rabbit(rabbit_node.stream_uri, name, recs) == 2_000

    got = asyncio.run(_consume_stream(rabbit_node.stream_uri, name, 2_000))
    assert len(got) == 2_000
    by_key = Counter(k for _, k, _ in got)
    assert set(by_key) == {k for k, _ in recs}
    assert set(by_key.values()) == {1}
    assert {k: v for _, k, v in got} == dict(recs)
    assert [o for o, _, _ in got] == list(range(2_000))
    assert rabbit_node.stream_exists(name)
    rabbit_node.delete_stream(name)
    assert not rabbit_node.stream_exists(name)


@pytest.mark.rabbitmq
def test_second_rabbit_node_does_not_clash(rabbit_node) -> None:
    with devservices.RabbitNode() as other:
        assert other.nodename != rabbit_node.nodename
        assert {other.amqp_port, other.stream_port, other.dist_port}.isdisjoint(
            {rabbit_node.amqp_port, rabbit_node.stream_port, rabbit_node.dist_port}
        )
        other.create_stream("shared-name")
        rabbit_node.create_stream("shared-name")
        try:
            assert produce_rabbit(other.stream_uri, "shared-name", make_records(10)) == 10
            assert produce_rabbit(rabbit_node.stream_uri, "shared-name", make_records(3)) == 3
            got = asyncio.run(_consume_stream(other.stream_uri, "shared-name", 10))
            assert len(got) == 10
        finally:
            rabbit_node.delete_stream("shared-name")
        status = other.ctl("status")
        assert other.nodename in status.stdout
    # stopping the second node leaves the session node alive
    assert rabbit_node.stream_exists("rct-not-there") is False


def test_missing_rabbitmq_names_setup_command(monkeypatch) -> None:
    monkeypatch.setattr(devservices.rabbitmq, "RABBITMQ_SERVER", "/nonexistent/rabbitmq-server")
    with pytest.raises(
        devservices.ServiceBinaryMissing, match="scripts/setup.sh --with-test-services"
    ):
        devservices.RabbitNode()


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_postgres_create_table(pg_cluster) -> None:
    url = pg_cluster.create_database("smoke_pg")
    assert url == pg_cluster.url_for("smoke_pg")
    assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as c:
            c.execute(sa.text("CREATE TABLE checkpoints (p text PRIMARY KEY, o bigint NOT NULL)"))
            c.execute(sa.text("INSERT INTO checkpoints VALUES ('0', 10), ('1', 20)"))
        with engine.begin() as c:
            # compare-and-swap: the loser updates 0 rows
            won = c.execute(
                sa.text("UPDATE checkpoints SET o = 15 WHERE p = '0' AND o = 10")
            ).rowcount
            lost = c.execute(
                sa.text("UPDATE checkpoints SET o = 99 WHERE p = '0' AND o = 10")
            ).rowcount
            assert (won, lost) == (1, 0)
            rows = c.execute(sa.text("SELECT p, o FROM checkpoints ORDER BY p")).all()
            assert [tuple(r) for r in rows] == [("0", 15), ("1", 20)]
            assert c.execute(sa.text("SELECT current_database()")).scalar() == "smoke_pg"
            assert c.execute(sa.text("SHOW server_version")).scalar().startswith("15")
    finally:
        engine.dispose()
        pg_cluster.drop_database("smoke_pg")


def test_db_url_is_empty_and_usable(db_url) -> None:
    engine = sa.create_engine(db_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
        with engine.begin() as c:
            c.execute(sa.text("CREATE TABLE t (x integer)"))
            c.execute(sa.text("INSERT INTO t VALUES (1), (2), (3)"))
        with engine.connect() as c:
            assert c.execute(sa.text("SELECT sum(x) FROM t")).scalar() == 6
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_two_more_postgres_clusters_do_not_clash(pg_cluster) -> None:
    with devservices.PostgresCluster() as a, devservices.PostgresCluster() as b:
        assert len({a.port, b.port, pg_cluster.port}) == 3
        engines = [sa.create_engine(x.url) for x in (a, b, pg_cluster)]
        try:
            for i, e in enumerate(engines):
                with e.begin() as c:
                    c.execute(sa.text(f"CREATE TABLE clash_{i} (x int)"))
            for i, e in enumerate(engines):
                names = set(sa.inspect(e).get_table_names())
                assert f"clash_{i}" in names
                assert not {f"clash_{j}" for j in range(3) if j != i} & names
        finally:
            with engines[2].begin() as c:
                c.execute(sa.text("DROP TABLE IF EXISTS clash_2"))
            for e in engines:
                e.dispose()
