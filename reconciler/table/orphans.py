"""Orphan clean-up: delete files under a table's location that nothing references, never a
file that a publish or a compaction in flight may still commit.

Safety is a fence in the database, not a clock. Every write records itself before its
first file (``Store.begin_write``) and its files carry its id (``writeids``: the batch or
compaction directory, the tag in a metadata file's name). An unreferenced file of a write
that is

* ``writing`` is kept: it may commit any moment;
* ``discarded``, or a committed batch's (superseded and expired), is deleted;
* a batch directory unknown to the database (written by an older version) is fenced
  first: recorded as ``discarded``, so a late commit of it fails, then deleted;
* any other write unknown to the database (its files carry a tag or sit under
  ``compacted/<id>``: this version wrote them, so it recorded the write first) committed:
  only a commit removes a row. Its unreferenced files are superseded and deleted; it is
  never recorded as discarded, which its own process, resolving a commit whose outcome
  it did not learn, would take for "not committed".

Nothing a version a reader may still hold references is deleted, for ``readerGrace`` after a
newer version replaced it (``grace.held_by_readers``).

Only files that carry no write id (an older version's compaction output, the metadata
pyiceberg's own commits write when a table is created) fall back to their age
(``older_than``). A metadata file of a version beyond the current one is kept whatever its
age: the lake's catalog (``catalog: {type: glue}``) writes each commit's metadata file itself,
named by the version it is about to become and carrying no write id, before it moves the
table's pointer to it. Files are listed BEFORE the metadata is read, so a file committed in
between is seen as referenced, and the metadata is read again AFTER the writes were
judged: a write that committed after the first read is "committed" in the database and
referenced in the second.

On an object store the same rules hold: the table's files are listed by its prefix (one
listing, whatever the depth), judged the same way, and deleted one object at a time; there
are no directories to remove.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyiceberg.avro.file import AvroFile

from reconciler import faults
from reconciler.table import grace, storage
from reconciler.table.catalog import Tables, local_path
from reconciler.table.reach import _norm, _referenced
from reconciler.table.reports import MaintenanceError, _camel
from reconciler.table.writeids import BATCH_DIR_PREFIX, write_id_of_data_path, write_id_of_name

log = logging.getLogger(__name__)

DEFAULT_ORPHAN_AGE = timedelta(days=1)
READ_ATTEMPTS = 10  # reads of the table's references while publishes move it


@dataclass
class OrphanResult:
    table: str
    dry_run: bool
    scanned_files: int = 0
    deleted_files: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: int = 0  # unreferenced, of no known write, younger than the cut-off
    kept_in_flight: int = 0  # unreferenced files of a write that may still commit
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self) | {"deletedFileCount": len(self.deleted_files)})


def remove_orphans(
    tables: Tables,
    name: str,
    *,
    store: Any = None,
    older_than: timedelta = DEFAULT_ORPHAN_AGE,
    now: datetime | None = None,
    dry_run: bool = False,
) -> OrphanResult:
    """Delete the files under table ``name``'s location that nothing references.

    Referenced: the current metadata file and every one in its metadata log, and for each
    of them every snapshot's manifest list, manifests and data files (deleted entries
    too). What is unreferenced is judged by its write's fence in ``store`` (the module's
    docstring). Without a store nothing that carries a write id is deleted."""
    now = now or datetime.now(UTC)
    cutoff = (now - older_than).timestamp()
    result = OrphanResult(table=name, dry_run=dry_run)
    if not dry_run:
        tables.retired.retire()  # the maintenance tick: what is due goes, even when nothing commits
    table = tables.load(name)
    if table is None:
        result.message = f"no table {name}"
        return result
    files = storage.at(table.location())
    root = _root(table.location())
    listed = files.list(root) if files.remote else _list_files(Path(root))
    result.scanned_files = len(listed)
    faults.point("orphans-listed", name)
    referenced, current = _referenced_now(tables, name)  # after the listing: whatever committed meanwhile is referenced
    # ... and whatever a version a reader may still be on references (grace.py)
    referenced |= grace.held_by_readers(table.io, listed, now.timestamp(), tables.retired.grace,
                                        table.metadata_location)
    candidates = {p: st for p, st in listed.items() if _norm(p) not in referenced}
    faults.point("orphans-judge", name)
    by_write: dict[str, list[str]] = defaultdict(list)
    for path in candidates:
        wid = _write_of(root, path)
        if wid is not None:
            by_write[wid].append(path)
    statuses = store.write_statuses(by_write) if store is not None and by_write else {}
    doomed = _finished_writes(store, by_write, root, statuses) if store is not None else set()
    doomed_lists = _stale_manifest_lists(tables, name, root, by_write, statuses)
    if doomed or doomed_lists:
        # A write judged committed may have committed after the read above, and so may a
        # ``committing`` one whose row outlived its catalog commit (a process killed before
        # forgetting it): its manifest list, unreferenced then, is current now. Read again,
        # after ``main`` was read for the stale lists: a commit landing later asserts that
        # ``main`` as its parent, so none of the lists judged stale can be it.
        referenced, current = _referenced_now(tables, name)
        candidates = {p: st for p, st in candidates.items() if _norm(p) not in referenced}
    newest = grace.version_of(current)
    for path, (mtime, size) in sorted(candidates.items()):
        wid = _write_of(root, path)
        if wid is not None:
            if wid not in doomed and path not in doomed_lists:
                result.kept_in_flight += 1
                continue
        elif _beyond(path, newest):
            result.kept_in_flight += 1
            continue
        elif mtime >= cutoff:
            result.kept_young += 1
            continue
        result.deleted_files.append(path)
        result.deleted_bytes += size
    if not dry_run:
        faults.point("orphans-delete", name)
        files.delete(result.deleted_files)
        if not files.remote:  # an object store has prefixes, not directories
            _remove_empty_dirs(Path(root), cutoff, doomed)
    verb = "would delete" if dry_run else "deleted"
    result.message = (f"{verb} {len(result.deleted_files)} orphan file(s) ({result.deleted_bytes} bytes); "
                      f"kept {result.kept_in_flight} of writes in flight and {result.kept_young} younger than "
                      "the cut-off")
    if result.deleted_files and not dry_run:
        log.info("maintenance of %s: %s", name, result.message)
    return result


def _beyond(path: str, newest: int | None) -> bool:
    """A metadata file of a version after ``newest`` (the current one): a commit in flight."""
    version = grace.version_of(path) if path.endswith(".metadata.json") else None
    return version is not None and newest is not None and version > newest


def _referenced_now(tables: Tables, name: str, attempts: int = READ_ATTEMPTS) -> tuple[set[str], str]:
    """What table ``name`` references, read from one version, and that version's metadata
    file. A publish that expires
    snapshots as it commits (``retention``) deletes their manifest lists right after:
    when one is gone while it is read, the table has moved on, and it is read again. A file
    missing from a version that is still the current one is an error (nothing deleted)."""
    for _ in range(attempts):
        table = tables.load(name)
        if table is None:
            raise MaintenanceError(f"table {name} vanished during the orphan scan; nothing deleted")
        try:
            return _referenced(table), table.metadata_location
        except FileNotFoundError as exc:
            now = tables.load(name)
            if now is not None and now.metadata_location == table.metadata_location:
                raise MaintenanceError(f"table {name}: a file its current metadata references is missing ({exc}); "
                                       "nothing deleted (run reconciler verify)") from exc
    raise MaintenanceError(f"table {name} kept moving during the orphan scan; nothing deleted")


def _root(location: str) -> str:
    """The table's location as its listing names files: an absolute path, or the URI."""
    if storage.is_object_store(location):
        return location.rstrip("/")
    return os.path.abspath(local_path(location))


