"""The Iceberg catalog in the metadata database, and appends staged for the publish.

pyiceberg's ``SqlCatalog`` commits a table by writing a new metadata file and then
``UPDATE iceberg_tables SET metadata_location = :new WHERE metadata_location = :current``
in its own transaction. The publish needs that pointer move in *our* transaction,
together with the checkpoint compare-and-swap, so ``stage_append`` runs pyiceberg's
transaction up to the metadata file and hands back a ``TableCommit``; the store
executes the same compare-and-swap UPDATE inside the publish (``Store.publish``).
Until then the new metadata file, manifests and data files are unreferenced: no
reader sees them, and ``orphans.remove_orphans`` deletes them if the publish lost.

Everything else (creating tables, compaction, expiry) commits through pyiceberg's
own ``commit_table``, the same compare-and-swap, so they interleave safely with
ingestion: whoever moves the pointer second re-stages on the new metadata.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import sqlalchemy as sa
from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import CommitTableResponse, Table, TableProperties, Transaction
from pyiceberg.table.update import update_table_metadata
from pyiceberg.utils.properties import property_as_bool

from reconciler.table.datafiles import describe
from reconciler.table.schema import partition_transform

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

CATALOG = "reconciler"
NAMESPACE = "default"
DEADLETTER_SUFFIX = "_deadletter"
TIME = "__time"
BATCH_DIR_PREFIX = "batch="  # <table>/data/batch=<batch id>/...: one batch's files

# Snapshot summary keys: who wrote the snapshot and which offsets it holds.
SUPERVISOR = "reconciler.supervisor"
BATCH = "reconciler.batch-id"
EPOCH = "reconciler.epoch"
RANGES = "reconciler.ranges"  # JSON [[partition, start, end], ...]
RECORDS = "reconciler.records"
UNPARSEABLE = "reconciler.unparseable"
DATASOURCE = "reconciler.datasource"

# Table properties set at creation: metadata files of old versions are kept to a few, and
# the one-manifest-per-commit of a fast append is merged every 100 commits, so neither the
# metadata log nor the manifest list grows with the table's history.
_TABLE_PROPERTIES = {
    "write.metadata.previous-versions-max": "20",
    "commit.manifest-merge.enabled": "true",
    "write.parquet.compression-codec": "snappy",
}


@dataclass(frozen=True)
class TableCommit:
    """A staged table change: move the pointer of ``table`` from ``expected`` to ``new``."""

    table: str
    expected: str
    new: str
    staged: Table | None = field(default=None, compare=False, repr=False)  # the table as it will be


class TableConflict(Exception):
    """The table moved since the commit was staged (another batch, a compaction): re-stage."""


def deadletter_table(datasource: str) -> str:
    return datasource + DEADLETTER_SUFFIX


def local_path(location: str) -> Path:
    """A ``file://`` location (or a plain path) as a local path."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    raise ValueError(f"{location}: only a local (or shared, mounted) warehouse is supported here")


class _StagingCatalog(SqlCatalog):
    """``SqlCatalog`` on our engine, whose commit can stop before the pointer move."""

    def __init__(self, engine: sa.Engine, warehouse: str, ddl_engine: sa.Engine | None = None):
        MetastoreCatalog.__init__(self, CATALOG, uri=engine.url.render_as_string(hide_password=True),
                                  warehouse=warehouse)
        # Creating the catalog's tables writes after reading. On SQLite a deferred (read)
        # transaction that then writes cannot wait for another writer: it fails at once
        # with "database is locked" (seen when a daemon's first batch met its lease
        # renewal). The writable engine begins IMMEDIATE, which waits its busy timeout.
        self.engine = ddl_engine if ddl_engine is not None else engine
        self._init_catalog()
        self.engine = engine
        self._staging = threading.local()

    def commit_table(self, table, requirements, updates) -> CommitTableResponse:
        out: list[TableCommit] | None = getattr(self._staging, "out", None)
        if out is None:
            return super().commit_table(table, requirements, updates)
        # The compare-and-swap must expect exactly the version the new metadata was built
        # on: read both once, before staging (pyiceberg re-reads ``table`` several times).
        base_location, base = table.metadata_location, table.metadata
        current = Table(identifier=table.name(), metadata=base, metadata_location=base_location,
                        io=table.io, catalog=self)
        staged = self._update_and_stage_table(current, table.name(), requirements, updates)
        log_ = staged.metadata.metadata_log
        if not log_ or log_[-1].metadata_file != base_location:
            raise TableConflict(f"table {table.name()[-1]}: staged on a version other than {base_location}")
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        after = Table(identifier=staged.name(), metadata=staged.metadata, metadata_location=staged.metadata_location,
                      io=staged.io, catalog=self)
        out.append(TableCommit(table.name()[-1], base_location, staged.metadata_location, after))
        return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)


