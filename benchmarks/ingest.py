"""Ingestion throughput: this product against a bare client and a naive pipeline.

Prints ONE JSON document on stdout (logs go to stderr). For each system (Kafka on a
Tansu broker, RabbitMQ Streams on a private node; both started here through
``reconciler.devservices``) it produces N records of ~100 bytes of JSON over 4
partitions (a 4-partition topic, or 4 streams), then measures, on the same data in
the same run:

a. ``raw_consume``: one bare client draining every partition, counting records
   (``benchmarks/_raw_consume.py``): the ceiling of the transport, no parsing;
b. ``naive_pipeline``: one process, one client, ``json.loads`` per record, a pyarrow
   table, one Parquet file: what a simple hand-written ingester does;
c. ``product_cold``: ``reconciler run --until-caught-up`` as a subprocess, wall time
   from exec to exit, so Python imports, the Spark JVM start, the first job and the
   database commit are all included; ``batch_seconds`` is the daemon's own account of
   its batches (read, parse, write, publish, promote) from its log; the first batch
   includes starting the SparkSession, which the daemon does lazily;
   ``first_100k_visible_seconds``: from exec until the table holds 100,000 committed
   records (the daemon's database polled every 20 ms); ``product_cold_marginal``: the
   slope between c and a fresh process reading N/4 records (``product_cold_part``), what
   one more record costs a fresh process with its start taken out;
d. ``product_warm_first``: the daemon in this process after a small warm-up run, so the
   SparkSession and its Python workers already exist, but the JVM has not yet compiled
   the hot code of a big batch (C2 keeps compiling through the first two, PROFILE.md);
e. ``product_warm``: the same N records again, read by new supervisors in the same
   process, ``WARM_RUNS`` times; e is the last run, in the JIT-compiled state of a daemon
   that has been running a while (``earlier_runs_records_per_s`` gives the ones before
   it). Each run is a whole ``Daemon.run(until_caught_up=True)``: the daemon's start, a
   new supervisor and its tables, the batch, the publish and the ticks until it sees it
   is caught up. d and e carry ``batch_phases`` (capture, plan, job and publish of the
   run's one batch, from the daemon's log), so the rest of the wall time is the daemon's
   own start and its ticks;
g. ``product_warm_marginal``: the marginal rate of a record, issue 12's "warm" goal: the
   same daemon reads N/4 records (``product_warm_part``) right after e, and the slope
   (N - N/4) / (e's seconds - that run's seconds) takes out what both runs pay alike
   (the daemon's start and stop, the new supervisor's tables and analysis, the ticks);
f. ``small_batches``: ``SMALL_RECORDS`` more records in batches of ``SMALL_BATCH``
   (``maxBatchRecords``) in the same warm process, with each batch's phases from the
   daemon's log: ``batch_seconds`` from cut to publish, and the fixed cost
   ``capture + plan + publish`` against the Spark job.

Every product run (d to g) is verified: the committed Parquet holds exactly N rows and N
distinct ids. ``ratios`` divides the product's rates by a and b. ``peak_rss_mib`` is
the largest resident memory of the daemon's process tree (Python, the Spark JVM, its
Python workers; brokers excluded) sampled every 0.25 s (PSS every second) during the run, counting pages
shared by forked workers once per process; ``peak_pss_mib`` splits shared pages among
their sharers (the memory the tree really occupies).

Usage: ``.venv/bin/python benchmarks/ingest.py [--records N] [--system kafka|rabbitmq|both]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reconciler.pipeline import arrowpool  # noqa: E402

arrowpool.prefer_in_environment()  # as the ``reconciler`` entry point does, before pyarrow's import
from _raw_consume import raw_kafka_consume_rate, raw_rabbit_consume_rate  # noqa: E402
from _rss import PeakRss  # noqa: E402

import devservices  # noqa: E402  (the checkout's service launchers, not part of the package)

log = logging.getLogger("bench")
PARTITIONS = 4
TASK_COUNT = 2  # one reader per core of a 2-core machine; see README
WARMUP_RECORDS = 20_000
SMALL_RECORDS, SMALL_BATCH = 100_000, 10_000
WARM_RUNS = 2  # e is the last: C2 keeps compiling through a process's first two big batches
PART = 4  # g's second run reads 1/PART of N records
FIRST_VISIBLE = 100_000  # c: seconds from exec until this many records are visible in the table
SPARK_CONF: list[str] = []  # --spark-conf KEY=VALUE: the product's extra Spark settings (both runs)


def _rate(records: int, seconds: float) -> dict[str, Any]:
    return {"records": records, "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds, 1) if seconds > 0 else None}


def _spec(sid: str, source: dict[str, Any], max_batch: int = 1_000_000) -> dict[str, Any]:
    return {
        "id": sid,
        "source": source,
        "taskCount": TASK_COUNT,
        "taskDuration": "1s",
        "maxBatchRecords": max_batch,
        "dataSchema": {
            "datasource": sid,
            "timestamp": {"column": "ts", "format": "millis"},
            "dimensions": ["id", "user", "page", "__partition", "__offset"],
            "metrics": [{"name": "bytes", "type": "longSum", "field": "bytes"}],
            "granularity": {"segment": "hour", "query": "none", "rollup": False},
        },
    }


def _verify(segments: Path, datasource: str, n: int) -> dict[str, Any]:
    """Rows and distinct ids in the datasource's table, read through the catalog (the
    current snapshot's files only), from the SQLite database beside ``segments``."""
    import pyarrow.compute as pc

    from reconciler.store.engine import create_engine
    from reconciler.table.catalog import Tables

    db = segments.parent / "reconciler.db"
    tables = Tables(create_engine(f"sqlite:///{db}"), segments)
    try:
        t = tables.load(datasource)
        files = len(t.inspect.files()) if t is not None else 0
        table = t.scan(selected_fields=("id",)).to_arrow() if t is not None else None
    finally:
        tables.catalog.engine.dispose()
    rows = table.num_rows if table is not None else 0
    distinct = pc.count_distinct(table["id"]).as_py() if table is not None else 0
    ok = rows == n and distinct == n
    if not ok:
        log.error("verification FAILED for %s: %d rows, %d distinct ids, expected %d", datasource, rows, distinct, n)
    return {"rows": rows, "distinct_ids": distinct, "files": files, "exactly_once": ok}


