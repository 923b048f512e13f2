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

import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import sqlalchemy as sa
from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import CommitTableResponse, Table, TableProperties, Transaction
from pyiceberg.table.update import update_table_metadata
from pyiceberg.utils.properties import property_as_bool

from reconciler import faults
from reconciler.errors import PermanentError
from reconciler.table import durable, grace, retention, storage
from reconciler.table.datafiles import describe
from reconciler.table.locations import CATALOG, DEADLETTER_SUFFIX, NAMESPACE, local_path
from reconciler.table.reach import _ManifestReader
from reconciler.table.schema import partition_transform
from reconciler.table.summary import (  # noqa: F401  (the summary keys, where the publish finds them)
    BATCH,
    DATASOURCE,
    EPOCH,
    GENERATION,
    RANGES,
    READ,
    RECORDS,
    ROLLUP_PROPERTY,
    SUPERVISOR,
    UNPARSEABLE,
    summary_ranges,
)
from reconciler.table.writeids import (
    BATCH_DIR_PREFIX,
    is_write_id,
    tag,
    write_id_of_name,
)

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

TIME = "__time"

# Table properties set at creation: a short metadata log, merged manifests (retention.py).
_TABLE_PROPERTIES = {**retention.PROPERTIES, "write.parquet.compression-codec": "snappy"}


@dataclass(frozen=True)
class TableCommit:
    """A staged table change: move the pointer of ``table`` from ``expected`` to ``new``."""

    table: str
    expected: str
    new: str
    staged: Table | None = field(default=None, compare=False, repr=False)  # the table as it will be
    write_id: str | None = None
    files: tuple[str, ...] = ()  # the metadata files this staging wrote (durable before the commit)
    superseded: tuple[str, ...] = ()  # files the version before needed and this one does not (retention.py)


class RollupMismatch(PermanentError):
    """A batch made with (or without) rollup for a table that holds the other kind of rows."""


class TableConflict(Exception):
    """The table moved since the commit was staged (another batch, a compaction): re-stage."""


def deadletter_table(datasource: str) -> str:
    return datasource + DEADLETTER_SUFFIX


class _StagingCatalog(SqlCatalog):
    """``SqlCatalog`` on our engine, whose commit can stop before the pointer move."""

    def __init__(self, engine: sa.Engine, warehouse: str, ddl_engine: sa.Engine | None = None,
                 properties: Mapping[str, str] | None = None):
        # ``properties``: how pyiceberg's file IO reaches an object store (storage.py).
        MetastoreCatalog.__init__(self, CATALOG, uri=engine.url.render_as_string(hide_password=True),
                                  warehouse=warehouse, **dict(properties or {}))
        # Creating the catalog's tables writes after reading. On SQLite a deferred (read)
        # transaction that then writes cannot wait for another writer: it fails at once
        # with "database is locked" (seen when a daemon's first batch met its lease
        # renewal). The writable engine begins IMMEDIATE, which waits its busy timeout.
        self.engine = ddl_engine if ddl_engine is not None else engine
        self._init_catalog()
        self.engine = engine
        self._staging = threading.local()
        self._root = Path(warehouse) if not storage.is_object_store(warehouse) else None

    def _write_metadata(self, metadata, io, metadata_path: str) -> None:
        """pyiceberg's own commits (a table's creation) move the catalog row right after
        writing the metadata file: it and the directories up to the warehouse are made
        durable first. A staging makes its files durable itself (``_staged_files``)."""
        MetastoreCatalog._write_metadata(metadata, io, metadata_path)
        if getattr(self._staging, "out", None) is not None:
            return
        if self._root is None:  # object storage: a PUT that returned is durable
            return
        path = local_path(metadata_path)
        durable.sync([path], durable.ancestors(path, self._root.parent))

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
        write_id, tag_ = self._staging.write_id, self._staging.tag
        # pyiceberg names the file <version>-<random uuid>; the write's tag instead tells
        # every clean-up whose file it is (writeids.py).
        folder, name = staged.metadata_location.rsplit("/", 1)
        location = f"{folder}/{name.split('-', 1)[0]}-{tag_}.metadata.json"
        faults.point("write-metadata", table.name()[-1])
        self._write_metadata(staged.metadata, staged.io, location)
        files = _staged_files(location, str(tag_))
        after = Table(identifier=staged.name(), metadata=staged.metadata, metadata_location=location,
                      io=staged.io, catalog=self)
        reader = _ManifestReader(staged.io)
        gone = retention.superseded(base, staged.metadata, reader) + retention.unused(files, location, staged.metadata, reader)
        out.append(TableCommit(table.name()[-1], base_location, location, after, write_id, files, tuple(gone)))
        return CommitTableResponse(metadata=staged.metadata, metadata_location=location)


