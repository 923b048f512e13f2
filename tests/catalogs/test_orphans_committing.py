"""Orphan clean-up and a maintenance write left ``committing`` on an external catalog (issue
44, explorer seed 1013): a reset's fence, a compaction or an expiry is recorded as committing
before its catalog commit, and a process killed in between leaves the row so for ever. Its
manifest list is deleted once ``main`` moved past the parent it was built on (its commit
asserts that parent, and can never land), and kept while ``main`` is still there (the commit
may be on its way). Moto's Glue and S3, the real store and publish (test_maintain_external)."""

from __future__ import annotations

from datetime import timedelta

from reconciler import faults
from reconciler.table import storage
from reconciler.table.catalogs import fence
from reconciler.table.orphans import remove_orphans
from reconciler.table.writeids import new_write_id
from tests.catalogs import test_maintain_external as maintained
from tests.catalogs.test_maintain_external import _context, _ids, _step

store = maintained.store  # the same fixture: a store with supervisor clicks at offset 0


class Killed(Exception):
    """The reset's process dies at its fence's catalog commit."""


def _lists_of(files, location: str, write_id: str) -> list[str]:
    from reconciler.table.writeids import write_id_of_name

    return [p for p in files.list(files.join(location, "metadata"))
            if p.rsplit("/", 1)[-1].startswith("snap-") and write_id_of_name(p.rsplit("/", 1)[-1]) == write_id]


def test_a_fence_killed_before_its_catalog_commit_leaves_no_manifest_list_once_main_moved(glue, store):
    ctx, tables = _context(glue, store)
    _step(ctx, store, tables)
    files, location = storage.at(tables.location("clicks")), tables.location("clicks")
    dead = new_write_id()
    seen: list[list[str]] = []

    def hook(point, subject):
        if point == "external-commit":
            # the fence's manifest list is written, the catalog not asked yet: while main is
            # still its parent the commit may land, so clean-up keeps it
            seen.append(remove_orphans(tables, "clicks", store=store, older_than=timedelta(0)).deleted_files)
            raise Killed()

    faults.install(hook)
    try:
        try:
            fence.fence(tables, store, "clicks", "clicks", 2, dead)
        except Killed:
            pass
    finally:
        faults.install(None)
    stale = _lists_of(files, location, dead)
    assert len(stale) == 1 and seen == [[]], (stale, seen)
    assert store.write_statuses([dead]) == {dead: "committing"}

    kept = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    assert stale[0] not in kept.deleted_files  # main has not moved: the commit could still come

    _step(ctx, store, tables)  # main moves on: the killed fence's commit can never land
    result = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    assert result.deleted_files == stale
    assert _lists_of(files, location, dead) == []
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(10))  # every file the table references is there


def test_a_fence_committing_on_the_current_main_keeps_its_manifest_list_and_lands(glue, store):
    ctx, tables = _context(glue, store)
    _step(ctx, store, tables)
    cleaned = []

    def hook(point, subject):
        if point == "external-commit":
            cleaned.append(remove_orphans(tables, "clicks", store=store, older_than=timedelta(0)))

    faults.install(hook)
    try:
        fence.fence(tables, store, "clicks", "clicks", 1, new_write_id())
    finally:
        faults.install(None)
    assert cleaned and not [p for p in cleaned[0].deleted_files if "/snap-" in p], cleaned[0].deleted_files
    _step(ctx, store, tables)  # reads the whole table, the fence's snapshot with it
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(10))
