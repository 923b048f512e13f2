"""Shared helpers for the end-to-end tests: specs, settings, the daemon, the read-back.

Import as ``from tests.e2e import helpers`` (pytest runs from the repository root).

* ``kafka_source`` / ``rabbit_source`` / ``spec_doc`` / ``write_spec``: a spec file in
  a watched directory, with test-friendly defaults (``taskDuration: 500ms``).
* ``make_settings``: ``Settings`` for one test (own state dir, segments dir, specs dir,
  ``local[2]`` so the daemon reuses the test session's SparkSession, no HTTP, short
  ticks and lease); ``database("sqlite"|"postgresql", request)`` for its ``db``.
* ``run_daemon``: ``Daemon(settings).run(until_caught_up=..., timeout=...)`` in this
  process; restores the signal handlers the daemon installs.
* ``run_cli`` (in-process, click) and ``run_subprocess`` (``<venv>/bin/reconciler``, a
  separate process with its own Spark JVM: only for signals and crashes).
* ``read_segments`` / ``key_counts`` / ``assert_exactly_once``: read committed rows
  back through the Iceberg catalog (a pyiceberg scan of the current snapshot) and count keys.
* ``kafka_positions``: where ``produce_kafka`` put each key (partition, offset).
* ``batches`` / ``assert_batches_tile`` / ``staging_leftovers`` / ``deadletters`` /
  ``segment_batch_ids``: what the database and the segment directory hold besides the rows.

Use the ``spark`` fixture in any test that runs the daemon in-process, so the session
(``local[2]``) exists before the daemon asks for one with the same master.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from reconciler import settings as settings_mod
from reconciler.daemon import Daemon
from reconciler.settings import Settings

SPARK_MASTER = "local[2]"  # the master of the tests' `spark` fixture: the daemon reuses it
RECONCILER_BIN = Path(sys.executable).with_name("reconciler")

DEFAULT_DIMENSIONS = ["id", "user", "page", "__key", "__partition", "__offset"]


# --------------------------------------------------------------------------- specs


def kafka_source(bootstrap: str, topic: str, **consumer_properties: Any) -> dict[str, Any]:
    src: dict[str, Any] = {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic}
    if consumer_properties:
        src["consumerProperties"] = consumer_properties
    return src


def rabbit_source(uri: str, streams: Sequence[str]) -> dict[str, Any]:
    return {"type": "rabbitmq", "uri": uri, "streams": list(streams)}


def spec_doc(
    sid: str,
    source: Mapping[str, Any],
    *,
    datasource: str | None = None,
    task_count: int = 1,
    task_duration: str = "500ms",
    max_batch_records: int | None = None,
    start_from: Any = None,
    dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
    metrics: Sequence[Mapping[str, Any]] | None = None,
    granularity: Mapping[str, Any] | None = None,
    timestamp: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A spec document for ``make_records`` data (``id``, ``ts`` millis, user, page, bytes)."""
    doc: dict[str, Any] = {
        "id": sid,
        "source": dict(source),
        "taskCount": task_count,
        "taskDuration": task_duration,
        "dataSchema": {
            "datasource": datasource or sid,
            "format": "json",
            "timestamp": dict(timestamp or {"column": "ts", "format": "millis"}),
            "dimensions": list(dimensions),
            "metrics": [dict(m) for m in (metrics or [{"name": "bytes", "type": "longSum", "field": "bytes"}])],
            "granularity": dict(granularity or {"segment": "hour", "query": "none", "rollup": False}),
        },
    }
    if max_batch_records is not None:
        doc["maxBatchRecords"] = max_batch_records
    if start_from is not None:
        doc["startFrom"] = start_from
    doc.update(extra)
    return doc


