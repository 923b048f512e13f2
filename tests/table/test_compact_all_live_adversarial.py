"""Adversarial schedules for commit 24ab438 (the kept plan while ``ancestry.all_live``).

Held: another compaction taking the inputs between the check (or plan) and the staging
(pyiceberg's "Missing required files to delete" stops the overwrite: it plans again);
``main`` rolled back to the planned snapshot after another compaction merged the inputs.

Broken before the mends of this review (rows deleted by a position-delete file, as
Athena/Spark DELETE writes on a Glue table, came back): the replan after ``all_live`` refused reuses the merge written before
the delete (``written`` keyed by input paths only); a delete landing between the plan and
the staging (``tables.stage`` without ``expected=``, pyiceberg checks data files only);
the rolling selection's tasks carry no delete files at all.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestWriterV2,
)
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles

from reconciler.table import catalog as cat
from reconciler.table.ancestry import all_live
from reconciler.table.compact import compact
from reconciler.table.expire import expire_snapshots
from reconciler.table.rolling import compact_open
from reconciler.table.verify import missing_files
from tests.table import test_write_races as races
from tests.table.test_compact_keeps_plan import _md_io, _publish
from tests.table.test_compact_keeps_plan_adversarial import _run
from tests.table.test_write_races import FAR, T0

env = races.env


def _ids(store, tables) -> Counter:
    table = cat.Tables(store.engine, tables.warehouse).load("clicks")
    assert missing_files(table) == []
    return Counter(table.scan().to_arrow().column("id").to_pylist())


def _other_compaction(store, tables):
    done = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store, lateness=timedelta(0),
                   now=FAR, target_file_size=1 << 30)
    assert done.committed, done.message
    return done


def _hook(actions):
    """``actions``: {(point, n-th time that point is reached): callable}; re-entrant calls
    (the other compaction reaching the same points) are ignored."""
    seen: Counter = Counter()
    busy = {"on": False}

    def hook(point, subject):
        if busy["on"]:
            return None
        seen[point] += 1
        act = actions.get((point, seen[point]))
        if act is not None:
            busy["on"] = True
            try:
                act()
            finally:
                busy["on"] = False
        return None

    return hook, seen


def test_held_fresh_plan_staged_after_another_compaction_took_its_files(env):
    """No kept plan at all: the plan's own staging. Another compaction merges the same
    three files while this one writes its merge; this one's overwrite, staged on the new
    table, deletes nothing and adds its merge: every row twice."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, _ = _hook({("compact-written", 1): lambda: _other_compaction(store, tables)})
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    ids = _ids(store, tables)
    doubled = sorted(k for k, v in ids.items() if v != 1)
    assert not doubled, f"rows doubled ({len(doubled)} of {len(ids)}), compaction said: {result.message}"
    assert len(ids) == 30


def test_held_kept_by_all_live_then_another_compaction_before_the_staging(env):
    """The kept plan's path: the first commit loses to two batches and an expiry that breaks
    the chain (so ``all_live`` keeps the plan). At the second attempt ``all_live`` is true on
    the table read at the top of the loop; another compaction then merges the same inputs
    (with the two batches) before the staging; the kept overwrite is staged on that table."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def batches_then_expiry():
        for lo in (30, 40):
            _publish(store, tables, lo, lo + 10)
        no_grace = cat.Tables(store.engine, tables.warehouse, reader_grace=0)
        done = expire_snapshots(no_grace, "clicks", store=store, older_than=timedelta(0),
                                now=datetime.now(UTC) + timedelta(seconds=1), retain_last=1)
        assert done.committed, done.message

    hook, seen = _hook({("compact-commit", 1): batches_then_expiry,
                        ("compact-written", 2): lambda: _other_compaction(store, tables)})
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert seen["compact-written"] >= 2, result.message
    ids = _ids(store, tables)
    doubled = sorted(k for k, v in ids.items() if v != 1)
    assert not doubled, f"rows doubled ({len(doubled)} of {len(ids)}), compaction said: {result.message}"
    assert len(ids) == 50


def test_rollback_to_a_snapshot_where_the_inputs_are_live_again(env):
    """Held: another compaction merges the inputs, then ``main`` is rolled back (an operator
    with pyiceberg) to the snapshot the plan was made on: the inputs are live again and the
    other compaction's merge is not; keeping the plan is right."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    planned = tables.current("clicks").metadata.current_snapshot_id

    def other_then_rollback():
        _other_compaction(store, tables)
        fresh = cat.Tables(store.engine, tables.warehouse)
        t = fresh.load("clicks")
        t.manage_snapshots().rollback_to_snapshot(planned).commit()

    hook, _ = _hook({("compact-commit", 1): other_then_rollback})
    try:
        result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                            target_file_size=1 << 30))
    except Exception as exc:  # noqa: BLE001 - the rollback itself may be refused by the catalog
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
    ids = _ids(store, tables)
    assert set(ids.values()) == {1} and len(ids) == 30, result.message
    assert result.committed, result.message


