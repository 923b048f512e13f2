"""Adversarial review of the rolling compaction (issue 45; 51bee5d..e8f87fd), and its fixes.

The granularity defect comes from one window: ``compact()`` plans (the selector reads the table at
version V1), rewrites the selected files (seconds for a big merged file), then STAGES its
overwrite on whatever version is current then (``tables.stage`` without ``expected``), and
commits by compare-and-swap against THAT version. Of a change committed between the plan
and the staging, pyiceberg checks only that the files to delete still exist (the guard test
below holds); a changed partitioning is not checked: the CAS passes, and the overwrite
built for V1 lands on V2. The explorer's "rolling-loses-the-race" schedule puts the publish between staging
and commit (caught by the CAS); nothing puts it between plan and staging
(``compact-written``, the point right after the rewrite, is where these tests act).
The fix: a compaction stages only on the partition spec it planned under, else plans again.

The other defect: outputs sized by Arrow bytes were "small" by Parquet bytes, so an hour with
nothing new was rewritten whole at every run. The fix: outputs approach the target in Parquet
bytes, and a partition whose candidates are all one compaction's output is left alone.
"""

from __future__ import annotations

import collections
from datetime import timedelta

import pytest
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

from reconciler import faults
from reconciler.store.store import Store
from reconciler.table import compact as mc
from reconciler.table import rolling
from reconciler.table.catalog import Tables, _evolve_partitioning
from reconciler.table.writeids import new_write_id
from tests.table.test_maintenance import T0, _append_batch, _rows, _scan

# 20 minutes after the hour T0 ended: open for the daemon (compactLateness 1h), closed for
# an operator's `reconciler compact clicks --lateness 10m` at the same moment.
NOW = T0 + timedelta(hours=1, minutes=20)


@pytest.fixture
def env(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'reconciler.db'}")
    store.migrate()
    yield store, Tables(store.engine, tmp_path / "segments")
    store.close()
    faults.install(None)


def _batch(tables, b: int, per: int = 10):
    keys = range(b * per, (b + 1) * per)
    _append_batch(tables, "clicks", f"b{b:04d}", _rows(keys, lambda k: k % 60, lambda k: "u"),
                  [("0", b * per, (b + 1) * per)])


def _once_at_compact_written(action):
    """A hook running ``action`` the first time a compaction reaches ``compact-written``
    (its files rewritten, its overwrite not staged yet)."""
    fired = []

    def hook(name, subject):
        if name == "compact-written" and not fired:
            fired.append(name)
            action()

    faults.install(hook)
    return fired


@pytest.mark.parametrize("other", ["operator-compact", "second-rolling-run"])
def test_a_compaction_committed_between_plan_and_staging_keeps_every_key_once(env, other):
    """HOLDS (a guard, not a defect): the rolling run plans and rewrites the hour T0; before
    it stages, another compaction of the same files commits (an operator's ``reconciler
    compact --lateness 10m``, for which the hour is closed, or a second rolling run). The
    rolling run stages on the new version; pyiceberg's overwrite refuses to delete files
    that are gone ("Missing required files to delete", a ValidationException), so the run
    plans again and finds nothing: no row twice."""
    store, tables = env
    for b in range(6):
        _batch(tables, b)

    def concurrent():
        if other == "operator-compact":
            r = mc.compact(tables, "clicks", store=store, lateness=timedelta(minutes=10), now=NOW)
        else:
            r = rolling.compact_open(tables, "clicks", store=store, keep_recent=0, now=NOW)
        assert r.committed, r.message

    fired = _once_at_compact_written(concurrent)
    result = rolling.compact_open(tables, "clicks", store=store, keep_recent=0, now=NOW)
    faults.install(None)
    assert fired and not result.committed and result.attempts == 2, result
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert len(ids) == 60 and set(ids.values()) == {1}


def _closed_for_operator(tables, store, **kw):
    """The hourly (closed-partition) compaction, for which the hour T0 is closed at NOW."""
    return mc.compact(tables, "clicks", store=store, lateness=timedelta(minutes=10), now=NOW, **kw)


def _rolling(tables, store, **kw):
    return rolling.compact_open(tables, "clicks", store=store, now=NOW, **kw)


RUNS = {"rolling": lambda t, s, **kw: _rolling(t, s, keep_recent=0, **kw), "hourly": _closed_for_operator}


