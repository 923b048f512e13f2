"""The CPU floor of a record: what the work itself costs, with no Spark, beside the raw consumer.

Issue 30 asks a warm batch for 0.8 x the raw consumer's rate on 2 cores, where the broker
runs too. This measures whether any scheduling could reach it: the CPU seconds that every
record costs wherever it runs, summed over every process, against the CPU the goal leaves.

On one Tansu topic (``--records`` over 4 partitions, the records of ``ingest.py``):

a. ``raw``: ``_raw_consume.raw_kafka_consume_rate`` (it counts records and decodes no value):
   wall, this process's CPU and the broker's CPU (its process tree, from ``/proc``);
b. ``read``: the product's reader (``streams.kafka.KafkaRangeReader``, as a task opens it)
   draining every partition into memory, one partition after another: this process's CPU
   and the broker's;
c. ``transform``: ``transform.Transformer`` over those batches (parse, columns, time chunks);
d. ``write``: ``sink.Files`` writing the transformed tables as a task does (Parquet, one file
   per time chunk), to a temporary directory;
e. ``task``: the product's task itself (``tasks.one_task``) over every partition at once, as
   one Spark task runs it: each batch read, transformed and written before the next, in the
   allocator (``pipeline.arrowpool``: jemalloc, unless ``ARROW_DEFAULT_MEMORY_POOL`` names a
   pool) and with the collector paused (``heap.collections_paused``), as a task sets them.
   It runs twice; ``task_first`` is the first (the transform's first use in the process),
   ``task`` the second, the warm batch.

b to d say where a record's CPU goes, each stage over every record at once; they allocate
from the pool a task chooses too (``arrow_pool`` says which), so
``ARROW_DEFAULT_MEMORY_POOL=mimalloc`` measures pyarrow's own default beside it.

``record_cpu_s_per_1m`` is e's CPU with the broker's during e, per 1M records: issue 45's
figure (2.6 at most). ``stages_cpu_s_per_1m`` is b + c + d with the broker's CPU during b,
what this figure was until the task was measured whole (a stage that holds every record at
once pays the kernel for memory that a task, batch after batch, reuses). ``floor_seconds``
is the least wall time of the product's work on ``cores`` cores if it split perfectly with
nothing else to do: e's CPU, broker included, / cores. The same with the raw consumer's CPU
in place of b (a + c + d) is ``floor_seconds_raw_client`` (a reader as
cheap as a client that decodes nothing). ``goal_seconds`` is the wall time of ``--goal`` x
the raw rate. A floor above the goal means no task layout can reach the goal on this
machine: the work is more CPU than the cores have in that time.

Usage: ``.venv/bin/python benchmarks/cpu_floor.py [--records 1000000] [--goal 0.8]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reconciler.pipeline import arrowpool  # noqa: E402

arrowpool.prefer_in_environment()  # as the ``reconciler`` entry point does, before pyarrow's import
from _raw_consume import raw_kafka_consume_rate  # noqa: E402
from profile_batch import _tree_cpu  # noqa: E402

import devservices  # noqa: E402

PARTITIONS = 4


def broker_cpu(pid: int | None) -> float:
    """CPU seconds of the broker's process tree (``profile_batch``'s reading of ``/proc``);
    0 without a broker."""
    return _tree_cpu(pid) if pid is not None else 0.0


class Meter:
    """Wall, this process's CPU and the broker's CPU over a ``with`` block."""

    def __init__(self, broker_pid: int | None):
        self.pid = broker_pid
        self.out: dict[str, float] = {}

    def __enter__(self) -> Meter:
        self._t = (time.perf_counter(), time.process_time(), broker_cpu(self.pid))
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu, broker = self._t
        self.out = {"wall_s": round(time.perf_counter() - wall, 3),
                    "cpu_s": round(time.process_time() - cpu, 3),
                    "broker_cpu_s": round(broker_cpu(self.pid) - broker, 3)}


def _data_schema():
    from reconciler.model import DataSchema, Metric

    return DataSchema(datasource="floor", timestamp_column="ts", timestamp_format="millis",
                      dimensions=("id", "user", "page", "__partition", "__offset"),
                      metrics=(Metric(name="bytes", type="longSum", field="bytes"),),
                      segment_granularity="hour", query_granularity="none", rollup=False)


def measure(bootstrap: str, broker_pid: int | None, topic: str, n: int, goal: float) -> dict[str, Any]:
    """Produce ``n`` records to ``topic`` (``PARTITIONS`` partitions, empty) and measure a to d."""
    import pyarrow.dataset as ds

    from reconciler.model import PartitionRange
    from reconciler.pipeline import arrowpool, sink
    from reconciler.pipeline.sources import DEFAULT_MAX_BATCH_ROWS, conform, open_reader
    from reconciler.pipeline.transform import SEGMENT, Transformer

    res: dict[str, Any] = {"records": n, "partitions": PARTITIONS, "cores": os.cpu_count(), "goal": goal,
                           "arrow_pool": arrowpool.use_preferred()}  # as a task does first
    ends = devservices.produce_kafka(bootstrap, topic, devservices.make_records(n))
    assert sum(ends.values()) == n, ends
    with Meter(broker_pid) as m:
        rate = raw_kafka_consume_rate(bootstrap, topic, ends, timeout=600)
    res["raw"] = {**m.out, "records_per_s": rate["records_per_s"]}

    source = {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic}
    batches = []
    with Meter(broker_pid) as m:
        reader = open_reader(source)
        try:
            for p, end in sorted(ends.items()):
                rng = PartitionRange(str(p), 0, end)
                batches += [b for b in reader.read(rng, DEFAULT_MAX_BATCH_ROWS) if b.num_rows]
        finally:
            reader.close()
    res["read"] = {**m.out, "records": sum(b.num_rows for b in batches)}

    transformer = Transformer(_data_schema())
    tables = []
    with Meter(None) as m:
        for b in batches:
            tables.append(transformer(conform(b)).rows)
        tables.append(transformer.finish().rows)
    res["transform"] = {**m.out, "rows": sum(t.num_rows for t in tables)}
    del batches

    with tempfile.TemporaryDirectory(prefix="cpu-floor-") as tmp:
        with Meter(None) as m:
            files = sink.Files(tmp, "part-floor", SEGMENT)
            for t in tables:
                files.add_table(t)
            written = files.close()
        ids = ds.dataset(tmp, format="parquet").to_table(columns=["id"]).column("id")
        res["write"] = {**m.out, "files": len(written), "rows": sum(f.rows for f in written),
                        "bytes": sum(f.bytes for f in written), "ids": len(ids),
                        "distinct_ids": len(ids.unique())}
    # exactly once through every stage, or the figures measure something else
    assert res["read"]["records"] == res["transform"]["rows"] == n, res
    assert res["write"]["rows"] == res["write"]["ids"] == res["write"]["distinct_ids"] == n, res["write"]

    # e. the product's task itself over every partition, twice: its reads, transform and
    # writes interleaved batch by batch, in the allocator and collector state a task sets
    ranges = tuple(PartitionRange(str(p), 0, end) for p, end in sorted(ends.items()))
    for key in ("task_first", "task"):
        res[key] = _task(source, ranges, broker_pid, n)

    cores = os.cpu_count() or 1
    work = res["transform"]["cpu_s"] + res["write"]["cpu_s"]
    staged = res["read"]["cpu_s"] + res["read"]["broker_cpu_s"] + work
    product = res["task"]["cpu_s"] + res["task"]["broker_cpu_s"]
    cheapest = res["raw"]["cpu_s"] + res["raw"]["broker_cpu_s"] + work
    raw_rate = n / res["raw"]["wall_s"]
    res["cpu_s_per_1m"] = {k: round(v["cpu_s"] * 1e6 / n, 3) for k, v in
                           (("raw_client", res["raw"]), ("reader", res["read"]),
                            ("transform", res["transform"]), ("write", res["write"]))}
    res["cpu_s_per_1m"]["broker_raw"] = round(res["raw"]["broker_cpu_s"] * 1e6 / n, 3)
    res["cpu_s_per_1m"]["broker_reader"] = round(res["read"]["broker_cpu_s"] * 1e6 / n, 3)
    res["cpu_s_per_1m"]["task"] = round(res["task"]["cpu_s"] * 1e6 / n, 3)
    res["cpu_s_per_1m"]["broker_task"] = round(res["task"]["broker_cpu_s"] * 1e6 / n, 3)
    # issue 45's figure: what a record costs the product's warm task, broker included, on any
    # layout; the stages' sum beside it (each stage over every record at once)
    res["record_cpu_s_per_1m"] = round(product * 1e6 / n, 3)
    res["stages_cpu_s_per_1m"] = round(staged * 1e6 / n, 3)
    res["floor_seconds"] = round(product / cores, 3)
    res["floor_seconds_raw_client"] = round(cheapest / cores, 3)
    res["goal_seconds"] = round(n / (goal * raw_rate), 3)
    res["best_ratio_to_raw"] = round(n / res["floor_seconds"] / raw_rate, 3)
    res["best_ratio_to_raw_with_raw_client"] = round(n / res["floor_seconds_raw_client"] / raw_rate, 3)
    res["goal_reachable"] = res["floor_seconds_raw_client"] <= res["goal_seconds"]
    return res


def _task(source: dict[str, Any], ranges: tuple[Any, ...], broker_pid: int | None, n: int) -> dict[str, Any]:
    """``tasks.one_task`` over ``ranges`` (one task, one consumer) into a temporary directory:
    its CPU and the broker's, and every id once in what it wrote."""
    import pyarrow.dataset as ds

    from reconciler.pipeline import tasks
    from reconciler.pipeline.sources import DEFAULT_MAX_BATCH_ROWS

    with tempfile.TemporaryDirectory(prefix="cpu-floor-task-") as tmp:
        plan = tasks.TaskPlan(source=source, data_schema=_data_schema(), groups=(ranges,),
                              data_dir=f"{tmp}/data", dead_dir=f"{tmp}/dead", store=None,
                              max_batch_rows=DEFAULT_MAX_BATCH_ROWS)
        with Meter(broker_pid) as m:
            rows = tasks.one_task(plan, ranges)
        ids = ds.dataset(f"{tmp}/data", format="parquet").to_table(columns=["id"]).column("id")
        out = {**m.out, "records": sum(r["rows"] for r in rows if r["kind"] == tasks.READ),
               "rows": sum(r["rows"] for r in rows if r["kind"] == tasks.DATA),
               "files": sum(r["kind"] == tasks.DATA for r in rows), "distinct_ids": len(ids.unique())}
    assert out["records"] == out["rows"] == out["distinct_ids"] == len(ids) == n, out
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records (default 1,000,000)")
    ap.add_argument("--goal", type=float, default=0.8, help="the goal, a ratio to the raw rate (default 0.8)")
    args = ap.parse_args(argv)
    with devservices.TansuBroker() as broker:
        broker.create_topic("floor", PARTITIONS)
        doc = measure(broker.bootstrap, broker.proc.pid if broker.proc else None, "floor", args.records, args.goal)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