def write_spec(specs_dir: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    """Write ``<specs_dir>/<id>.yaml`` (atomically: the daemon may be watching)."""
    d = Path(specs_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{doc['id']}.yaml"
    tmp = d / f".{doc['id']}.yaml.tmp"
    tmp.write_text(yaml.safe_dump(dict(doc), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- settings and runs


def database(kind: str, request) -> str:
    """A fresh metadata database URL: "sqlite" ('' = a SQLite file in the state dir) or
    "postgresql" (a new database in the session's ``pg_cluster``)."""
    if kind == "sqlite":
        return ""
    import re
    import secrets

    cluster = request.getfixturevalue("pg_cluster")
    name = "e2e_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    return cluster.create_database(name)


def make_settings(root: str | os.PathLike[str], db: str = "", **overrides: Any) -> Settings:
    """Settings rooted at ``root``: specs/, state/, segments/; ``db`` '' = SQLite in state/."""
    root = Path(root)
    values: dict[str, Any] = {
        "specs": str(root / "specs"),
        "state_dir": str(root / "state"),
        "segments": str(root / "segments"),
        "db": db,
        "spark_master": SPARK_MASTER,
        "http": "",
        "tick_interval": 0.5,
        "debounce": 0.1,
        "lease_ttl": 3.0,
        # the leader's table maintenance rewrites files on its own clock: off unless a test asks
        "compact_interval": 0,
        "maintain_interval": 0,
        "rolling_compaction": 0,
    }
    values.update(overrides)
    (root / "specs").mkdir(parents=True, exist_ok=True)
    return settings_mod.load(values, config=os.devnull, env={})


def settings_env(s: Settings) -> dict[str, str]:
    """Environment variables that give a subprocess the same settings."""
    return {
        "RECONCILER_SPECS": s.specs,
        "RECONCILER_STATE_DIR": s.state_dir,
        "RECONCILER_SEGMENTS": s.warehouse,
        "RECONCILER_DB": s.db_url,
        "RECONCILER_SPARK_MASTER": s.spark_master,
        "RECONCILER_HTTP": s.http,
        "RECONCILER_TICK_INTERVAL": str(s.tick_interval),
        "RECONCILER_DEBOUNCE": str(s.debounce),
        "RECONCILER_LEASE_TTL": str(s.lease_ttl),
        "RECONCILER_COMPACT_INTERVAL": str(s.compact_interval),
        "RECONCILER_MAINTAIN_INTERVAL": str(s.maintain_interval),
        "RECONCILER_CONFIG": os.devnull,
    }


def run_daemon(settings: Settings, *, until_caught_up: bool = True, timeout: float = 120.0) -> tuple[int, Daemon]:
    """Run the daemon in this process (sharing the SparkSession); returns (exit code, daemon).

    Without ``until_caught_up`` it runs for ``timeout`` seconds and returns 1 (the
    daemon's deadline), which is how a test lets it idle for a while.
    """
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    daemon = Daemon(settings)
    try:
        code = daemon.run(until_caught_up=until_caught_up, timeout=timeout)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return code, daemon


def run_cli(settings: Settings, *args: str) -> tuple[int, str]:
    """``reconciler <args>`` in this process (click's runner); returns (exit code, stdout).

    The command sets up logging on the root logger; pytest's handlers are put back after.
    """
    import logging

    from click.testing import CliRunner

    from reconciler.cli import cli

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        result = CliRunner().invoke(cli, list(args), env=settings_env(settings), catch_exceptions=False)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return result.exit_code, result.stdout


def cli_json(settings: Settings, *args: str) -> Any:
    code, out = run_cli(settings, *args, "-o", "json")
    assert code == 0, out
    return json.loads(out)


def run_subprocess(settings: Settings, *args: str, env: Mapping[str, str] | None = None,
                   timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """``<venv>/bin/reconciler <args>`` as a separate process (its own Spark JVM)."""
    full_env = {**os.environ, **settings_env(settings), "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run([str(RECONCILER_BIN), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------- reading back


def open_tables(settings: Settings):
    """The output tables' catalog of a test's settings (``reconciler.table.catalog.Tables``)."""
    from reconciler.store.engine import create_engine
    from reconciler.table.catalog import Tables

    return Tables(create_engine(settings.db_url), settings.warehouse)


def table_rows(settings: Settings, name: str, columns: Sequence[str] | None = None):
    """The committed rows of table ``name`` as an Arrow table, read through the catalog
    (pyiceberg scan of the current snapshot); None when the table does not exist."""
    tables = open_tables(settings)
    try:
        table = tables.load(name)
        if table is None:
            return None
        scan = table.scan(selected_fields=tuple(columns)) if columns else table.scan()
        return scan.to_arrow()
    finally:
        tables.catalog.engine.dispose()


def read_segments(spark, settings: Settings, datasource: str):
    """The committed rows as a Spark DataFrame, read through the Iceberg catalog."""
    rows = table_rows(settings, datasource)
    if rows is None:
        raise AssertionError(f"no table {datasource}")
    return spark.createDataFrame(rows)


def key_counts(spark, settings: Settings, datasource: str, column: str = "id") -> collections.Counter:
    """How many committed rows each key has, read through the catalog (no table: no rows)."""
    rows = table_rows(settings, datasource, [column])
    return collections.Counter(rows.column(column).to_pylist()) if rows is not None else collections.Counter()


def assert_exactly_once(counts: Mapping[str, int], expected: Iterable[str]) -> None:
    """Every expected key once: none missing, none duplicated, nothing else."""
    expected = set(expected)
    dupes = sorted(k for k, n in counts.items() if n > 1)
    missing = sorted(expected - set(counts))
    extra = sorted(set(counts) - expected)
    assert not dupes, f"{len(dupes)} key(s) duplicated, e.g. {dupes[:5]}"
    assert not missing, f"{len(missing)} key(s) missing, e.g. {missing[:5]}"
    assert not extra, f"{len(extra)} unexpected key(s), e.g. {extra[:5]}"


def kafka_positions(records: Sequence[tuple[Any, ...]], partitions: int) -> dict[str, tuple[str, int]]:
    """key -> (partition, offset) of records ``produce_kafka`` wrote to an EMPTY topic with
    its default partitioner (``crc32(key) % partitions``, order kept per partition)."""
    import zlib

    nxt = [0] * partitions
    out = {}
    for k, *_ in records:
        kb = k.encode() if isinstance(k, str) else k
        p = zlib.crc32(kb) % partitions
        out[kb.decode()] = (str(p), nxt[p])
        nxt[p] += 1
    return out


def keys(records: Iterable[tuple[Any, ...]]) -> list[str]:
    return [k if isinstance(k, str) else k.decode() for k, *_ in records]


def batches(settings: Settings, supervisor_id: str | None = None) -> list[dict[str, Any]]:
    """Committed batches (the ``batches`` table), oldest first, ranges decoded."""
    import sqlalchemy as sa

    from reconciler.store.store import Store
    from reconciler.store.tables import batches as table

    store = Store(settings.db_url)
    try:
        q = sa.select(table).order_by(table.c.committed_at, table.c.batch_id)
        if supervisor_id is not None:
            q = q.where(table.c.supervisor_id == supervisor_id)
        with store.engine.connect() as c:
            rows = [dict(r) for r in c.execute(q).mappings()]
    finally:
        store.close()
    for r in rows:
        r["ranges"] = [tuple(x) for x in json.loads(r["ranges"])]
    return rows


def assert_batches_tile(done: Sequence[Mapping[str, Any]], ends: Mapping[str, int], start: int = 0) -> None:
    """The committed batches' ranges cover ``[start, end)`` of every partition once: no
    offset in two batches, none in none."""
    import itertools

    spans: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for b in done:
        for p, lo, hi in b["ranges"]:
            spans[str(p)].append((lo, hi))
    for p, end in ends.items():
        got = sorted(spans[str(p)])
        assert got and got[0][0] == start and got[-1][1] == end, (p, got)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(got)), (p, got)
    assert set(spans) <= {str(p) for p in ends}, sorted(spans)


def staging_leftovers(settings: Settings) -> list[str]:
    """Batch directories under the tables that no committed batch owns (should be none
    after a clean run or recovery)."""
    from reconciler.pipeline.segments import batch_dirs
    from reconciler.table import storage

    files = storage.at(settings.warehouse)
    found = {}
    for table_dir in files.dirs(files.join(settings.warehouse, "default")):
        name = str(table_dir).rstrip("/").rsplit("/", 1)[-1]
        found.update({b: f"{name}/{str(p).rstrip('/').rsplit('/', 1)[-1]}" for b, p in batch_dirs(table_dir).items()})
    committed = {b["batch_id"] for b in batches(settings)}
    return sorted(path for b, path in found.items() if b not in committed)


def undiscarded_leftovers(settings: Settings, store) -> dict[str, str]:
    """``staging_leftovers`` but those of a discarded write: a kill that catches a batch
    between its fence and the deletion of its files leaves them invisible and orphan
    clean-up's (recovery deletes only writes still in flight). Maps batch id -> status
    (``writing``, ``committed``, or ``unknown``): each one is recovery's miss."""
    left = {p.split("batch=", 1)[1]: p for p in staging_leftovers(settings)}
    statuses = store.write_statuses(left)
    return {b: statuses.get(b, "unknown") for b in left if statuses.get(b) != "discarded"}


def deadletters(spark, settings: Settings, datasource: str) -> list[tuple[str, int, str]]:
    """Committed dead letters as sorted (partition, offset, reason), from ``<D>_deadletter``."""
    rows = table_rows(settings, datasource + "_deadletter", ["partition", "offset", "reason"])
    if rows is None:
        return []
    return sorted(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                      rows.column("reason").to_pylist(), strict=True))


def segment_batch_ids(settings: Settings, datasource: str) -> set[str]:
    """Batch ids of the data files the table's current snapshot references."""
    tables = open_tables(settings)
    try:
        table = tables.load(datasource)
        if table is None:
            return set()
        paths = [t.file.file_path for t in table.scan().plan_files()]
    finally:
        tables.catalog.engine.dispose()
    return {p.split("/batch=", 1)[1].split("/", 1)[0] for p in paths if "/batch=" in p}


class TableWatcher:
    """Reads table ``name`` through the catalog in a loop (in a thread) and records, for
    every state it saw, the rows each batch had visible: a batch must appear whole or not
    at all. ``check(settings)`` asserts that against the committed batches."""

    def __init__(self, settings: Settings, name: str, interval: float = 0.005):
        import threading

        self.settings, self.name, self.interval = settings, name, interval
        self.states: list[dict[str, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._tables = open_tables(self.settings)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._scan()
        self._tables.catalog.engine.dispose()

    @property
    def seen(self) -> set[str]:
        return {b for state in self.states for b in state}

    def _scan(self) -> None:
        table = self._tables.load(self.name)
        if table is None:
            return
        state: dict[str, int] = collections.Counter()
        for task in table.scan().plan_files():
            path = task.file.file_path
            batch = path.split("/batch=", 1)[1].split("/", 1)[0] if "/batch=" in path else path
            state[batch] += task.file.record_count
        if not self.states or self.states[-1] != state:
            self.states.append(dict(state))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
            except Exception as exc:  # noqa: BLE001 - reported by check(), not lost in the thread
                self.errors.append(repr(exc))
            time.sleep(self.interval)

    def check(self, settings: Settings | None = None) -> None:
        """Every state seen holds each batch's rows whole (as committed), and nothing else."""
        rows = {b["batch_id"]: b["rows"] for b in batches(settings or self.settings)}
        assert not self.errors, self.errors[:3]
        for state in self.states:
            for batch, n in state.items():
                assert batch in rows, f"a reader saw files of batch {batch}, which never committed"
                assert n == rows[batch], f"a reader saw {n} of batch {batch}'s {rows[batch]} rows"