def _relative(root: str, path: str) -> list[str] | None:
    """The parts of ``path`` below ``root``, or None when it is not below it."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):].split("/") if path.startswith(prefix) else None


def _finished_writes(store: Any, by_write: dict[str, list[str]], root: str, statuses: dict[str, str]) -> set[str]:
    """Of the writes whose unreferenced files were found, those whose files may go: done
    (committed) or discarded, unknown batch directories once fenced, and other unknown
    writes (committed: the module's docstring)."""
    if not by_write:
        return set()
    done = {w for w, s in statuses.items() if s in ("committed", "discarded")}
    unknown = [w for w in by_write if w not in statuses]
    legacy = [w for w in unknown if any(_is_batch_dir(root, p) for p in by_write[w])]
    return done | (set(unknown) - set(legacy)) | store.fence_unknown_writes(legacy)


def _stale_manifest_lists(tables: Tables, name: str, root: str, by_write: dict[str, list[str]],
                          statuses: dict[str, str]) -> set[str]:
    """Manifest lists of writes still ``committing`` in an external catalog whose commit can
    never land. Such a row outlives a process killed between recording it and the catalog's
    answer (a reset's fence, a compaction, an expiry: ``Store.commit_tables``), and keeps its
    files from the rule above forever. A staging asserts that ``main`` is still the snapshot
    it was built on, the parent its manifest list records; ``main`` only moves on to new
    random ids, so once it is elsewhere that staging cannot commit. Listed before ``main`` is
    read, so a staging built on a newer ``main`` is not among them. Only the manifest list is
    judged: a retry of a live write builds a new one and may reuse the write's other files."""
    if getattr(tables, "PROTOCOL", "sql") != "external":
        return set()  # the SQL catalog's commit is the database's: no row stays committing
    lists = [p for w, paths in by_write.items() if statuses.get(w) == "committing"
             for p in paths if _is_manifest_list(root, p)]
    table = tables.load(name) if lists else None
    main = table.metadata.refs.get("main") if table is not None else None
    if main is None:  # nothing committed since: any of them may still land
        return set()
    stale = set()
    for path in lists:
        try:
            with AvroFile(table.io.new_input(path)) as avro:
                parent = avro.header.meta.get("parent-snapshot-id")
        except Exception as exc:  # noqa: BLE001 - unreadable: kept, never guessed
            log.warning("orphan clean-up of %s: manifest list %s kept, its parent unreadable (%s)", name, path, exc)
            continue
        if parent is not None and parent != str(main.snapshot_id):
            stale.add(path)
    return stale


def _is_manifest_list(root: str, path: str) -> bool:
    rel = _relative(root, path) or []
    return len(rel) == 2 and rel[0] == "metadata" and rel[1].startswith("snap-") and rel[1].endswith(".avro")


def _is_batch_dir(root: str, path: str) -> bool:
    rel = _relative(root, path) or []
    return len(rel) > 1 and rel[0] == "data" and rel[1].startswith(BATCH_DIR_PREFIX)


def _write_of(root: str | Path, path: str) -> str | None:
    """The write a file under the table belongs to, from its path, else None."""
    rel = _relative(str(root), str(path))
    if not rel:
        return None
    if rel[0] == "data":
        return write_id_of_data_path("/".join(rel[1:]))
    if rel[0] == "metadata":
        return write_id_of_name(rel[-1])
    return None


def _list_files(root: Path) -> dict[str, tuple[float, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            out[os.path.abspath(p)] = (st.st_mtime, st.st_size)
    return out


def _remove_empty_dirs(root: Path, cutoff: float, finished: set[str]) -> None:
    """Remove empty directories of finished writes, and other empty ones older than the
    cut-off (a legacy writer may be about to put a file in a young one)."""
    keep = {root, root / "data", root / "metadata"}
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        d = Path(dirpath)
        if d in keep:
            continue
        try:
            if any(d.iterdir()):
                continue
            wid = _write_of(root, str(d / "x"))
            if (wid is not None and wid in finished) or (wid is None and d.stat().st_mtime < cutoff):
                d.rmdir()
        except OSError:
            pass