def _staged_files(metadata_location: str, tag_: str) -> tuple[str, ...]:
    """The files one staging wrote (metadata JSON, manifest list, manifests: all carry its
    tag), made durable here, before anything can commit them."""
    if storage.is_object_store(metadata_location):
        # A PUT that returned is durable: only found (by the folder's prefix), for a discard.
        folder_location = metadata_location.rsplit("/", 1)[0]
        listed = storage.at(folder_location).list(folder_location)
        return tuple(sorted(x for x in listed if tag_ in x.rsplit("/", 1)[-1]))
    folder = local_path(metadata_location).parent
    files = sorted(str(p) for p in folder.iterdir() if tag_ in p.name)
    durable.sync(files, [folder])
    return tuple(files)


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

    PROTOCOL = "sql"  # the publish moves the pointer in our transaction (runtime.publish_sql)

    def __init__(self, engine: sa.Engine, warehouse: str | os.PathLike[str], *,
                 snapshots_kept: int = retention.DEFAULT_KEPT, reader_grace: float = grace.DEFAULT_READER_GRACE):
        self.storage = storage.at(warehouse)
        if self.storage.remote:  # an object store: no directories to make, none to fsync
            root = str(warehouse).rstrip("/")
            self.storage.ensure_bucket()
            properties = storage.current().iceberg_properties()
        else:
            root = Path(local_path(str(warehouse))).absolute()
            root.mkdir(parents=True, exist_ok=True)
            properties = {}
        self.warehouse = root
        # Reads take no write lock on SQLite (see store.engine); pyiceberg's own writes
        # (create table, compaction commits) upgrade under busy_timeout.
        # The plain path, not ``root.as_uri()``: pyiceberg does not percent-decode a file URI,
        # so a path with a space would be written under "%20" while everything else looked
        # under " ".
        self.catalog = _StagingCatalog(engine.execution_options(readonly=True), str(root), ddl_engine=engine,
                                       properties=properties)
        self._lock = threading.Lock()
        self._namespace_ready = False
        self._engine = engine
        # name -> (metadata location, metadata, io) last seen: immutable, shared by threads.
        # Reading a metadata file costs more the longer the table's history; a cheap pointer
        # query says whether it moved.
        self._known: dict[str, tuple] = {}
        self.snapshots_kept = snapshots_kept
        self.retired = grace.Retired(reader_grace, lambda files: _delete_quietly(self.storage, files))

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

    def ensure(self, name: str, schema: pa.Schema, granularity: str | None, *, rollup: bool | None = None) -> Table:
        """The table ``name``, created with ``schema`` (and ``__time`` partitioned by
        ``granularity``, None for unpartitioned) when it does not exist. ``rollup`` is
        recorded as the table's ``reconciler.rollup`` (see ``stage_append``)."""
        try:  # asked before every batch: the pointer query, the metadata read only when it moved
            return self.current(name)
        except NoSuchTableError:
            pass  # none yet: made below
        with self._lock:
            if not self._namespace_ready:
                try:
                    self.catalog.create_namespace_if_not_exists(NAMESPACE)
                except sa.exc.IntegrityError:  # another process created it just now
                    pass
                self._namespace_ready = True
            try:
                props = dict(_TABLE_PROPERTIES)
                if rollup is not None:
                    props[ROLLUP_PROPERTY] = str(rollup).lower()
                # One commit with the partition spec: a second one wrote a metadata file
                # nothing referenced yet and no write id protects (orphan clean-up judges it
                # by age alone) under a table that already existed.
                tx = self.catalog.create_table_transaction((NAMESPACE, name), schema=schema, properties=props)
                if granularity is not None:
                    with tx.update_spec() as spec:
                        spec.add_field(TIME, partition_transform(granularity),
                                       f"{TIME}_{granularity_name(granularity)}")
                tx.commit_transaction()
            except (TableAlreadyExistsError, CommitFailedException, sa.exc.IntegrityError):
                return self.catalog.load_table((NAMESPACE, name))  # another process was first
            table = self.catalog.load_table((NAMESPACE, name))
            faults.point("table-created", name)  # committed, its files not yet made durable
            self._make_durable(table)
            log.info("created Iceberg table %s.%s at %s", NAMESPACE, name, table.location())
            return table

    def _make_durable(self, table: Table) -> None:
        """A new table's metadata files and every directory from them up to the warehouse:
        pyiceberg's own commits (creating the table, its partition spec) fsync nothing, and
        the catalog row that points at them is already committed."""
        if self.storage.remote:  # object storage: a PUT that returned is durable
            return
        folder = local_path(table.metadata_location).parent
        (folder.parent / "data").mkdir(exist_ok=True)  # its entry is made durable here, once
        durable.sync([p for p in folder.iterdir() if p.is_file()],
                     [folder.parent / "data", *durable.ancestors(folder / "x", self.warehouse.parent)])

    def current(self, name: str) -> Table:
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
        """The commit of ``commits`` succeeded (and is durable): their staged tables are the
        tables now, and the files only the versions before them needed go."""
        for tc in commits:
            if tc.staged is not None:
                self._known[tc.table] = (tc.new, tc.staged.metadata, tc.staged.io)
        faults.point("superseded-delete", None)
        self.retired.retire(f for tc in commits for f in tc.superseded)  # after readers' grace (grace.py)

    def data_dir(self, table: Table, batch_id: str) -> Path | str:
        """Where one batch's data files are written (unreferenced until the publish): a
        local path, or an object store's location (``s3://bucket/.../data/batch=<id>``)."""
        if self.storage.remote:
            return self.storage.join(table.location(), "data", f"{BATCH_DIR_PREFIX}{batch_id}")
        return local_path(table.location()) / "data" / f"{BATCH_DIR_PREFIX}{batch_id}"

    # -- the staged append (the publish) ----------------------------------------------

    def stage(self, name: str, build: Callable[[Transaction], None], *, write_id: str,
              attempt: int = 0, expected: str | None = None) -> TableCommit:
        """Stage one change of table ``name``: ``build(tx)`` adds updates to a transaction on
        the table's current version; its metadata files are written (named with the write's
        tag) and made durable, and the pointer move is returned for the commit's own
        transaction (``Store.publish`` or ``Store.commit_tables``). ``expected``: the
        version (metadata location) the change was planned on; when the table is at
        another one now, ``TableConflict`` and nothing is written. ``write_id`` is the write the
        caller recorded (``Store.begin_write``) before staging: one made up here would be unknown
        to the database, and orphan clean-up would delete its staged metadata once committed."""
        if not isinstance(write_id, str) or not is_write_id(write_id):
            raise ValueError(f"staging {name}: {write_id!r} is not a recorded write id (Store.begin_write)")
        table = self.current(name)
        if expected is not None and table.metadata_location != expected:
            raise TableConflict(f"table {name}: planned on {expected}, now at {table.metadata_location}")
        out: list[TableCommit] = []
        staging = self.catalog._staging
        staging.out, staging.write_id, staging.tag = out, write_id, tag(write_id, attempt)
        try:
            with _Transaction(table) as tx:
                tx.tag = staging.tag
                build(tx)
        finally:
            staging.out = staging.write_id = staging.tag = None
        if len(out) != 1:
            raise RuntimeError(f"staging {name}: expected one metadata change, got {len(out)}")
        return out[0]

    def stage_append(self, name: str, files: Sequence[str], properties: Mapping[str, str], *,
                     schema: pa.Schema | None = None, granularity: str | None = None,
                     rollup: bool | None = None, write_id: str, attempt: int = 0) -> TableCommit:
        """Stage one snapshot appending ``files`` (written elsewhere) with ``properties`` in
        its summary, evolving the schema and partitioning first when the batch brings new
        columns or another segment granularity. Returns the pointer move for the publish.

        ``rollup`` is how the batch's rows were made. A table holds one kind only (its
        ``reconciler.rollup``, set here for a table from before the property): compaction
        merges rolled-up rows, and raw rows merged with them would lose their count, so a
        batch of the other kind is refused (``RollupMismatch``) and nothing is staged."""

        def build(tx: _Transaction) -> None:
            evolve_for_append(tx, name, schema=schema, granularity=granularity, rollup=rollup)
            retention.converge_properties(tx)
            append_files(tx, files, properties)
            retention.expire_beyond(tx, self.snapshots_kept, readers=self.retired.grace > 0)

        return self.stage(name, build, write_id=write_id, attempt=attempt)

    def discard_staged(self, commits: Sequence[TableCommit]) -> None:
        """Delete the metadata files of stagings that did not commit (a lost compare-and-swap
        rolled the whole transaction back, so nothing references them)."""
        for tc in commits:
            _delete_quietly(self.storage, tc.files)

    def write_metadata_files(self, name: str, write_id: str) -> list[str]:
        """The metadata files a write staged on table ``name`` (any attempt), found by its tag."""
        table = self.load(name)
        if table is None:
            return []
        folder = self.storage.join(table.location(), "metadata")
        return sorted(x for x in self.storage.list(folder) if write_id_of_name(x.rsplit("/", 1)[-1]) == write_id)