class _Transaction(Transaction):
    """pyiceberg's ``Transaction`` re-applies its staged updates to a deep copy of the whole
    table metadata on every read of ``table_metadata`` (twenty reads in one ``add_files``),
    which made a commit cost grow with the table's history. The metadata is immutable, so
    one result per state of the staged updates serves every reader."""

    _cached: tuple = ((), None)

    @property
    def table_metadata(self):
        updates = self._updates
        if self._cached[1] is None or self._cached[0] is not updates:
            self._cached = (updates, update_table_metadata(self._table.metadata, updates))
        return self._cached[1]


class Tables:
    """The datasources' tables: create, evolve, stage appends, load for reading."""

    def __init__(self, engine: sa.Engine, warehouse: str | os.PathLike[str]):
        root = Path(warehouse).absolute()
        root.mkdir(parents=True, exist_ok=True)
        self.warehouse = root
        # Reads take no write lock on SQLite (see store.engine); pyiceberg's own writes
        # (create table, compaction commits) upgrade under busy_timeout.
        self.catalog = _StagingCatalog(engine.execution_options(readonly=True), root.as_uri(), ddl_engine=engine)
        self._lock = threading.Lock()
        self._namespace_ready = False
        self._engine = engine
        # name -> (metadata location, metadata, io) last seen: immutable, shared by threads.
        # Reading a metadata file costs more the longer the table's history; a cheap pointer
        # query says whether it moved.
        self._known: dict[str, tuple] = {}

    # -- tables -----------------------------------------------------------------------

    def load(self, name: str) -> Table | None:
        try:
            return self.catalog.load_table((NAMESPACE, name))
        except NoSuchTableError:
            return None

    def names(self) -> list[str]:
        try:
            return sorted(ident[-1] for ident in self.catalog.list_tables(NAMESPACE))
        except Exception:  # noqa: BLE001 - no namespace yet: no tables
            return []

    def ensure(self, name: str, schema: pa.Schema, granularity: str | None) -> Table:
        """The table ``name``, created with ``schema`` (and ``__time`` partitioned by
        ``granularity``, None for unpartitioned) when it does not exist."""
        table = self.load(name)
        if table is not None:
            return table
        with self._lock:
            if not self._namespace_ready:
                try:
                    self.catalog.create_namespace_if_not_exists(NAMESPACE)
                except sa.exc.IntegrityError:  # another process created it just now
                    pass
                self._namespace_ready = True
            try:
                table = self.catalog.create_table((NAMESPACE, name), schema=schema, properties=_TABLE_PROPERTIES)
            except (TableAlreadyExistsError, sa.exc.IntegrityError):  # another process was first
                return self.catalog.load_table((NAMESPACE, name))
            if granularity is not None:
                with table.update_spec() as spec:
                    spec.add_field(TIME, partition_transform(granularity), f"{TIME}_{granularity_name(granularity)}")
                table = self.catalog.load_table((NAMESPACE, name))
            log.info("created Iceberg table %s.%s at %s", NAMESPACE, name, table.location())
            return table

    def _current(self, name: str) -> Table:
        with self._engine.connect().execution_options(readonly=True) as c, c.begin():
            location = c.execute(sa.text(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :c AND table_namespace = :n "
                "AND table_name = :t"), {"c": CATALOG, "n": NAMESPACE, "t": name}).scalar()
        known = self._known.get(name)
        if known is None or location is None or known[0] != location:
            table = self.catalog.load_table((NAMESPACE, name))
            known = (table.metadata_location, table.metadata, table.io)
            self._known[name] = known
        # A private Table each time: pyiceberg's commit assigns the staged (not yet
        # published) metadata to the Table it committed on, and two runtimes publish to one
        # table from two threads. A shared Table let one stage on the other's unpublished
        # version and compare-and-swap against it, dropping a committed snapshot.
        return Table(identifier=(NAMESPACE, name), metadata=known[1], metadata_location=known[0], io=known[2],
                     catalog=self.catalog)

    def committed(self, commits: Sequence[TableCommit]) -> None:
        """The publish of ``commits`` succeeded: their staged tables are the tables now."""
        for tc in commits:
            if tc.staged is not None:
                self._known[tc.table] = (tc.new, tc.staged.metadata, tc.staged.io)

    def data_dir(self, table: Table, batch_id: str) -> Path:
        """Where one batch's data files are written (unreferenced until the publish)."""
        return local_path(table.location()) / "data" / f"{BATCH_DIR_PREFIX}{batch_id}"

    # -- the staged append (the publish) ----------------------------------------------

    def stage_append(self, name: str, files: Sequence[str], properties: Mapping[str, str], *,
                     schema: pa.Schema | None = None, granularity: str | None = None) -> TableCommit:
        """Stage one snapshot appending ``files`` (written elsewhere) with ``properties`` in
        its summary, evolving the schema and partitioning first when the batch brings new
        columns or another segment granularity. Returns the pointer move for the publish."""
        table = self._current(name)
        out: list[TableCommit] = []
        self.catalog._staging.out = out
        try:
            with _Transaction(table) as tx:
                if schema is not None and _new_columns(tx.table_metadata, schema):
                    with tx.update_schema() as update:
                        update.union_by_name(schema)
                    tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                                         tx.table_metadata.schema().name_mapping.model_dump_json()})
                if granularity is not None:
                    _evolve_partitioning(tx, granularity)
                _append(tx, files, properties)
        finally:
            self.catalog._staging.out = None
        if len(out) != 1:
            raise RuntimeError(f"staging {name}: expected one metadata change, got {len(out)}")
        return out[0]


