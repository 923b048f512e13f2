"""Orphan clean-up: delete files under a table's location that no metadata file,
snapshot, manifest list or manifest references, never a file that a publish or a
compaction in flight may still reference."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.table.catalog import (
    BATCH_DIR_PREFIX,
    Tables,
    local_path,
)
from reconciler.table.reach import _norm, _referenced, _unlink
from reconciler.table.reports import MaintenanceError, _camel

log = logging.getLogger(__name__)

DEFAULT_ORPHAN_AGE = timedelta(days=1)


@dataclass
class OrphanResult:
    table: str
    dry_run: bool
    scanned_files: int = 0
    deleted_files: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: int = 0  # unreferenced, but too young to be sure (an in-flight publish)
    kept_committed_batch: int = 0  # unreferenced files in the directory of a committed batch
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self) | {"deletedFileCount": len(self.deleted_files)})


def remove_orphans(
    tables: Tables,
    name: str,
    *,
    older_than: timedelta = DEFAULT_ORPHAN_AGE,
    committed_batches: Callable[[Iterable[str]], set[str]] | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
) -> OrphanResult:
    """Delete the files under table ``name``'s location that nothing references.

    Referenced: the current metadata file and every one in its metadata log, and for each
    of them every snapshot's manifest list, manifests and data files (deleted entries
    too). Files are listed BEFORE the metadata is read, so a file committed in between is
    seen as referenced. Kept anyway: files modified within ``older_than`` (a batch being
    written or published), and everything under ``data/batch=<B>/`` when batch ``B`` is
    committed in the database (``committed_batches``: batch ids -> the committed ones,
    e.g. ``Store.committed_batch_ids``; without it every batch directory is kept)."""
    now = now or datetime.now(UTC)
    cutoff = (now - older_than).timestamp()
    result = OrphanResult(table=name, dry_run=dry_run)
    table = tables.load(name)
    if table is None:
        result.message = f"no table {name}"
        return result
    root = local_path(table.location())
    listed = _list_files(root)
    result.scanned_files = len(listed)
    table = tables.load(name)  # after the listing: whatever committed meanwhile is referenced
    if table is None:
        raise MaintenanceError(f"table {name} vanished during the orphan scan; nothing deleted")
    referenced = _referenced(table)
    candidates = {p: st for p, st in listed.items() if _norm(p) not in referenced}
    batches = {b for p in candidates if (b := _batch_of(root, p)) is not None}
    committed = set(batches) if committed_batches is None else set(committed_batches(sorted(batches)))
    for path, (mtime, size) in sorted(candidates.items()):
        if _batch_of(root, path) in committed:
            result.kept_committed_batch += 1
            continue
        if mtime >= cutoff:
            result.kept_young += 1
            continue
        result.deleted_files.append(path)
        result.deleted_bytes += size
    if not dry_run:
        for path in result.deleted_files:
            _unlink(Path(path))
        _remove_empty_dirs(root, cutoff, result.deleted_files)
    verb = "would delete" if dry_run else "deleted"
    result.message = (f"{verb} {len(result.deleted_files)} orphan file(s) ({result.deleted_bytes} bytes); "
                      f"kept {result.kept_young} younger than the cut-off")
    if result.deleted_files and not dry_run:
        log.info("maintenance of %s: %s", name, result.message)
    return result


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


def _batch_of(root: Path, path: str) -> str | None:
    """The batch id of a file under ``<root>/data/batch=<B>/``, else None."""
    try:
        rel = Path(path).relative_to(root / "data")
    except ValueError:
        return None
    top = rel.parts[0] if rel.parts else ""
    if top.startswith(BATCH_DIR_PREFIX):
        return top[len(BATCH_DIR_PREFIX):]
    if top.startswith(".") and top.endswith(".deleting"):  # a discard a crash interrupted
        return None
    return None


def _remove_empty_dirs(root: Path, cutoff: float, deleted: Iterable[str] = ()) -> None:
    """Remove empty directories older than the cut-off, and empty directories of a batch
    whose old files were just deleted (that touched them; a batch id is never written
    again). Other young ones may be about to receive a file (a batch, a compaction)."""
    emptied_batches = {_batch_of(root, p) for p in deleted} - {None}
    keep = {root, root / "data", root / "metadata"}
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        d = Path(dirpath)
        if d in keep:
            continue
        try:
            if any(d.iterdir()):
                continue
            if d.stat().st_mtime < cutoff or _batch_of(root, str(d / "x")) in emptied_batches:
                d.rmdir()
        except OSError:
            pass
