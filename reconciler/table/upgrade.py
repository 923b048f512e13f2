"""The upgrade from the old layout (committed Parquet files under
``<segments>/<D>/time_chunk=<chunk>/<batch>-<n>.parquet``, dead letters under
``<segments>/_deadletter/<D>/``): the files are added in place, in one commit per table
marked ``reconciler.imported-segments=true`` (so a second run does nothing), with one
snapshot per supervisor carrying the offset ranges of its imported batches."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from pyiceberg.exceptions import ValidationException
from pyiceberg.table import Table, TableProperties

from reconciler import faults
from reconciler.errors import CommitOutcomeUnknown
from reconciler.store.batches import TableConflict
from reconciler.table import durable
from reconciler.table.catalog import (
    BATCH,
    DATASOURCE,
    EPOCH,
    RANGES,
    RECORDS,
    SUPERVISOR,
    TIME,
    Tables,
    append_files,
    deadletter_table,
)
from reconciler.table.compact import COMMIT_ATTEMPTS, OPERATION
from reconciler.table.expire import fold_ranges
from reconciler.table.reports import MaintenanceError, _camel
from reconciler.table.writeids import new_write_id

log = logging.getLogger(__name__)

IMPORTED = "reconciler.imported-segments"  # table property: "true" once the old layout is imported


@dataclass
class ImportResult:
    datasource: str
    dry_run: bool
    already_imported: bool = False
    files: int = 0
    rows: int = 0
    dead_files: int = 0
    batches: int = 0
    supervisors: list[str] = field(default_factory=list)
    promoted_staged_batches: int = 0
    unknown_batch_files: int = 0  # files whose batch the database does not know (imported anyway)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self))


OLD_STAGING, OLD_DEADLETTER, OLD_CHUNK_PREFIX = "_staging", "_deadletter", "time_chunk="


def old_layout_datasources(segments_dir: str | os.PathLike[str]) -> list[str]:
    """Datasources that have files in the old layout under ``segments_dir``."""
    root = Path(segments_dir)
    names = set()
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and not d.name.startswith(("_", ".")) and any(
                    c.is_dir() and c.name.startswith(OLD_CHUNK_PREFIX) for c in d.iterdir()):
                names.add(d.name)
        dead = root / OLD_DEADLETTER
        if dead.is_dir():
            names |= {d.name for d in dead.iterdir() if d.is_dir() and not d.name.startswith(".")}
        staging = root / OLD_STAGING
        if staging.is_dir():
            for d in staging.iterdir():
                doc = _read_json(d / "_manifest.json")
                if doc and doc.get("datasource"):
                    names.add(doc["datasource"])
    return sorted(names)


def import_segments(
    tables: Tables,
    store: Any,
    segments_dir: str | os.PathLike[str],
    datasource: str,
    *,
    granularity: str | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
) -> ImportResult:
    """Add the committed segment files of the old layout to table ``datasource`` (and its
    dead letters to ``<datasource>_deadletter``), in place, once.

    ``store`` is the metadata store (``engine`` and ``committed_batch_ids`` are used):
    staged batches the database says are committed are moved to their final paths first
    (what the old start-up recovery did), and the offset ranges of the imported batches
    go into the import snapshots' summaries, one snapshot per supervisor, so ``verify``
    sees them. ``granularity`` is the segment granularity of a table created here
    (default hour). A table already marked ``reconciler.imported-segments`` is left alone."""
    root = Path(segments_dir).absolute()
    result = ImportResult(datasource=datasource, dry_run=dry_run)
    if not dry_run:
        result.promoted_staged_batches = _promote_staged(root, datasource, store)
    data_files = _old_files(root / datasource, chunked=True)
    dead_files = _old_files(root / OLD_DEADLETTER / datasource, chunked=False)
    done = None
    for attempt in range(1, attempts + 1):
        try:
            if done is None:
                done = _import_table(tables, store, datasource, data_files, granularity, result, dry_run)
            _import_dead(tables, store, datasource, dead_files, result, dry_run)
        except (TableConflict, ValidationException) as exc:
            # Planned again on the new version: a concurrent import that won is seen as
            # "already imported", never imported twice.
            log.info("import of %s: the table moved (%s); again", datasource, exc)
            time.sleep(min(0.05 * attempt, 0.5))
            continue
        if done == "already":
            result.already_imported = True
            result.message = "already imported"
        elif dry_run:
            result.message = (f"would import {result.files} file(s) ({result.rows} rows) and "
                              f"{result.dead_files} dead-letter file(s)")
        else:
            result.message = (f"imported {result.files} file(s) ({result.rows} rows), {result.dead_files} "
                              f"dead-letter file(s), ranges of {result.batches} batch(es)")
            log.info("import of %s: %s", datasource, result.message)
        return result
    raise MaintenanceError(f"import of {datasource}: gave up after {attempts} attempts: the table kept moving")


def _import_table(tables: Tables, store, datasource: str, files: list[Path], granularity: str | None,
                  result: ImportResult, dry_run: bool) -> str:
    table = tables.load(datasource)
    if table is not None and table.properties.get(IMPORTED) == "true":
        return "already"
    in_table = _batch_ids_in(table) if table is not None else set()
    batches = [b for b in _datasource_batches(store.engine, datasource) if b["batch_id"] not in in_table]
    known = {b["batch_id"]: b for b in batches}
    by_sup: dict[str, list[str]] = defaultdict(list)
    unknown: list[str] = []
    for f in files:
        b = known.get(_old_batch_id(f))
        (by_sup[b["supervisor_id"]] if b else unknown).append(str(f))
    result.files = len(files)
    result.rows = sum(pq.read_metadata(f).num_rows for f in files)
    result.batches = len(batches)
    result.unknown_batch_files = len(unknown)
    sups = sorted({b["supervisor_id"] for b in batches})
    result.supervisors = sups
    if dry_run or (table is None and not files and not batches):
        return "dry"
    if table is None:
        schema = _unified_schema(files) if files else pa.schema([pa.field(TIME, pa.timestamp("us", tz="UTC"))])
        table = tables.ensure(datasource, schema, granularity or "hour")

    def build(tx):
        if tx.table_metadata.properties.get(IMPORTED) == "true":
            raise TableConflict(f"table {datasource} was imported meanwhile")
        if files:
            schema = _unified_schema(files)
            have = {f.name for f in tx.table_metadata.schema().fields}
            if any(n not in have for n in schema.names):
                with tx.update_schema() as update:
                    update.union_by_name(schema)
                tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                                     tx.table_metadata.schema().name_mapping.model_dump_json()})
        for sid in sups:
            mine = [b for b in batches if b["supervisor_id"] == sid]
            ranges = fold_ranges({sid: [r for b in mine for r in b["ranges"]]}).get(sid, [])
            summary = {OPERATION: "import", DATASOURCE: datasource, SUPERVISOR: sid,
                       BATCH: f"import:{len(mine)}", EPOCH: str(max(b["epoch"] for b in mine)),
                       RANGES: json.dumps(ranges), RECORDS: str(sum(b["records"] for b in mine))}
            append_files(tx, [str(f) for f in by_sup.get(sid, [])], summary)
        if unknown:  # files the database has no batch for: they were visible, so they are kept
            append_files(tx, unknown, {OPERATION: "import", DATASOURCE: datasource})
        tx.set_properties({IMPORTED: "true"})

    _commit(tables, store, datasource, build)
    return "done"


def _import_dead(tables: Tables, store, datasource: str, files: list[Path], result: ImportResult,
                 dry_run: bool) -> None:
    name = deadletter_table(datasource)
    table = tables.load(name)
    if table is not None and table.properties.get(IMPORTED) == "true":
        return
    result.dead_files = len(files)
    if dry_run or not files:
        return
    if table is None:
        tables.ensure(name, _unified_schema(files), None)

    def build(tx):
        if tx.table_metadata.properties.get(IMPORTED) == "true":
            raise TableConflict(f"table {name} was imported meanwhile")
        append_files(tx, [str(f) for f in files], {OPERATION: "import", DATASOURCE: datasource})
        tx.set_properties({IMPORTED: "true"})

    _commit(tables, store, name, build)


def _commit(tables: Tables, store, name: str, build) -> None:
    """One import commit: a write fenced like any other (its metadata files carry its tag),
    and a compare-and-swap on exactly the version it was staged on (``Store.commit_tables``),
    never retried by pyiceberg on a newer one (which re-applied the same files: issue 28)."""
    write_id = new_write_id()
    store.begin_write(write_id, "import", tables=[name])
    commit = None
    try:
        commit = tables.stage(name, build, write_id=write_id)
        faults.point("import-commit", name)
        store.commit_tables(write_id, "import", [commit])
    except CommitOutcomeUnknown:
        if store.fence_write(write_id):
            if commit is not None:
                tables.discard_staged([commit])
            raise
        tables.committed([commit])  # it committed after all
        return
    except BaseException:
        if commit is not None:
            tables.discard_staged([commit])
        store.fence_write(write_id)
        raise
    tables.committed([commit])


def _old_files(directory: Path, *, chunked: bool) -> list[Path]:
    if not directory.is_dir():
        return []
    dirs = sorted(d for d in directory.iterdir() if d.is_dir() and d.name.startswith(OLD_CHUNK_PREFIX)) \
        if chunked else [directory]
    out = []
    for d in dirs:
        for p in sorted(d.iterdir()):
            if p.is_file() and p.suffix == ".parquet" and not p.name.startswith((".", "_")):
                if pq.read_metadata(p).num_rows > 0:
                    out.append(p)
    return out


def _old_batch_id(path: Path) -> str:
    return path.stem.rsplit("-", 1)[0]  # <batch>-<n>.parquet


def _unified_schema(files: Sequence[Path]) -> pa.Schema:
    schemas = {str(pq.read_schema(f).remove_metadata()): pq.read_schema(f).remove_metadata() for f in files}
    return pa.unify_schemas(list(schemas.values()))


def _batch_ids_in(table: Table) -> set[str]:
    return {s.summary.additional_properties.get(BATCH) for s in table.metadata.snapshots
            if s.summary and s.summary.additional_properties.get(BATCH)}


_batches = sa.table("batches", sa.column("batch_id"), sa.column("supervisor_id"), sa.column("datasource"),
                    sa.column("epoch"), sa.column("status"), sa.column("ranges"), sa.column("records"))


def _datasource_batches(engine: sa.Engine, datasource: str) -> list[dict[str, Any]]:
    """Committed batches of a datasource (``batches`` table), ranges decoded."""
    with engine.connect().execution_options(readonly=True) as c, c.begin():
        rows = c.execute(sa.select(_batches).where(_batches.c.datasource == datasource,
                                                   _batches.c.status.in_(("committed", "promoted")))).mappings().all()
    out = []
    for r in rows:
        ranges = []
        for x in json.loads(r["ranges"] or "[]"):
            p, s, e = (x["partition"], x["start"], x["end"]) if isinstance(x, dict) else x
            ranges.append((str(p), int(s), int(e)))
        out.append({**dict(r), "ranges": ranges, "epoch": int(r["epoch"]), "records": int(r["records"] or 0)})
    return out


def _promote_staged(root: Path, datasource: str, store) -> int:
    """Finish the promote of old-layout staged batches the database says are committed
    (a crash between publish and promote before the upgrade)."""
    staging = root / OLD_STAGING
    if not staging.is_dir():
        return 0
    docs = {}
    for d in sorted(staging.iterdir()):
        doc = _read_json(d / "_manifest.json")
        if doc and doc.get("datasource") == datasource and doc.get("batch_id") == d.name:
            docs[d.name] = (d, doc)
    committed = store.committed_batch_ids(docs) if docs else set()
    for batch_id in sorted(committed):
        d, doc = docs[batch_id]
        moved: list[Path] = []
        for f in [*doc.get("files", ()), *doc.get("dead_files", ())]:
            src, dst = Path(f["staging_path"]), Path(f["final_path"])
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
            elif not dst.exists():
                raise MaintenanceError(f"batch {batch_id}: {src} is gone and {dst} does not exist")
            moved.append(dst)
        # The import commits these paths: the renames (and any new directory up to the
        # segments directory) are made durable before it, and before the staging goes.
        durable.sync(moved, {a for p in moved for a in durable.ancestors(p, root)})
        shutil.rmtree(d, ignore_errors=True)
    return len(committed)


# =========================================================================== helpers


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