def _hour_t0(tables) -> int:
    hour = And(GreaterThanOrEqual("__time", T0.isoformat()), LessThan("__time", (T0 + timedelta(hours=1)).isoformat()))
    return tables.load("clicks").scan(row_filter=hour).to_arrow().num_rows


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_granularity_change_published_between_plan_and_staging_makes_the_run_plan_again(env, run):
    """Schedule: the run plans the hour T0 under the hourly spec (spec 0) and rewrites its 6
    files into one. A publish from a spec whose segment granularity became ``day`` commits
    meanwhile (``catalog._evolve_partitioning``). Staged on that version, pyiceberg filed the
    merged file under the day spec with the hour ordinal as its day value, and a scan of the
    hour T0 pruned it (10 of 70 rows). Now the run sees the partitioning changed, plans again
    (the hour's files are an older partitioning's: left alone) and commits nothing; what it
    wrote is deleted."""
    store, tables = env
    for b in range(6):
        _batch(tables, b)

    def granularity_change_publish():
        tx = tables.load("clicks").transaction()
        _evolve_partitioning(tx, "day")
        tx.commit_transaction()
        _batch(tables, 6)  # the publish's files, day-partitioned

    fired = _once_at_compact_written(granularity_change_publish)
    result = RUNS[run](tables, store)
    faults.install(None)
    assert fired and not result.committed and result.attempts == 2, result
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert len(ids) == 70 and set(ids.values()) == {1}
    assert _hour_t0(tables) == 70
    assert not list((tables.warehouse / "clicks" / "data" / "compacted").rglob("*.parquet"))


def test_merged_files_are_written_with_their_input_files_spec(env):
    """Files of an older partitioning, rewritten: the outputs carry the inputs' spec id,
    partition value and partition path (pyiceberg writes by the metadata's default spec)."""
    store, tables = env
    for b in range(3):
        _batch(tables, b)
    hourly = tables.load("clicks").metadata.default_spec_id
    tx = tables.load("clicks").transaction()
    _evolve_partitioning(tx, "day")
    tx.commit_transaction()
    table = tables.load("clicks")
    tasks = list(table.scan().plan_files())
    assert {t.file.spec_id for t in tasks} == {hourly} and table.metadata.default_spec_id != hourly
    group = mc.Group((hourly, tuple(tasks[0].file.partition)), T0, T0 + timedelta(hours=1), tasks)
    [out] = mc._rewrite(table, group, None, mc.DEFAULT_TARGET_FILE_SIZE, new_write_id())
    assert "__time_hour=" in out.file_path
    assert out.spec_id == hourly and out.partition == tasks[0].file.partition and out.record_count == 30


def _parquet_total(tables) -> int:
    return sum(t.file.file_size_in_bytes for t in tables.load("clicks").scan().plan_files())


def test_a_full_hour_with_nothing_new_is_not_rewritten(env):
    """The hour T0 holds about three targets of rows; it has ended but is still open
    (compactLateness 1h), nothing more arrives in it, and the stream goes on committing into
    the next hour. The outputs were packed by ARROW bytes and so were "small" (PARQUET bytes
    under half the target) again: every later run rewrote the whole hour unchanged. Now the
    outputs approach the target in Parquet bytes, and no later run touches the hour."""
    store, tables = env
    for b in range(8):
        _batch(tables, b, per=500)
    target = _parquet_total(tables) // 3
    first = _rolling(tables, store, target_file_size=target, keep_recent=0)
    assert first.committed and first.files_after >= 2, first
    sizes = sorted(t.file.file_size_in_bytes for t in tables.load("clicks").scan().plan_files()
                   if "/data/compacted/" in t.file.file_path)
    assert len(sizes) == first.files_after and all(s >= target // 2 for s in sizes[1:]), (target, sizes)  # the last of the pack may be short
    rewritten = []
    for run in range(3):
        for c in range(rolling.DEFAULT_KEEP_RECENT):  # the stream goes on, in the next hour
            k = 100_000 + run * 10 + c
            _append_batch(tables, "clicks", f"n{k}", _rows([k], lambda k: 61, lambda k: "u"), [("0", k, k + 1)])
        r = _rolling(tables, store, target_file_size=target)
        rewritten += [p.rows_before for p in r.partitions if r.committed and p.start == T0]
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert set(ids.values()) == {1}
    assert not rewritten, f"the unchanged hour T0 was rewritten by {len(rewritten)} of 3 runs: {rewritten} rows"


@pytest.mark.parametrize("run", sorted(RUNS))
def test_one_compactions_outputs_are_merged_again_only_with_something_new(env, run):
    """The outputs of one compaction, all small under a larger target (a target raised, or
    the files of a quiet hour): nothing new joined them, so nothing is rewritten (it would
    write the same rows again at every run); a late batch into the hour merges them all."""
    store, tables = env
    for b in range(8):
        _batch(tables, b, per=500)
    first = RUNS[run](tables, store, target_file_size=_parquet_total(tables) // 3)
    assert first.committed and first.files_after >= 2, first
    before = len(tables.load("clicks").snapshots())
    again = RUNS[run](tables, store, target_file_size=1 << 30)
    assert not again.committed and not again.partitions, again
    assert len(tables.load("clicks").snapshots()) == before  # no empty commit
    _batch(tables, 8, per=500)  # late rows of the hour T0
    late = RUNS[run](tables, store, target_file_size=1 << 30)
    assert late.committed and late.files_before == first.files_after + 1 and late.files_after == 1, late
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert len(ids) == 4500 and set(ids.values()) == {1}