# --------------------------------------------------------------------------- naive pipelines


def _write_naive(values: list[bytes], partitions: list[str], offsets: list[int], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    loads = json.loads
    cols: dict[str, list] = {"id": [], "ts": [], "user": [], "page": [], "bytes": []}
    for v in values:
        d = loads(v)
        for k, c in cols.items():
            c.append(d.get(k))
    table = pa.table({
        "__time": pa.array(cols.pop("ts"), pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        **{k: pa.array(v) for k, v in cols.items()},
        "__partition": pa.array(partitions, pa.string()),
        "__offset": pa.array(offsets, pa.int64()),
    })
    pq.write_table(table, out)


def naive_records(bootstrap: str, topic: str, ends: dict[int, int], group: str) -> Iterator[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record below ``ends`` through one tuned
    confluent-kafka consumer: what the naive scripts read."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10, "log_level": 2})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        pending = {p for p, e in ends.items() if e > 0}
        while pending:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                if msg.error():
                    continue
                p, o = msg.partition(), msg.offset()
                if p not in pending or o >= ends[p]:
                    continue
                if o + 1 >= ends[p]:
                    pending.discard(p)
                yield p, o, msg.value()
    finally:
        consumer.close()


def naive_kafka(bootstrap: str, topic: str, ends: dict[int, int], out: Path) -> dict[str, Any]:
    """One tuned confluent-kafka consumer, json.loads per record, one pyarrow table, one file."""
    started = time.perf_counter()
    values: list[bytes] = []
    parts: list[str] = []
    offsets: list[int] = []
    for p, o, value in naive_records(bootstrap, topic, ends, f"naive-{os.getpid()}"):
        values.append(value)
        parts.append(str(p))
        offsets.append(o)
    _write_naive(values, parts, offsets, out)
    return _rate(len(values), time.perf_counter() - started)


def naive_rabbit(uri: str, streams: list[str], ends: dict[str, int], out: Path) -> dict[str, Any]:
    """rstream's Consumer (AMQP decoding per message), json.loads per record, one table, one file."""
    import asyncio

    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    from reconciler.streams.rabbitmq import parse_stream_uri

    ep = parse_stream_uri(uri)
    values: list[bytes] = []
    parts: list[str] = []
    offsets: list[int] = []

    async def main() -> None:
        done = asyncio.Event()
        pending = {s for s in streams if ends[s] > 0}
        async with Consumer(ep.host, ep.port, username=ep.username, password=ep.password, vhost=ep.vhost,
                            frame_max=8 * 1024 * 1024) as consumer:
            async def on_message(msg, ctx) -> None:
                s, o = ctx.stream, ctx.offset
                if s in pending and o < ends[s]:
                    values.append(bytes(msg.body))
                    parts.append(s)
                    offsets.append(o)
                    if o + 1 >= ends[s]:
                        pending.discard(s)
                        if not pending:
                            done.set()

            for s in streams:
                await consumer.subscribe(s, on_message, decoder=amqp_decoder, initial_credit=64,
                                         offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await asyncio.wait_for(done.wait(), 600)

    started = time.perf_counter()
    asyncio.run(main())
    _write_naive(values, parts, offsets, out)
    return _rate(len(values), time.perf_counter() - started)


# --------------------------------------------------------------------------- the product


def product_cold(work: Path, sid: str, source: dict[str, Any], n: int) -> dict[str, Any]:
    """``reconciler run --until-caught-up`` in a fresh process; wall time from exec to exit."""
    import yaml

    specs, state = work / f"{sid}-cold" / "specs", work / f"{sid}-cold" / "state"
    specs.mkdir(parents=True)
    (specs / f"{sid}.yaml").write_text(yaml.safe_dump(_spec(sid, source)))
    env = {**os.environ, "RECONCILER_SPECS": str(specs), "RECONCILER_STATE_DIR": str(state),
           "RECONCILER_HTTP": "", "RECONCILER_CONFIG": os.devnull, "RECONCILER_TICK_INTERVAL": "1",
           "PYSPARK_PYTHON": sys.executable, "RECONCILER_SPARK_CONF": ";".join(SPARK_CONF)}
    started = time.perf_counter()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("reconciler")), "run", "--until-caught-up",
                             "--timeout", "900"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    visible = _Visible(state / "reconciler.db", started)
    with PeakRss(proc.pid) as peak, visible:  # the daemon, its Spark JVM and the JVM's Python workers
        _, stderr = proc.communicate()
    wall = time.perf_counter() - started
    (work / f"{sid}-cold" / "daemon.log").write_text(stderr)  # kept with --keep: where a cold run's time went
    if proc.returncode != 0:
        raise RuntimeError(f"reconciler run exited {proc.returncode}:\n{stderr[-4000:]}")
    batch_s = [float(m[1]) for m in re.finditer(r"published: \d+ records \(\d+ unparseable\) in ([0-9.]+)s",
                                                 stderr)]
    out = _rate(n, wall)
    out["batches"] = len(batch_s)
    out["batch_seconds"] = round(sum(batch_s), 3)
    out["batch_records_per_s"] = round(n / sum(batch_s), 1) if batch_s else None
    out["outside_batches_seconds"] = round(wall - sum(batch_s), 3)
    out["peak_rss_mib"] = peak.mib
    out["peak_pss_mib"] = peak.pss_mib
    out["first_visible_seconds"] = visible.first  # exec -> the first committed batch
    out[f"first_{FIRST_VISIBLE // 1000}k_visible_seconds"] = visible.reached(FIRST_VISIBLE)
    out["verify"] = _verify(state / "segments", sid, n)
    return out


class _Visible:
    """When committed records reach each count, seconds after exec: the daemon's database polled
    every 20 ms (``batches.records``, committed in the publish's transaction, so what a reader
    of the table sees at the same moment)."""

    def __init__(self, db: Path, started: float):
        self.db, self.started = db, started
        self.seen: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> _Visible:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()  # a commit in the last 20 ms before the exit

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self._read()

    def _read(self) -> None:
        import sqlite3

        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=0.1) as db:
                total = int(db.execute("SELECT COALESCE(SUM(records), 0) FROM batches").fetchone()[0])
        except sqlite3.Error:  # not created yet, or locked by a commit: the next poll
            return
        if total > (self.seen[-1][1] if self.seen else 0):
            self.seen.append((round(time.perf_counter() - self.started, 3), total))

    @property
    def first(self) -> float | None:
        return self.seen[0][0] if self.seen else None

    def reached(self, records: int) -> float | None:
        return next((t for t, total in self.seen if total >= records), None)


class _Phases(logging.Handler):
    """The daemon's per-batch phases (the ``phases`` of its "published" log records)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.batches: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        phases = getattr(record, "phases", None)
        if phases:
            self.batches.append(dict(phases))


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def _phases_of(batches: list[dict[str, float]]) -> dict[str, float]:
    """One run's batch phases, summed over its batches (a 1M-record run is one batch)."""
    return {k: round(sum(b[k] for b in batches), 3) for k in ("capture", "plan", "job", "publish")}


def _small_batches(batches: list[dict[str, float]]) -> dict[str, Any]:
    cut_to_publish = [b["plan"] + b["job"] + b["publish"] for b in batches]
    fixed = [b["capture"] + b["plan"] + b["publish"] for b in batches]
    return {"batches": len(batches), "batch_records": SMALL_BATCH,
            "batch_seconds_median": _median(cut_to_publish), "batch_seconds_max": round(max(cut_to_publish), 3),
            "fixed_seconds_median": _median(fixed), "fixed_seconds_max": round(max(fixed), 3),
            "phases_median": {k: _median([b[k] for b in batches]) for k in ("capture", "plan", "job", "publish")}}


def product_warm(work: Path, sid: str, source: dict[str, Any], n: int, warmup_source: dict[str, Any],
                 small_source: dict[str, Any], part_source: dict[str, Any], part_n: int,
                 broker_pid: int | None = None) -> dict[str, Any]:
    """The daemon in this process: a small run warms Spark up, then the timed runs (d, e, g, f)."""
    import yaml

    from reconciler import settings as settings_mod
    from reconciler.daemon import Daemon

    phases = _Phases()

    def run(tag: str, spec_id: str, src: dict[str, Any], max_batch: int = 1_000_000) -> tuple[float, Path]:
        phases.batches.clear()
        base = work / f"{spec_id}-{tag}"
        (base / "specs").mkdir(parents=True)
        (base / "specs" / f"{spec_id}.yaml").write_text(yaml.safe_dump(_spec(spec_id, src, max_batch)))
        s = settings_mod.load({"specs": str(base / "specs"), "state_dir": str(base / "state"), "http": "",
                               "tick_interval": 1.0, "spark_conf": list(SPARK_CONF)}, config=os.devnull, env={})
        t = time.perf_counter()
        logging.getLogger("reconciler.runtime.supervisor").addHandler(phases)
        try:
            code = Daemon(s).run(until_caught_up=True, timeout=900)
        finally:
            logging.getLogger("reconciler.runtime.supervisor").removeHandler(phases)
        if code != 0:
            raise RuntimeError(f"in-process daemon exited {code}")
        return time.perf_counter() - t, s.segments_dir

    brokers = frozenset({broker_pid} if broker_pid else ())  # the broker's process tree is not the product's
    run("warmup", f"{sid}-warmup", warmup_source)
    out: dict[str, Any] = {}
    seconds, segments = run("first", f"{sid}-first", source)
    out["product_warm_first"] = {**_rate(n, seconds), "batch_phases": _phases_of(phases.batches),
                                 "verify": _verify(segments, f"{sid}-first", n)}
    warm_runs: list[dict[str, Any]] = []
    for i in range(WARM_RUNS):
        with PeakRss(os.getpid(), exclude=brokers) as peak:
            seconds, segments = run("warm", f"{sid}-{i}" if i else sid, source)
        warm_runs.append({**_rate(n, seconds), "batch_phases": _phases_of(phases.batches),
                          "peak_rss_mib": peak.mib,  # this process (with the benchmark's own data) + JVM + workers
                          "peak_pss_mib": peak.pss_mib,
                          "verify": _verify(segments, f"{sid}-{i}" if i else sid, n)})
    # e: the last run, as JIT-warm as a daemon that has run a while; the earlier ones beside it
    out["product_warm"] = {**warm_runs[-1], "earlier_runs_records_per_s": [r["records_per_s"] for r in warm_runs[:-1]]}
    # sampled like e, so the slope g compares two runs measured alike
    with PeakRss(os.getpid(), exclude=brokers):
        seconds_part, segments = run("part", f"{sid}-part", part_source)
    out["product_warm_part"] = {**_rate(part_n, seconds_part), "batch_phases": _phases_of(phases.batches),
                                "verify": _verify(segments, f"{sid}-part", part_n)}
    # g: what one more record costs a warm daemon, with its start, the new supervisor's tables
    # and the run's ticks (the same in both runs) taken out
    extra = warm_runs[-1]["seconds"] - seconds_part
    out["product_warm_marginal"] = {"records": n - part_n, "seconds": round(extra, 3),
                                    "records_per_s": round((n - part_n) / extra, 1) if extra > 0 else None}
    seconds, segments = run("small", f"{sid}-small", small_source, SMALL_BATCH)
    out["small_batches"] = {**_rate(SMALL_RECORDS, seconds), **_small_batches(phases.batches),
                            "verify": _verify(segments, f"{sid}-small", SMALL_RECORDS)}
    return out


def _marginal(whole: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """What one more record costs a fresh process: the slope between two fresh runs of N and
    N/PART records, with what both pay alike (imports, the JVM, the first job) taken out."""
    records, seconds = whole["records"] - part["records"], whole["seconds"] - part["seconds"]
    return {"records": records, "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds, 1) if seconds > 0 else None}


def _ratios(res: dict[str, Any]) -> dict[str, Any]:
    def r(a: str, b: str) -> float | None:
        x, y = res.get(a, {}).get("records_per_s"), res.get(b, {}).get("records_per_s")
        return round(x / y, 3) if x and y else None

    return {"cold_over_raw": r("product_cold", "raw_consume"), "cold_over_naive": r("product_cold", "naive_pipeline"),
            "warm_over_raw": r("product_warm", "raw_consume"), "warm_over_naive": r("product_warm", "naive_pipeline"),
            "warm_first_over_raw": r("product_warm_first", "raw_consume"),
            "warm_first_over_naive": r("product_warm_first", "naive_pipeline"),
            "marginal_over_raw": r("product_warm_marginal", "raw_consume"),
            "marginal_over_naive": r("product_warm_marginal", "naive_pipeline"),
            "cold_marginal_over_raw": r("product_cold_marginal", "raw_consume"),
            "cold_marginal_over_naive": r("product_cold_marginal", "naive_pipeline")}


# --------------------------------------------------------------------------- per system


def bench_kafka(n: int, work: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"partitions": PARTITIONS}
    with devservices.TansuBroker() as broker:
        broker.create_topic("bench", PARTITIONS)
        broker.create_topic("warmup", PARTITIONS)
        broker.create_topic("small", PARTITIONS)
        broker.create_topic("part", PARTITIONS)
        log.info("kafka: producing %d records", n)
        t = time.perf_counter()
        ends = devservices.produce_kafka(broker.bootstrap, "bench", devservices.make_records(n))
        res["produce"] = _rate(n, time.perf_counter() - t)
        devservices.produce_kafka(broker.bootstrap, "warmup", devservices.make_records(WARMUP_RECORDS))
        devservices.produce_kafka(broker.bootstrap, "small", devservices.make_records(SMALL_RECORDS))
        devservices.produce_kafka(broker.bootstrap, "part", devservices.make_records(n // PART))
        assert sum(ends.values()) == n, ends
        log.info("kafka: raw consume")
        res["raw_consume"] = raw_kafka_consume_rate(broker.bootstrap, "bench", ends, timeout=600)
        log.info("kafka: naive pipeline")
        res["naive_pipeline"] = naive_kafka(broker.bootstrap, "bench", ends, work / "kafka-naive.parquet")
        source = {"type": "kafka", "bootstrapServers": broker.bootstrap, "topic": "bench"}
        log.info("kafka: product, cold subprocess")
        res["product_cold"] = product_cold(work, "kbench", source, n)
        res["product_cold_part"] = product_cold(work, "kpart", {**source, "topic": "part"}, n // PART)
        res["product_cold_marginal"] = _marginal(res["product_cold"], res["product_cold_part"])
        log.info("kafka: product, warm in-process")
        res.update(product_warm(work, "kbench", source, n, {**source, "topic": "warmup"},
                                {**source, "topic": "small"}, {**source, "topic": "part"}, n // PART,
                                broker_pid=broker.proc.pid if broker.proc else None))
    res["ratios"] = _ratios(res)
    return res


def bench_rabbit(n: int, work: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"partitions": PARTITIONS}
    with devservices.RabbitNode() as node:
        streams = [f"bench-{i}" for i in range(PARTITIONS)]
        warm = [f"warmup-{i}" for i in range(PARTITIONS)]
        small = [f"small-{i}" for i in range(PARTITIONS)]
        part = [f"part-{i}" for i in range(PARTITIONS)]
        for s in streams + warm + small + part:
            node.create_stream(s)
        records = devservices.make_records(n)
        per: dict[str, list] = {s: [] for s in streams}
        for rec in records:
            per[streams[zlib.crc32(rec[0].encode()) % PARTITIONS]].append(rec)
        log.info("rabbitmq: producing %d records", n)
        t = time.perf_counter()
        for s, recs in per.items():
            devservices.produce_rabbit(node.stream_uri, s, recs, batch_size=1000, timeout=600)
        res["produce"] = _rate(n, time.perf_counter() - t)
        for i, s in enumerate(warm):
            devservices.produce_rabbit(node.stream_uri, s, devservices.make_records(WARMUP_RECORDS // PARTITIONS,
                                                                                    start=i * 100_000))
        for i, s in enumerate(small):
            devservices.produce_rabbit(node.stream_uri, s, devservices.make_records(SMALL_RECORDS // PARTITIONS,
                                                                                    start=i * 100_000))
        part_per: dict[str, list] = {s: [] for s in part}  # the same shape as N: spread like it over time
        for rec in devservices.make_records(n // PART):
            part_per[part[zlib.crc32(rec[0].encode()) % PARTITIONS]].append(rec)
        for s, recs in part_per.items():
            devservices.produce_rabbit(node.stream_uri, s, recs, batch_size=1000, timeout=600)
        ends = {s: len(recs) for s, recs in per.items()}
        log.info("rabbitmq: raw consume")
        res["raw_consume"] = raw_rabbit_consume_rate(node.stream_uri, streams, ends, timeout=600)
        log.info("rabbitmq: naive pipeline")
        res["naive_pipeline"] = naive_rabbit(node.stream_uri, streams, ends, work / "rabbit-naive.parquet")
        source = {"type": "rabbitmq", "uri": node.stream_uri, "streams": streams}
        log.info("rabbitmq: product, cold subprocess")
        res["product_cold"] = product_cold(work, "rbench", source, n)
        res["product_cold_part"] = product_cold(work, "rpart", {**source, "streams": part}, n // PART)
        res["product_cold_marginal"] = _marginal(res["product_cold"], res["product_cold_part"])
        log.info("rabbitmq: product, warm in-process")
        res.update(product_warm(work, "rbench", source, n, {**source, "streams": warm},
                                {**source, "streams": small}, {**source, "streams": part}, n // PART,
                                broker_pid=node.proc.pid if node.proc else None))
    res["ratios"] = _ratios(res)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records per system (default 1,000,000)")
    ap.add_argument("--system", choices=["kafka", "rabbitmq", "both"], default="both")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (segments, logs)")
    ap.add_argument("--format", choices=["json", "avro"], default="json",
                    help="avro: Kafka only, Avro through a registry vs a naive fastavro script and vs JSON "
                         "(benchmarks/ingest_formats.py)")
    ap.add_argument("--typed-json", action="store_true", help="with --format avro: typed JSON vs string columns too")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the product runs (e.g. to measure without a default: "
                         "spark.python.daemon.module=pyspark.daemon)")
    args = ap.parse_args(argv)
    SPARK_CONF[:] = args.spark_conf
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-"))
    doc: dict[str, Any] = {
        "records": args.records,
        "record_bytes_mean": round(sum(len(v) for _, v in devservices.make_records(10_000)) / 10_000, 1),
        "task_count": TASK_COUNT,
        "spark_master": "local[*]",
        "spark_conf": args.spark_conf,
        "cores": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    started = time.perf_counter()
    try:
        if args.format == "avro":
            from ingest_formats import bench_avro

            doc["format"] = "avro"
            doc["kafka_avro"] = bench_avro(args.records, work, args.typed_json, args.spark_conf)
        elif args.system in ("kafka", "both"):
            doc["kafka"] = bench_kafka(args.records, work)
        if args.format == "json" and args.system in ("rabbitmq", "both"):
            doc["rabbitmq"] = bench_rabbit(args.records, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log.info("work directory kept: %s", work)
    doc["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["total_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
