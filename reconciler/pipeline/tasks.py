"""A batch as Arrow tasks: Spark schedules them, the records never enter its JVM.

A batch is one Spark job with one task per group of ranges: on a classic session an RDD
of the task indices (``parallelize(range(n), n).mapPartitions``); on Spark Connect, which
has no RDDs, a tiny DataFrame with one row per task mapped with ``mapInArrow``. Each task
runs in an executor's Python worker: it reads its offset sub-ranges with the stream client
(``sources.open_reader``), parses and transforms them in pyarrow
(``transform.Transformer``), writes Parquet files under the batch's directories
(``sink.Files``), and yields one small row per file it wrote (kind, path, time chunk, rows,
bytes) and one with what it read. Only those rows cross the JVM, so a batch costs the JVM
the same whatever its size, on a local, standalone or Spark Connect master alike. The
driver (``describe``) publishes the descriptions as before: exactly once does not depend
on the tasks, only on the publish's compare-and-swap.

A task attempt that fails deletes what it wrote (``Files.abort``); one killed outright
leaves files no description names, which ``segments.finish`` deletes. Spark retries a
failed task where its master allows (``spark.task.maxFailures``); the batch's files are
named by task and attempt, so attempts never overwrite each other.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from reconciler.model import DataSchema, PartitionRange
from reconciler.pipeline import heap

# What a task yields: one row per file, and one row (kind "read") per partition it read,
# with its records and their bytes (``chunk`` holds the partition's name).
RESULT_SCHEMA = "kind string, path string, chunk string, rows long, bytes long"
DATA, DEAD, READ = "data", "dead", "read"
SCHEMA = "schema"  # a task's discovered columns: ``path`` holds their Arrow schema (IPC, base64)


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one batch gets (pickled into the job: no secrets, only references)."""

    source: dict[str, Any]  # the spec's source document (``model.source_to_document``)
    data_schema: DataSchema
    groups: tuple[tuple[PartitionRange, ...], ...]  # one group of sub-ranges per task
    data_dir: str
    dead_dir: str
    store: str | None  # ``ObjectStore.to_json()`` of an object-store warehouse (no credentials)
    max_batch_rows: int
    # Builds the reader from ``source`` instead of the stream client: the tests' stand-in
    # stream (``tests/pipeline/conftest.py``), pickled with the plan. The product never sets it.
    reader: Callable[[dict[str, Any]], Any] | None = None
    # The schema file the format block names, read by the driver (name as written -> bytes):
    # an executor on another host has no config repo to read it from.
    format_files: dict[str, bytes] = field(default_factory=dict)
    # schemaDiscovery: the table's columns (name -> Arrow type), which decide a discovered
    # column's type (``discovered``)
    table_types: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FileDescription:
    kind: str  # DATA or DEAD
    path: str  # relative to the batch's data or dead-letter directory
    chunk: str | None
    rows: int
    bytes: int


@dataclass(frozen=True)
class TaskResults:
    files: tuple[FileDescription, ...]
    records: int  # records the tasks read
    input_bytes: int  # their keys' and values' bytes
    read_counts: dict[str, int] = field(default_factory=dict)  # partition -> records its readers delivered
    discovered: tuple[Any, ...] = ()  # each task's discovered columns (an Arrow schema), schemaDiscovery only


def run(spark: Any, plan: TaskPlan) -> TaskResults:
    """Run one task per group of ``plan`` and gather what they wrote (driver side)."""
    n = len(plan.groups)
    if n == 0:
        return TaskResults((), 0, 0)

    rows = _collect(spark, plan, n)
    files = tuple(FileDescription(r.kind, r.path, r.chunk, int(r.rows), int(r.bytes))
                  for r in rows if r.kind in (DATA, DEAD))
    read_counts: dict[str, int] = {}
    for r in rows:
        if r.kind == READ:
            read_counts[r.chunk] = read_counts.get(r.chunk, 0) + int(r.rows)
    records = sum(read_counts.values())
    read_bytes = sum(int(r.bytes) for r in rows if r.kind == READ)
    discovered = tuple(_schema_of(r.path) for r in rows if r.kind == SCHEMA)
    return TaskResults(files, records, read_bytes, read_counts, discovered)


class _Row(NamedTuple):
    kind: str
    path: str | None
    chunk: str | None
    rows: int
    bytes: int


def _collect(spark: Any, plan: TaskPlan, n: int) -> list[Any]:
    """The tasks' rows. A classic session runs them as an RDD job, its task indices as the
    data: no plan to analyse and no Arrow stream to set up, so a small batch's job costs
    about 22 ms of Spark instead of 60 (two tasks, local session, measured). Spark Connect
    has no RDDs: there the job is ``mapInArrow`` over a tiny frame, the same tasks."""
    context = _context(spark)
    if context is not None:
        return _collect_rdd(context, plan, n)
    return _collect_frame(spark, plan, n)


def _collect_rdd(context: Any, plan: TaskPlan, n: int) -> list[_Row]:
    return context.parallelize(range(n), n).mapPartitions(partial(_rdd_task, plan)).collect()


def _collect_frame(spark: Any, plan: TaskPlan, n: int) -> list[Any]:
    def task(batches: Iterator[Any]) -> Iterator[Any]:
        return run_task(plan, batches)

    return spark.range(0, n, 1, n).mapInArrow(task, RESULT_SCHEMA).collect()


