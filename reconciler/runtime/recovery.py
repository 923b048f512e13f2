"""Start-up clean-up of batch files, run by the leader before any runtime starts.

A batch's data files are written under ``<table>/data/batch=<B>/`` and referenced by
the table only once its publish committed. A crash can therefore leave files of a
batch that never committed: invisible to readers, but taking space. They are deleted
here (the database's ``batches`` table says which batches committed); files of
committed batches are never touched.
"""

from __future__ import annotations

import logging
from pathlib import Path

from reconciler.store.store import Store

log = logging.getLogger(__name__)


def recover(store: Store, segments_dir: Path) -> dict[str, int]:
    from reconciler.pipeline import segments
    from reconciler.table.catalog import NAMESPACE

    root = Path(segments_dir) / NAMESPACE
    found: dict[str, Path] = {}
    try:
        for table_dir in (root.iterdir() if root.is_dir() else ()):
            if table_dir.is_dir():
                found.update({f"{table_dir.name}/{b}": p for b, p in segments.batch_dirs(table_dir).items()})
    except OSError as exc:  # files nobody reads: a clean-up that fails must not stop leading
        log.warning("recovery: cannot list batch directories under %s (%s); left for the next start", root, exc)
        return {"orphansDeleted": 0}
    committed = store.committed_batch_ids({key.split("/", 1)[1] for key in found})
    orphans = [p for key, p in sorted(found.items()) if key.split("/", 1)[1] not in committed]
    deleted = 0
    for path in orphans:
        try:
            segments.discard(path)
            deleted += 1
        except OSError as exc:
            log.warning("recovery: cannot delete uncommitted batch directory %s (%s); it stays invisible", path, exc)
    if deleted:
        log.info("recovery: %d uncommitted batch director%s deleted", deleted, "y" if deleted == 1 else "ies")
    return {"orphansDeleted": deleted}