def _append(tx: Transaction, files: Sequence[str], properties: Mapping[str, str]) -> None:
    """``tx.add_files(files)`` without its per-file schema work (``datafiles``): the
    files are a batch's, written where nothing else references them, so no duplicate
    check either."""
    if tx.table_metadata.name_mapping() is None:
        tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                             tx.table_metadata.schema().name_mapping.model_dump_json()})
    entries = describe(tx.table_metadata, list(files))
    update = tx.update_snapshot(snapshot_properties=dict(properties))
    merge = property_as_bool(tx.table_metadata.properties, TableProperties.MANIFEST_MERGE_ENABLED,
                             TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT)
    with (update.merge_append() if merge else update.fast_append()) as producer:
        for entry in entries:
            producer.append_data_file(entry)


def granularity_name(granularity: str) -> str:
    return {"minute": "hour", "fifteen_minute": "hour"}.get(granularity, granularity)


def _new_columns(metadata: TableMetadata, schema: pa.Schema) -> bool:
    have = {f.name for f in metadata.schema().fields}
    return any(name not in have for name in schema.names)


def _evolve_partitioning(tx, granularity: str) -> None:
    """A changed segment granularity changes the partition transform of ``__time`` (files
    already written keep theirs: Iceberg plans across partition specs)."""
    metadata = tx.table_metadata
    time_id = metadata.schema().find_field(TIME).field_id
    wanted = partition_transform(granularity)
    current = [f for f in metadata.spec().fields if f.source_id == time_id]
    if len(current) == 1 and current[0].transform == wanted:
        return
    with tx.update_spec() as spec:
        for f in current:
            spec.remove_field(f.name)
        spec.add_field(TIME, wanted, f"{TIME}_{granularity_name(granularity)}_{metadata.last_partition_id or 0}")


def summary_ranges(properties: Mapping[str, str]) -> list[tuple[str, int, int]]:
    """The ``[partition, start, end)`` ranges a snapshot summary carries (none for others)."""
    raw = properties.get(RANGES)
    if not raw:
        return []
    return [(str(p), int(s), int(e)) for p, s, e in json.loads(raw)]
