"""run_batch against real brokers: every key exactly once in the data files a batch writes.

The files are read straight from the batch directories (``<root>/<D>/batch=<id>/``, Hive-style),
without the table: what the publish would commit."""

from __future__ import annotations

import collections
import os
import time

import pytest

import devservices
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.pipeline.batch import run_batch

pytestmark = [pytest.mark.integration, pytest.mark.spark]

N = 20_000


def spec_for(source: dict, datasource: str, **data_schema) -> SupervisorSpec:
    ds = {
        "datasource": datasource,
        "timestamp": {"column": "ts", "format": "auto"},
        "dimensions": ["id", "user", "page", "__key", "__partition", "__offset"],
        "metrics": [{"name": "bytes", "type": "longSum", "field": "bytes"}],
        "granularity": {"segment": "hour", "query": "none", "rollup": False},
    }
    ds.update(data_schema)
    return SupervisorSpec.from_document(
        {"id": datasource, "source": source, "dataSchema": ds, "taskCount": 2}
    )


def stage(spark, spec, ranges, root, batch_id, task_count):
    """run_batch into ``<root>/<D>/batch=<id>`` and ``<root>/_deadletter/<D>/batch=<id>``."""
    ds = spec.data_schema.datasource
    return run_batch(spark, spec, ranges, batch_id, data_dir=root / ds / f"batch={batch_id}",
                     dead_dir=root / "_deadletter" / ds / f"batch={batch_id}", task_count=task_count)


def assert_exactly_once(spark, root, datasource, expected_ids):
    df = spark.read.parquet(str(root / datasource))
    ids = [r.id for r in df.select("id").collect()]
    counts = collections.Counter(ids)
    dupes = [k for k, c in counts.items() if c > 1]
    missing = set(expected_ids) - set(counts)
    extra = set(counts) - set(expected_ids)
    assert not dupes, f"duplicated: {dupes[:10]}"
    assert not missing, f"missing: {sorted(missing)[:10]} ({len(missing)})"
    assert not extra, f"unexpected: {sorted(extra)[:10]}"
    keys = df.select("id", "__key").collect()
    assert all(r.id == r["__key"] for r in keys)
    return df


@pytest.mark.kafka
@pytest.mark.parametrize("tasks", [1, 3])
def test_kafka_every_key_once(spark, kafka_broker, topic, tmp_path, tasks):
    name = topic(partitions=4)
    records = devservices.make_records(N)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    assert sum(ends.values()) == N and len(ends) == 4
    spec = spec_for(
        {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name}, "clicks"
    )
    ranges = [PartitionRange(str(p), 0, end) for p, end in ends.items()]
    root = tmp_path / "segments"
    staged = stage(spark, spec, ranges, root, f"b-{tasks}", tasks)
    assert staged.rows == N and staged.dead_rows == 0 and staged.input_rows == N
    df = assert_exactly_once(spark, root, "clicks", [k for k, _ in records])
    # offsets: per partition exactly [0, end)
    got = collections.defaultdict(list)
    for r in df.select("__partition", "__offset").collect():
        got[r["__partition"]].append(r["__offset"])
    assert {p: sorted(o) for p, o in got.items()} == {
        str(p): list(range(end)) for p, end in ends.items()
    }
    # 20,000 records one second apart: 6 hourly chunks (12:00 .. 17:00 UTC)
    assert sorted({f.segment for f in staged.files}) == [f"20251120T{h}00Z" for h in range(12, 18)]


