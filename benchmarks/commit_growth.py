"""Commit cost and disk as a table's history grows: a day of one-second batches, compressed.

Publishes ``--commits`` tiny batches (default 100,000) through the product's own runtime:
``SupervisorRuntime.step`` cuts each batch, records its write, writes one Parquet file with
pyarrow (the benchmark's job, in place of Spark), stages the table commit, publishes it
with the checkpoints in one transaction and deletes what the commit superseded. No broker
and no Spark: the stream is a counter that grows by ``--records`` each step.

Prints ONE JSON document on stdout (progress on stderr): per window of ``--window``
commits (default 10,000), the publish latency (the runtime's ``publish`` phase: staging,
the transaction, the clean-up after it) median / p95 / p99 / max, and at the window's end
the size of the current metadata file, the files in the table's ``metadata/``, the
database's size; then ``verify``'s run time at the end, and the goal ratios of issue 34
(the last window's median over the second's; metadata files; metadata size; verify).

    .venv/bin/python benchmarks/commit_growth.py                       # SQLite, 100,000 commits
    .venv/bin/python benchmarks/commit_growth.py --db postgres         # a throwaway PostgreSQL cluster
    .venv/bin/python benchmarks/commit_growth.py --commits 20000 --window 2000
    .venv/bin/python benchmarks/commit_growth.py --compact-every 0     # never compacted: the worst case
    .venv/bin/python benchmarks/commit_growth.py --catalog glue --commits 2000 --window 500   # Glue on moto

By default the leader's compaction runs as a daemon runs it by default (hourly, an hour
after a partition closes), at the stream's clock: a batch is ``--records`` seconds of data.
``--rolling-every N`` also runs the rolling compaction of the open hour every N commits.

``--daemon``: the growth within the open hour on a real daemon instead (a Tansu broker, a
steady producer, Spark, the leader's rolling compaction as configured; ``growth_daemon.py``):

    .venv/bin/python benchmarks/commit_growth.py --daemon                          # 3 minutes at taskDuration 1s
    .venv/bin/python benchmarks/commit_growth.py --daemon --minutes 15
    .venv/bin/python benchmarks/commit_growth.py --daemon --task-duration 0.5s --minutes 60
    .venv/bin/python benchmarks/commit_growth.py --daemon --rolling-compaction 0   # without: the old growth
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # growth_daemon and its neighbours (--daemon)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import sqlalchemy as sa  # noqa: E402

# Everything imported now, not when first needed: a run takes hours, and a module imported
# at its end from a checkout edited meanwhile met the others as they were at its start (an
# ImportError lost one run's final figures).
from reconciler.model import SupervisorSpec  # noqa: E402
from reconciler.runtime.recovery import recover  # noqa: E402
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime  # noqa: E402
from reconciler.store.store import Store  # noqa: E402
from reconciler.table import durable  # noqa: E402
from reconciler.table.catalog import deadletter_table  # noqa: E402
from reconciler.table.compact import compact  # noqa: E402
from reconciler.table.rolling import compact_open  # noqa: E402
from reconciler.table.verify import SupervisorFacts, verify  # noqa: E402

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])
DEAD = pa.schema([("partition", pa.string()), ("offset", pa.int64()), ("reason", pa.string())])
T0 = datetime(2026, 11, 20, tzinfo=UTC)
SID = "trickle"


class Counter:
    """A one-partition stream whose end grows by ``step`` each time it is asked."""

    def __init__(self, step: int):
        self.step = step
        self.end = 0

    def partitions(self):
        return ["0"]

    def earliest(self):
        return {"0": 0}

    def latest(self):
        self.end += self.step
        return {"0": self.end}

    def offsets_for_time(self, ms):
        return {"0": 0}

    def close(self):
        pass


@dataclass(frozen=True)
class _File:
    path: str
    segment: str | None
    rows: int
    bytes: int


@dataclass(frozen=True)
class _Written:
    batch_id: str
    files: tuple
    dead_files: tuple
    read_counts: dict
    input_rows: int | None = None
    input_bytes: int | None = None

    @property
    def dead_rows(self) -> int:
        return 0


class TinyJob:
    """The batch job: the range's records as one Parquet file, fsynced like the sink's."""

    def schemas(self, data_schema):
        return SCHEMA, DEAD

    def run(self, spec, ranges, batch_id, *, data_dir, dead_dir, task_count):
        [rng] = ranges
        hour = T0 + timedelta(seconds=rng.start)
        chunk = hour.strftime("%Y%m%dT%H00Z")
        path = Path(data_dir) / f"time_chunk={chunk}" / "part-00000.parquet"
        path.parent.mkdir(parents=True)
        n = rng.end - rng.start
        pq.write_table(pa.table({
            "__time": pa.array([hour.replace(minute=0, second=0)] * n, pa.timestamp("us", tz="UTC")),
            "id": [f"k{o}" for o in range(rng.start, rng.end)], "__partition": ["0"] * n,
            "__offset": pa.array(range(rng.start, rng.end), pa.int64())}, schema=SCHEMA), path)
        durable.sync([path], [path.parent, Path(data_dir), Path(data_dir).parent, Path(data_dir).parent.parent])
        return _Written(batch_id, (_File(str(path), chunk, n, path.stat().st_size),), (), {"0": n}, n, 0)


class Phases:
    """The runtime's metrics hook: keeps each batch's publish time."""

    def __init__(self):
        self.publish: list[float] = []

    def batch_done(self, sid, records, dead, elapsed, phases):
        self.publish.append(phases["publish"])

    def __getattr__(self, name):  # every other metric: ignored
        return lambda *a, **k: None


def _db_size(store: Store, url: str) -> int:
    if url.startswith("sqlite"):
        path = Path(sa.engine.make_url(url).database)
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with store.engine.connect() as c:
        return int(c.exec_driver_sql("SELECT pg_database_size(current_database())").scalar())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _compact(tables, store, now: datetime, costs: list[float]) -> tuple[int, int]:
    """The leader's compaction at the benchmark's clock: closed hours' small files rewritten."""
    t = time.monotonic()
    result = compact(tables, SID, store=store, lateness=timedelta(hours=1), now=now)
    costs.append(time.monotonic() - t)
    return result.files_before, result.files_after


