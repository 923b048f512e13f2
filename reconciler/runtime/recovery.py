"""Start-up clean-up of the files of writes that never committed, run by the leader before
any runtime starts.

Every write (a batch, a compaction) is recorded in the database before its first file
(``Store.begin_write``), so the writes a crash interrupted are the ones still
``writing``: each is fenced (``Store.fence_write``: it can never commit after this) and
its files deleted: its batch directories, its compaction output, the metadata files its
stagings wrote (named with its tag). The cost is one query plus the writes in flight,
whatever the tables' history.

Batch directories that no write row names (written by a version before the fences) are
found by listing each table's ``data/`` and asked about in chunks; unknown ones are fenced
the same way. Files of committed batches are never touched, and a clean-up that fails is
logged and never stops a leader.

With an external catalog (``catalog: {type: glue | rest}``) the table commits before the
database: each supervisor with a batch in flight is first fenced in its table (a zombie
leader's commit then fails on the tag) and rolled forward to it (``table/catalogs/fence.py``),
and only the writes still in flight after that are fenced.

On an object store (``s3://``) the same fences decide; a write's files are found by its
prefixes (``data/batch=<id>/``, ``data/compacted/<id>/``) and its tag in ``metadata/``.
"""

from __future__ import annotations

import logging
import os

from reconciler import faults
from reconciler.errors import ReconcilerError
from reconciler.store.store import Store, WriteIntent

log = logging.getLogger(__name__)


def recover(store: Store, segments_dir: str | os.PathLike[str], catalog: dict | None = None) -> dict[str, int]:
    from reconciler.table import storage
    from reconciler.table.locations import NAMESPACE

    files = storage.at(segments_dir)
    root = files.join(str(segments_dir), (catalog or {}).get("namespace") or NAMESPACE)
    deleted = 0
    try:
        faults.point("recover", None)
        # Listed before the tables are fenced: a write begun later read the fence after it
        # moved, may still commit, and is left alone (the next recovery fences it first).
        in_flight = store.writes_in_flight()
        if catalog:
            _fence_tables(store, segments_dir, catalog, in_flight)
        for intent in in_flight:
            if store.fence_write(intent.write_id):
                deleted += _delete_write(files, root, intent)
        deleted += _legacy(store, files, root)
    except (OSError, ReconcilerError) as exc:  # files nobody reads: a failed clean-up must not stop leading
        log.warning("recovery: clean-up of uncommitted writes under %s stopped (%s); left for the next start",
                    root, exc)
    if deleted:
        log.info("recovery: %d uncommitted write director%s deleted", deleted, "y" if deleted == 1 else "ies")
    return {"orphansDeleted": deleted}


def _fence_tables(store: Store, segments_dir, catalog: dict, in_flight) -> None:
    """An external catalog's table commits first, and the database's lease is checked only
    after it: the previous leader may still be about to commit a batch in flight (a zombie
    past its lease). So each supervisor with a batch in flight is fenced in its table first
    (its tag moved to a fence snapshot: such a batch's commit now fails on the tag), then
    rolled forward to its table (a batch that did land, a crash between the two commits, is
    recorded, and keeps its files); only then are the writes still in flight fenced and
    deleted. A catalog out of reach stops the whole clean-up (nothing fenced, nothing deleted)."""
    from reconciler.table.catalogs import open_tables
    from reconciler.table.catalogs.fence import fence_leader_change

    batches = {(i.tables[0], i.supervisor_id) for i in in_flight
               if i.kind == "batch" and i.supervisor_id and i.tables}
    if not batches:
        return
    tables = open_tables(store.engine, segments_dir, catalog)
    for name, supervisor_id in sorted(batches):
        fence_leader_change(tables, store, name, supervisor_id)


def _delete_write(files, root: str, intent: WriteIntent) -> int:
    """Delete the files of a fenced write in each table it names; the directories deleted."""
    from reconciler.pipeline import segments
    from reconciler.table.writeids import BATCH_DIR_PREFIX, COMPACTED_DIR, write_id_of_name

    count = 0
    for name in intent.tables:
        table_dir = files.join(root, name)
        for d in (files.join(table_dir, "data", f"{BATCH_DIR_PREFIX}{intent.write_id}"),
                  files.join(table_dir, "data", COMPACTED_DIR, intent.write_id)):
            if files.has_any(d) if files.remote else os.path.exists(d):
                segments.discard(d)
                count += 1
        meta = files.list(files.join(table_dir, "metadata"))
        files.delete(p for p in meta if write_id_of_name(p.rsplit("/", 1)[-1]) == intent.write_id)
    return count


def _legacy(store: Store, files, root: str) -> int:
    """Batch directories of a version before the fences (their ids are not write ids):
    committed ones stay, the others are fenced (recorded as discarded, so a late commit of
    them fails) and deleted. A write id's directory is never asked about: its write was
    recorded before it existed, so it is committed, in flight (fenced above), or discarded
    (orphan clean-up's); asking about every committed batch would make a start cost the
    table's whole history."""
    from reconciler.pipeline import segments
    from reconciler.table.writeids import is_write_id

    found: dict[str, list] = {}
    for table_dir in files.dirs(root):
        for batch_id, path in segments.batch_dirs(table_dir).items():
            if not is_write_id(batch_id):
                found.setdefault(batch_id, []).append(path)
    if not found:
        return 0
    statuses = store.write_statuses(found)
    unknown = [b for b in found if b not in statuses]
    doomed = store.fence_unknown_writes(unknown) | {b for b, s in statuses.items() if s == "discarded"}
    count = 0
    for batch_id in sorted(doomed):
        for path in found[batch_id]:
            try:
                segments.discard(path)
                count += 1
            except OSError as exc:
                log.warning("recovery: cannot delete uncommitted batch directory %s (%s); it stays invisible",
                            path, exc)
    return count