def evolve_for_append(tx: Transaction, name: str, *, schema: pa.Schema | None, granularity: str | None,
                      rollup: bool | None) -> None:
    """What an append needs of its table first, whatever the catalog: the rollup kind checked
    (recorded for a table from before the property), new columns, the segment granularity."""
    if rollup is not None:
        recorded = tx.table_metadata.properties.get(ROLLUP_PROPERTY)
        if recorded is None:
            tx.set_properties(**{ROLLUP_PROPERTY: str(rollup).lower()})
        elif recorded != str(rollup).lower():
            raise RollupMismatch(
                f"datasource {name} holds rows written with rollup: {recorded}; a spec with rollup: "
                f"{str(rollup).lower()} cannot write to it (compaction would merge raw rows into rolled-up "
                "ones and lose their counts). Write to a new datasource, or set rollup back")
    if schema is not None and _new_columns(tx.table_metadata, schema):
        with tx.update_schema() as update:
            update.union_by_name(schema)
        tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                             tx.table_metadata.schema().name_mapping.model_dump_json()})
    if granularity is not None:
        _evolve_partitioning(tx, granularity)


def append_files(tx: Transaction, files: Sequence[str], properties: Mapping[str, str]) -> None:
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
    with tagged(update.merge_append() if merge else update.fast_append(), tx) as producer:
        for entry in entries:
            producer.append_data_file(entry)