def _live_files(table) -> int:
    return sum(int(m.existing_files_count or 0) + int(m.added_files_count or 0)
               for m in table.current_snapshot().manifests(table.io))


def _manifest_entries(table) -> int:
    """Entries of the current snapshot's manifests, deleted ones included: what the next
    publish's merge reads and a reader's planning walks."""
    return sum(int(m.existing_files_count or 0) + int(m.added_files_count or 0) + int(m.deleted_files_count or 0)
               for m in table.current_snapshot().manifests(table.io))


def _metadata_dir(meta_dir: Path) -> tuple[int, int]:
    """Files in ``metadata/`` and the size of the newest metadata JSON (the current one:
    its name starts with the version number, 5 digits until it needs 6), read after every
    commit: the goals hold at any time, not only where a window ends."""
    files, newest, version = 0, None, -1
    with os.scandir(meta_dir) as entries:
        for e in entries:
            if e.is_file():
                files += 1
                if e.name.endswith(".metadata.json"):
                    v = int(e.name.split("-", 1)[0])
                    if v > version:
                        newest, version = e, v
    return files, newest.stat().st_size if newest is not None else 0


def run(url: str, root: Path, commits: int, window: int, records: int, kept: int,
        compact_every: int = 720, reader_grace: float = 600.0, rolling_every: int = 0,
        catalog: dict | None = None) -> dict:
    store = Store(url)
    store.migrate()
    spec = SupervisorSpec.from_document({
        "id": SID, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": SID},
        "maxBatchRecords": records,
        "dataSchema": {"datasource": SID, "timestamp": {"column": "ts"}, "dimensions": ["id", "__partition", "__offset"]}})
    store.create_supervisor(spec, None, actor="benchmark")
    counter = Counter(records)
    phases = Phases()
    ctx = RuntimeContext(store=store, segments_dir=root / "segments", spark=lambda: None, metrics=phases,
                         job=TinyJob(), adapters=lambda source: counter, snapshots_kept=kept,
                         reader_grace=reader_grace, catalog=catalog or {})
    rt = SupervisorRuntime(SID, ctx)
    tables = ctx.tables()
    windows = []
    compactions: list[float] = []
    compacted = [0, 0]  # files in, files out
    rolled: list[float] = []
    meta_dir: Path | None = None
    peak_files = peak_bytes = 0  # the window's highest, sampled after every commit
    started = time.monotonic()
    while len(phases.publish) < commits:
        before = len(phases.publish)
        rt.step()
        if len(phases.publish) == before:
            raise SystemExit(f"no batch published: {store.get(SID).last_error}")
        done = len(phases.publish)
        if meta_dir is None:
            meta_dir = Path(tables.load(SID).metadata_location).parent
        files, size = _metadata_dir(meta_dir)
        peak_files, peak_bytes = max(peak_files, files), max(peak_bytes, size)
        if compact_every and done % compact_every == 0:
            # the stream's clock: a batch's records are ``records`` seconds of data (TinyJob)
            files_in, files_out = _compact(tables, store, T0 + timedelta(seconds=counter.end), compactions)
            compacted[0] += files_in
            compacted[1] += files_out
        if rolling_every and done % rolling_every == 0:  # the open hour's, as rollingCompaction does
            t = time.monotonic()
            compact_open(tables, SID, store=store, now=T0 + timedelta(seconds=counter.end))
            rolled.append(time.monotonic() - t)
        if done % window == 0:
            table = tables.load(SID)
            meta = Path(table.metadata_location)
            part = [x * 1000 for x in phases.publish[done - window:done]]
            windows.append({
                "commits": done, "publishMedianMs": round(statistics.median(part), 2),
                "p95Ms": round(_pct(part, 0.95), 2), "p99Ms": round(_pct(part, 0.99), 2), "maxMs": round(max(part), 2),
                "metadataFileKiB": round(meta.stat().st_size / 1024, 1),
                "metadataDirFiles": _metadata_dir(meta.parent)[0],
                "metadataDirFilesPeak": peak_files, "metadataFileKiBPeak": round(peak_bytes / 1024, 1),
                "snapshots": len(table.metadata.snapshots), "liveDataFiles": _live_files(table),
                "manifestEntries": _manifest_entries(table),
                "dbMiB": round(_db_size(store, url) / 2**20, 2)})
            print(f"{done} commits, {time.monotonic() - started:.0f}s: {windows[-1]}", file=sys.stderr)
            peak_files = peak_bytes = 0
    t = time.monotonic()
    table = tables.load(SID)
    actual = store.read_actual()
    rec = actual.supervisors[SID]
    facts = {SID: SupervisorFacts(SID, rec.kind, rec.state, rec.generation, actual.checkpoints[SID],
                                  store.first_offsets(SID), rec.end_offsets)}
    report = verify(table, SID, {SID: store.history(SID)}, deep=False,
                    dead_table=tables.load(deadletter_table(SID)), facts=facts)
    verify_s = time.monotonic() - t
    status_t = time.monotonic()
    store.all_batch_totals()
    store.read_actual()
    status_s = time.monotonic() - status_t
    # What a new leader does first (the lease, then recovery over every table's directories),
    # and the lease renewal every term repeats: after the whole history, not on an empty table.
    lease_t = time.monotonic()
    token = store.acquire_lease("commit-growth", 15.0)
    renewed = store.acquire_lease("commit-growth", 15.0)
    store.heartbeat("commit-growth", "leader", 15.0)
    lease_s = time.monotonic() - lease_t
    recovery_t = time.monotonic()
    recovered = recover(store, root / "segments", catalog)
    recovery_s = time.monotonic() - recovery_t
    data_dirs = sum(1 for d in (root / "segments").rglob("data/*") if d.is_dir())
    store.close()
    second = windows[1] if len(windows) > 1 else windows[0]
    return {
        "db": "postgresql" if url.startswith("postgresql") else "sqlite", "commits": commits,
        "catalog": (catalog or {}).get("type", "sql"),
        "recordsPerCommit": records, "snapshotsKept": kept, "compactEvery": compact_every,
        "compactions": {"runs": len(compactions), "filesIn": compacted[0], "filesOut": compacted[1],
                        "medianSeconds": round(statistics.median(compactions), 3) if compactions else None,
                        "maxSeconds": round(max(compactions), 3) if compactions else None},
        "rolling": {"every": rolling_every, "runs": len(rolled),
                    "medianSeconds": round(statistics.median(rolled), 3) if rolled else None},
        "windows": windows,
        "verifySeconds": round(verify_s, 3), "verifyOk": report.ok, "statusQueriesSeconds": round(status_s, 4),
        "leaseSeconds": round(lease_s, 4), "leaseKept": token is not None and renewed == token,
        "recoverySeconds": round(recovery_s, 3), "recovery": recovered, "dataDirectories": data_dirs,
        "seconds": round(time.monotonic() - started, 1),
        "goals": {
            "lastOverSecondMedian": round(windows[-1]["publishMedianMs"] / second["publishMedianMs"], 3),
            # after every commit, the first window's first minute included
            "maxMetadataDirFiles": max(w["metadataDirFilesPeak"] for w in windows),
            "maxMetadataFileKiB": max(w["metadataFileKiBPeak"] for w in windows),
            "verifySeconds": round(verify_s, 3),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="sqlite", help="sqlite, postgres (a throwaway cluster) or a SQLAlchemy URL")
    ap.add_argument("--commits", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=5, help="records per batch")
    ap.add_argument("--snapshots-kept", type=int, default=25)
    ap.add_argument("--reader-grace", type=float, default=600.0,
                    help="seconds a replaced version stays readable (readerGrace): metadata/ holds what "
                         "the commits of the last this-many seconds unreferenced, besides the kept history")
    ap.add_argument("--compact-every", type=int, default=720,
                    help="run the leader's compaction every N commits (0: never, the worst case). A batch "
                         "is --records seconds of data, so the default 720 at the default 5 is what a daemon "
                         "does by default: the hourly compactInterval with compactLateness 1h")
    ap.add_argument("--rolling-every", type=int, default=0,
                    help="run the rolling compaction of the open hour every N commits (0: never)")
    ap.add_argument("--catalog", choices=("sql", "glue"), default="sql",
                    help="glue: the tables in AWS Glue on moto (devservices/glue.py; the files stay local), "
                         "published table first, then the database; sql: the metadata database's catalog")
    ap.add_argument("--daemon", action="store_true", help="a real daemon at about one commit a second (see above)")
    ap.add_argument("--minutes", type=float, default=3.0, help="--daemon: minutes of steady production (default 3)")
    ap.add_argument("--task-duration", default="1s", help="--daemon: the supervisor's taskDuration (default 1s)")
    ap.add_argument("--rate", type=int, default=200, help="--daemon: records a second (default 200)")
    ap.add_argument("--partitions", type=int, default=1, help="--daemon: topic partitions (default 1)")
    ap.add_argument("--rolling-compaction", type=float, default=None,
                    help="--daemon: the rollingCompaction setting (default: the setting's default; 0 off)")
    a = ap.parse_args()
    if a.daemon:
        _main_daemon(a)
        return
    logging.basicConfig(level=logging.WARNING)
    cluster = None
    with tempfile.TemporaryDirectory(prefix="commit-growth-") as tmp:
        url = a.db
        if a.db == "sqlite":
            url = f"sqlite:///{tmp}/reconciler.db"
        elif a.db == "postgres":
            import devservices

            cluster = devservices.PostgresCluster(durable=True)
            cluster.start()
            url = cluster.create_database("commit_growth")
        glue = catalog = None
        if a.catalog == "glue":
            from devservices.glue import GlueServer

            glue = GlueServer().start()
            catalog = {"type": "glue", "namespace": "default", "properties": glue.catalog_properties()}
        try:
            doc = run(url, Path(tmp), a.commits, a.window, a.records, a.snapshots_kept, a.compact_every,
                      a.reader_grace, a.rolling_every, catalog)
        finally:
            if cluster is not None:
                cluster.stop()
            if glue is not None:
                glue.stop()
    doc["loadAverage"] = os.getloadavg()[0]
    print(json.dumps(doc, indent=2))


def _main_daemon(a) -> None:
    import shutil

    import growth_daemon

    from reconciler import logs
    from reconciler.settings import Settings

    logs.setup("WARNING")
    for handler in logging.getLogger().handlers:  # the publish log records are caught, not printed
        handler.setLevel(logging.WARNING)
    rolling = a.rolling_compaction if a.rolling_compaction is not None else Settings.rolling_compaction
    work = Path(tempfile.mkdtemp(prefix="growth-daemon-"))
    try:
        doc = growth_daemon.run(a.minutes, a.task_duration, a.rate, a.partitions, rolling, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    if not doc["verify"]["exactly_once"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
