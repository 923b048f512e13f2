"""Start-up recovery of the segment files, run by the leader before any runtime starts.

A crash can leave a batch in three places: staged but never committed (an orphan:
deleted), committed but not moved into place (rolled forward from its manifest),
or done. Nothing else is possible, because files become visible only after commit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from reconciler.store.store import Store

log = logging.getLogger(__name__)


def recover(store: Store, segments_dir: Path) -> dict[str, int]:
    from reconciler.pipeline import segments

    rolled = 0
    for batch_id in store.unpromoted_batches():
        staged = segments.load_manifest(str(segments_dir), batch_id)
        if staged is not None:
            segments.promote(staged)
        else:
            log.warning("batch %s is committed but its staging manifest is gone; assuming it was moved", batch_id)
        store.mark_promoted(batch_id)
        rolled += 1
    staged_ids = segments.staging_batch_ids(str(segments_dir))
    committed = store.committed_batch_ids(staged_ids)
    orphans = [b for b in staged_ids if b not in committed]
    for batch_id in orphans:
        segments.discard(str(segments_dir), batch_id)
    for batch_id in committed:  # moved, but the crash came before the staging dir was removed
        staged = segments.load_manifest(str(segments_dir), batch_id)
        if staged is not None:
            segments.promote(staged)
        else:
            segments.discard(str(segments_dir), batch_id)
    if rolled or orphans:
        log.info("recovery: %d committed batch(es) rolled forward, %d orphan staging dir(s) deleted", rolled, len(orphans))
    return {"rolledForward": rolled, "orphansDeleted": len(orphans)}