def tagged(producer, tx):
    """A snapshot producer whose manifests and manifest list carry the staging's tag."""
    tag_ = getattr(tx, "tag", None)
    if tag_ is not None:
        producer.commit_uuid = tag_
        # The producers of one transaction share its tag, so they share its manifest numbers
        # too: each numbers from 0, and two appends in one commit (an import's, one per
        # supervisor) both wrote <tag>-m0.avro, the second over the first's files.
        numbers = getattr(tx, "manifest_numbers", None)
        if numbers is None:
            numbers = tx.manifest_numbers = itertools.count(0)
        producer._manifest_num_counter = numbers
    return producer


def granularity_name(granularity: str) -> str:
    return {"minute": "hour", "fifteen_minute": "hour"}.get(granularity, granularity)


def _new_columns(metadata: TableMetadata, schema: pa.Schema) -> bool:
    """Whether the batch adds a column or widens one (Iceberg's promotions; ``union_by_name``
    refuses anything else, and the publish with it)."""
    from reconciler.table.types import changes

    return bool(changes(metadata.schema(), schema))


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



def _delete_quietly(files: storage.Storage, locations: Sequence[str]) -> None:
    """Delete files no commit needs (superseded after a commit, or staged by one that lost):
    best effort. It runs after the commit, so an error here must not make a committed batch
    look failed; a file the store refuses to delete is orphan clean-up's later."""
    for location in locations:
        try:
            files.delete([location])
        except (OSError, ValueError) as exc:
            log.warning("cannot delete %s (%s); left for orphan clean-up", location, exc)