@pytest.mark.kafka
def test_kafka_split_batches_and_rollup(spark, kafka_broker, topic, tmp_path):
    """Two consecutive batches (ranges cut mid-partition) add up to each key once; rollup counts."""
    name = topic(partitions=2)
    records = devservices.make_records(5000)
    bad = [(f"bad{i}", b"{nope") for i in range(3)]
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records + bad)
    source = {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name}
    root = tmp_path / "segments"
    mid = {p: end // 3 for p, end in ends.items()}
    plain = spec_for(source, "plain")
    for i, bounds in enumerate([(dict.fromkeys(ends, 0), mid), (mid, ends)]):
        lo, hi = bounds
        ranges = [PartitionRange(str(p), lo[p], hi[p]) for p in ends]
        staged = stage(spark, plain, ranges, root, f"plain-{i}", 3)
    assert_exactly_once(spark, root, "plain", [k for k, _ in records])
    dead = spark.read.parquet(str(root / "_deadletter" / "plain"))
    assert sorted(r.key.decode() for r in dead.select("key").collect()) == ["bad0", "bad1", "bad2"]

    rolled = spec_for(
        source,
        "rolled",
        dimensions=["user"],
        metrics=[
            {"name": "n", "type": "count"},
            {"name": "bytes", "type": "longSum", "field": "bytes"},
        ],
        granularity={"segment": "day", "query": "hour", "rollup": True},
    )
    full = [PartitionRange(str(p), 0, e) for p, e in ends.items()]
    staged = stage(spark, rolled, full, root, "rolled-0", 2)
    assert staged.dead_rows == 3 and staged.input_rows == 5003
    # Each task rolls up its own records; rows of one key from two tasks are summed by the
    # reader (and merged by compaction), as rows of one key from two batches always were.
    sums: dict = collections.defaultdict(lambda: [0, 0])
    per_task = collections.Counter()
    for r in spark.read.parquet(str(root / "rolled")).collect():
        sums[(r["__time"].hour, r.user)][0] += r.n
        sums[(r["__time"].hour, r.user)][1] += r.bytes
        per_task[(r["__time"].hour, r.user)] += 1
    assert max(per_task.values()) <= 2  # at most one row per key and task
    got = {k: tuple(v) for k, v in sums.items()}
    expected: dict = collections.defaultdict(lambda: [0, 0])
    import json

    for _, v in records:
        d = json.loads(v)
        hour = (d["ts"] // 3_600_000) % 24
        expected[(hour, d["user"])][0] += 1
        expected[(hour, d["user"])][1] += d["bytes"]
    assert got == {k: tuple(v) for k, v in expected.items()}


@pytest.mark.kafka
def test_kafka_empty_ranges(spark, kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    spec = spec_for(
        {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name}, "e"
    )
    staged = stage(spark, spec, [PartitionRange("0", 0, 0)], tmp_path, "empty", 2)
    assert staged.files == () and staged.rows == 0 and staged.input_rows == 0
    assert not (tmp_path / "e").exists()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("tasks", [1, 3])
def test_rabbitmq_every_key_once(spark, rabbit_node, stream, tmp_path, tasks):
    streams = [stream(), stream()]
    records = devservices.make_records(N)
    halves = [records[: N // 2], records[N // 2 :]]
    for s, recs in zip(streams, halves, strict=True):
        assert devservices.produce_rabbit(rabbit_node.stream_uri, s, recs) == len(recs)
    spec = spec_for(
        {"type": "rabbitmq", "uri": rabbit_node.stream_uri, "streams": streams}, "orders"
    )
    from reconciler.streams import adapter_for

    adapter = adapter_for(spec.source)
    try:
        first, latest = adapter.earliest(), adapter.latest()
    finally:
        adapter.close()
    ranges = [PartitionRange(s, first[s], latest[s]) for s in streams]
    assert sum(r.size for r in ranges) == N
    root = tmp_path / "segments"
    staged = stage(spark, spec, ranges, root, f"r-{tasks}", tasks)
    assert staged.rows == N and staged.dead_rows == 0
    assert_exactly_once(spark, root, "orders", [k for k, _ in records])


# --------------------------------------------------------------------------- throughput


@pytest.mark.soak
@pytest.mark.kafka
@pytest.mark.parametrize("step_ms", [1000, 1], ids=["278-hourly-chunks", "one-chunk"])
def test_kafka_throughput_1m(spark, kafka_broker, topic, tmp_path, step_ms):
    """Warm end-to-end rate for 1M records (run with --soak -s; prints the rates).

    ``make_records`` spaces records ``step_ms`` apart: 1 s gives 278 hourly chunks
    (556 files per batch with 2 tasks), 1 ms one chunk.
    """
    n = int(os.environ.get("RECONCILER_BENCH_RECORDS", "1000000"))
    name = topic(partitions=4)
    t0 = time.perf_counter()
    records = devservices.make_records(n, step_ms=step_ms)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    produce_s = time.perf_counter() - t0
    del records
    spec = spec_for(
        {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name}, "bench"
    )
    ranges = [PartitionRange(str(p), 0, e) for p, e in ends.items()]
    root = tmp_path / "segments"
    times = []
    for i in range(4):
        t = time.perf_counter()
        staged = stage(spark, spec, ranges, root, f"bench-{i}", 2)
        times.append(time.perf_counter() - t)
        assert staged.rows == n
    warm = min(times[1:])
    print(
        f"\n{n} records, {len({f.segment for f in staged.files})} chunks, {len(staged.files)} files: "
        f"produce {produce_s:.1f}s; batches {[round(x, 2) for x in times]} s; "
        f"warm {n / warm:,.0f} records/s; load {os.getloadavg()[0]:.1f}"
    )