def test_all_live_is_not_fooled_by_a_file_merged_away(env):
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    files = [t.file.file_path for t in tables.current("clicks").scan().plan_files()]
    _other_compaction(store, tables)
    assert not all_live(*_md_io(tables), files)


# -- positional deletes (an external engine's row-level DELETE, e.g. Athena or Spark on the
# Glue catalog's table; here another pyiceberg client committing to the same catalog) ------


def _delete_rows(tables, ids: set[str]) -> None:
    """Commit one ``delete`` snapshot adding a position-delete file that removes the rows
    ``ids`` from the live data files holding them (merge-on-read, as Spark/Athena do)."""
    fresh = cat.Tables(tables._engine, tables.warehouse)
    table = fresh.load("clicks")
    assert table.metadata.format_version >= 2
    paths, positions, target = [], [], None
    for task in table.scan().plan_files():
        local = task.file.file_path.removeprefix("file://")
        col = pq.read_table(local, columns=["id"]).column("id").to_pylist()
        hit = [i for i, v in enumerate(col) if v in ids]
        if hit:
            paths += [task.file.file_path] * len(hit)
            positions += hit
            target = task.file
    assert target is not None
    out = f"{table.location().rstrip('/')}/data/external-deletes/pos-{len(positions)}-{abs(hash(tuple(ids)))}.parquet"
    local = out.removeprefix("file://")
    import os
    os.makedirs(os.path.dirname(local), exist_ok=True)
    pq.write_table(pa.table({"file_path": pa.array(paths, pa.string()), "pos": pa.array(positions, pa.int64())}),
                   local)
    delete = DataFile.from_args(content=DataFileContent.POSITION_DELETES, file_path=out,
                                file_format=FileFormat.PARQUET, partition=target.partition,
                                record_count=len(positions), file_size_in_bytes=os.path.getsize(local))
    delete.spec_id = target.spec_id
    with table.transaction() as tx:
        producer = _DeleteFiles(operation=Operation.DELETE, transaction=tx, io=table.io)
        with producer as p:
            p.append_data_file(delete)
    check = cat.Tables(tables._engine, tables.warehouse).load("clicks").scan().to_arrow().column("id").to_pylist()
    assert not (set(check) & ids), "the delete file does not apply"


class _DeletesManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _DeleteFiles(_FastAppendFiles):
    """A snapshot adding delete files in a DELETES manifest (as Spark's RowDelta writes it)."""

    def new_manifest_writer(self, spec):
        return _DeletesManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                      self._compression)


DELETED = {f"k{i}" for i in range(5)}


def _assert_deleted_stay_deleted(store, tables, total):
    ids = _ids(store, tables)
    back = sorted(set(ids) & DELETED)
    assert not back, f"deleted rows resurrected: {back}"
    assert set(ids.values()) == {1} and len(ids) == total - len(DELETED)


def test_replanned_after_a_row_delete_reuses_the_merge_written_before_it(env):
    """``all_live`` says no (a delete file applies to an input: "a merge of it would bring
    the deleted rows back"), the run plans again, finds the same group (same files) and
    reuses the merged file written BEFORE the delete (``written`` is keyed by the input
    paths only): the deleted rows come back."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, _ = _hook({("compact-commit", 1): lambda: _delete_rows(tables, DELETED)})
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.committed, result.message
    _assert_deleted_stay_deleted(store, tables, 30)


def test_row_delete_between_the_plan_and_the_staging(env):
    """The delete lands after the merge was written, before the staging: the staging re-reads
    the table (no ``expected=``), pyiceberg's check finds every input still present (it
    looks at data files only), the overwrite drops the inputs and adds the merge holding
    the deleted rows; the delete file is left pointing at a removed file."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, _ = _hook({("compact-written", 1): lambda: _delete_rows(tables, DELETED)})
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    _assert_deleted_stay_deleted(store, tables, 30)
    assert result.committed or result.message


def test_rolling_compaction_of_files_with_a_row_delete(env):
    """``rolling.select_open`` made its tasks as ``FileScanTask(f)``: no delete files, so
    the merge read the deleted rows too (no race needed). Now a table with delete files is
    left to the closed-partition rule, whose scan applies them."""
    store, tables = env
    for lo in range(0, 60, 10):
        _publish(store, tables, lo, lo + 10)
    _delete_rows(tables, DELETED)
    result = compact_open(tables, "clicks", store=store, lateness=timedelta(0), keep_recent=0,
                          now=T0 + timedelta(minutes=30), target_file_size=1 << 30)
    assert not result.committed and result.message == "nothing to compact", result.message
    _assert_deleted_stay_deleted(store, tables, 60)


def test_closed_compaction_of_files_with_a_row_delete_no_race(env):
    """Held (control): a delete file present at the plan is applied by the merge."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    _delete_rows(tables, DELETED)
    result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    assert result.committed, result.message
    _assert_deleted_stay_deleted(store, tables, 30)