def _context(spark: Any) -> Any:
    """The session's SparkContext, or None for Spark Connect (which has none)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    try:
        return spark.sparkContext
    except Exception:  # noqa: BLE001 - a session without a context runs the DataFrame path
        return None


def _rdd_task(plan: TaskPlan, indices: Iterator[int]) -> Iterator[_Row]:
    """Executor side, RDD path: the task indices of this partition (one, by construction)."""
    for index in indices:
        for row in _run_one(plan, index):
            yield _Row(row["kind"], row["path"], row["chunk"], int(row["rows"]), int(row["bytes"]))


def _run_one(plan: TaskPlan, index: int) -> list[dict[str, Any]]:
    """Executor side, either path: one task, timed for the trace, then the worker's heap settled."""
    from reconciler.pipeline import tasktrace

    started = time.time()
    out = one_task(plan, plan.groups[int(index)])
    if tasktrace.enabled():
        tasktrace.note(plan.data_dir, started, time.time())
    heap.settle_worker()  # once per worker, after its first task
    return out


def _schema_of(text: str) -> Any:
    import base64

    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def run_task(plan: TaskPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the task ids of this partition (one, by construction), each run."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pylist(_run_one(plan, index), schema=_result_schema())


def _result_schema():
    import pyarrow as pa

    return pa.schema([("kind", pa.string()), ("path", pa.string()), ("chunk", pa.string()),
                      ("rows", pa.int64()), ("bytes", pa.int64())])


def _stem() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # run outside Spark (tests, tools)
        return f"part-{uuid.uuid4().hex}"
    return f"part-{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:12]}"


def _read_all(reader: Any, ranges: Sequence[PartitionRange], max_batch_rows: int) -> Iterator[tuple[Any, Any]]:
    """``(range, batch)`` for every range: at once where the reader reads several ranges with
    one client (``read_many``: Kafka), else one range after the other."""
    if getattr(reader, "read_many", None) is not None and len({r.partition for r in ranges}) == len(ranges):
        yield from reader.read_many(ranges, max_batch_rows)
        return
    for rng in ranges:
        for batch in reader.read(rng, max_batch_rows):
            yield rng, batch


def one_task(plan: TaskPlan, ranges: Sequence[PartitionRange]) -> list[dict[str, Any]]:
    """One task: read ``ranges``, transform, write; the rows that describe what it wrote.

    The allocator and the collector are set for the work first, in the worker itself (a
    cluster's executors have their own environment): ``arrowpool`` and ``heap``."""
    from reconciler.pipeline import arrowpool

    arrowpool.use_preferred()
    with heap.collections_paused():
        return _read_transform_write(plan, ranges)


def _read_transform_write(plan: TaskPlan, ranges: Sequence[PartitionRange]) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    from reconciler.pipeline import sink
    from reconciler.pipeline.sources import conform, open_reader
    from reconciler.pipeline.transform import DEAD_SCHEMA, SEGMENT, Transformer

    stem = _stem()
    rows = sink.Files(plan.data_dir, stem, SEGMENT, storage=sink.task_storage(plan.data_dir, plan.store))
    dead = sink.Files(plan.dead_dir, stem, None, storage=sink.task_storage(plan.dead_dir, plan.store))
    transformer = Transformer(plan.data_schema, files=plan.format_files, table_types=plan.table_types)
    # partition -> [records, bytes]; a range that delivered nothing is known as 0, not unknown
    read: dict[str, list[int]] = {r.partition: [0, 0] for r in ranges}
    reader = plan.reader(plan.source) if plan.reader is not None else open_reader(plan.source)
    try:
        for rng, batch in _read_all(reader, ranges, plan.max_batch_rows):
            if not batch.num_rows:
                continue
            if "reason" in batch.schema.names:  # records the reader could not decode, as dead letters
                counts = read.setdefault(rng.partition, [0, 0])
                counts[0] += batch.num_rows
                counts[1] += pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0
                dead.add_table(pa.Table.from_batches([batch]).cast(DEAD_SCHEMA))
                continue
            out = transformer(conform(batch))
            counts = read.setdefault(rng.partition, [0, 0])
            counts[0] += out.records
            counts[1] += out.bytes
            rows.add_table(out.rows)
            dead.add_table(out.dead)
        last = transformer.finish()
        rows.add_table(last.rows)
        dead.add_table(last.dead)
        written = [(DATA, f) for f in rows.close()] + [(DEAD, f) for f in dead.close()]
    except BaseException:
        rows.abort()
        dead.abort()
        raise
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    out_rows = [{"kind": kind, "path": f.name, "chunk": f.value, "rows": f.rows, "bytes": f.bytes}
                for kind, f in written]
    out_rows += [{"kind": READ, "path": None, "chunk": partition, "rows": n, "bytes": size}
                 for partition, (n, size) in read.items()]
    if transformer.discovery is not None and transformer.discovery.types:
        import base64

        found = pa.schema(transformer.discovery.report()).serialize().to_pybytes()  # with what it met
        out_rows.append({"kind": SCHEMA, "path": base64.b64encode(found).decode(), "chunk": None,
                         "rows": 0, "bytes": 0})
    return out_rows
