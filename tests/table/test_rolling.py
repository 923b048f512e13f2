"""Rolling compaction of the open time partitions (issue 45): which files a run selects,
that it commits like the closed-partition compaction (concurrently with publishes, offsets
untouched, rollup applied), and that the open hour's live files and manifest entries stay
bounded over many small commits. Real pyiceberg SQL catalogs on SQLite and PostgreSQL."""

from __future__ import annotations

import collections
import threading
from datetime import timedelta

import pytest

from reconciler.store.store import Store
from reconciler.table import compact as mc
from reconciler.table import rolling
from reconciler.table.catalog import RANGES, SUPERVISOR, Tables, summary_ranges
from tests.benchmarks.load import benchmark
from tests.table.test_maintenance import T0, _append_batch, _files, _rows, _scan

OPEN_NOW = T0 + timedelta(minutes=30)  # the hour T0 is still being written


@pytest.fixture
def env(db_url, tmp_path):
    store = Store(db_url)
    store.migrate()
    yield store, Tables(store.engine, tmp_path / "segments")
    store.close()


def _batch(tables, b: int, per: int = 10, minute=lambda k: 0, user=lambda k: "u", name="clicks"):
    keys = range(b * per, (b + 1) * per)
    _append_batch(tables, name, f"b{b:04d}", _rows(keys, minute, user), [("0", b * per, (b + 1) * per)])


def test_the_last_commits_files_are_left_and_the_older_merged(env):
    store, tables = env
    for b in range(6):
        _batch(tables, b)
    table = tables.load("clicks")
    sel = rolling.OpenSelector(lateness=timedelta(hours=1), keep_recent=2)
    [group] = sel(table, None, mc.DEFAULT_TARGET_FILE_SIZE, OPEN_NOW)
    newest_two = {t.file.file_path for t in table.scan().plan_files()} - {t.file.file_path for t in group.tasks}
    assert len(group.tasks) == 4 and len(newest_two) == 2
    assert all("b0004" in p or "b0005" in p for p in newest_two), newest_two
    result = rolling.compact_open(tables, "clicks", store=store, keep_recent=2, now=OPEN_NOW)
    assert result.committed and result.files_before == 4 and result.files_after == 1
    assert len(_files(tables, "clicks")) == 3
    props = tables.load("clicks").current_snapshot().summary.additional_properties
    assert props[mc.OPERATION] == "compact" and props[mc.ROLLING] == "true"
    assert RANGES not in props and SUPERVISOR not in props
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert len(ids) == 60 and set(ids.values()) == {1}


@pytest.mark.parametrize("case", ["closed", "too-few", "large", "nothing-new"])
def test_what_a_run_leaves_alone(env, case):
    store, tables = env
    n = 2 if case == "too-few" else 5
    for b in range(n):
        _batch(tables, b)
    now, keep, target = OPEN_NOW, 1, mc.DEFAULT_TARGET_FILE_SIZE
    if case == "closed":  # the hour closed: the hourly compaction's, not this one's
        now = T0 + timedelta(hours=2, minutes=1)
    if case == "large":  # every file at least half the target: nothing small to merge
        target = 2 * min(f.file_size_in_bytes for f in _files(tables, "clicks"))
    if case == "nothing-new":
        assert rolling.compact_open(tables, "clicks", store=store, keep_recent=keep, now=now).committed
    before = len(tables.load("clicks").snapshots())
    result = rolling.compact_open(tables, "clicks", store=store, keep_recent=keep, now=now, target_file_size=target)
    assert not result.committed and not result.partitions, result
    assert len(tables.load("clicks").snapshots()) == before  # no empty commit


def test_a_lost_race_plans_again_with_the_same_cutoff(env):
    """A publish lands between the plan and the commit: the run plans again, selects the
    same files (the newer commit's are above its cutoff) and commits on the new table."""
    store, tables = env
    for b in range(5):
        _batch(tables, b)
    sel = rolling.OpenSelector(lateness=timedelta(hours=1), keep_recent=1)
    first = {t.file.file_path for g in sel(tables.load("clicks"), None, 1 << 30, OPEN_NOW) for t in g.tasks}
    _batch(tables, 5)
    _batch(tables, 6)
    again = {t.file.file_path for g in sel(tables.load("clicks"), None, 1 << 30, OPEN_NOW) for t in g.tasks}
    assert first == again and len(first) == 4


def test_rolling_concurrent_with_publishes_keeps_every_key_once(env):
    """Publishes keep committing into the open hour while rolling compactions run in a loop:
    every key once, the offsets tile, compaction snapshots carry none, files merged."""
    store, tables = env
    done = threading.Event()
    results = []

    def loop():
        while not done.is_set():
            results.append(rolling.compact_open(tables, "clicks", store=store, keep_recent=2, now=OPEN_NOW,
                                                attempts=50))

    _batch(tables, 0)
    worker = threading.Thread(target=loop)
    worker.start()
    try:
        for b in range(1, 40):
            _batch(tables, b, minute=lambda k: k % 50)
    finally:
        done.set()
        worker.join()
    results.append(rolling.compact_open(tables, "clicks", store=store, keep_recent=2, now=OPEN_NOW))
    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert len(ids) == 400 and set(ids.values()) == {1}
    assert any(r.committed for r in results), [r.message for r in results]
    assert all(r.committed or not r.partitions for r in results), [r.message for r in results]
    assert len(_files(tables, "clicks")) <= 3
    ops = [s.summary.additional_properties for s in tables.load("clicks").snapshots()]
    assert all(RANGES not in p for p in ops if p.get(mc.ROLLING) == "true")
    spans = sorted(r for p in ops for r in summary_ranges(p))
    assert spans == [("0", b * 10, (b + 1) * 10) for b in range(40)]


def test_rollup_tables_are_rolled_up_in_the_open_hour(env):
    store, tables = env
    tables.ensure("rolled", _rows([0], lambda k: 0, lambda k: "u").schema, "hour", rollup=True)
    for b in range(4):  # every batch the same (minute, user) keys: one row each after rollup
        _batch(tables, b, per=6, minute=lambda k: k % 3, user=lambda k: f"u{k % 2}", name="rolled")
    with tables.load("rolled").update_schema() as upd:
        upd.delete_column("id")  # a key on every row: nothing would roll up (test_maintenance's rollup test)
    rollup = mc.Rollup(("user",), (("count", "count"), ("bytes", "longSum"), ("low", "longMin")))
    result = rolling.compact_open(tables, "rolled", store=store, rollup=rollup, keep_recent=0, now=OPEN_NOW)
    assert result.committed and result.files_after == 1
    rows = _scan(tables, "rolled")
    assert rows.num_rows == 3 * 2 and sum(rows.column("count").to_pylist()) == 24


def test_the_open_hour_stays_flat_over_many_small_commits(db_url, tmp_path, request):
    """240 one-record commits (600 with --soak) into one open hour, a rolling compaction every
    20: the live files and the manifest entries of the last 100 commits are no more than
    those after the first 100 (without it they grow by one a commit), and ``verify`` passes."""
    commits = 600 if request.config.getoption("--soak") else 240  # 240: 40 commits between the two 100s
    doc = benchmark("commit_growth").run(db_url, tmp_path, commits=commits, window=1, records=1, kept=25,
                                         compact_every=0, reader_grace=0, rolling_every=20)
    windows = doc["windows"]
    assert doc["rolling"]["runs"] == commits // 20
    assert max(w["liveDataFiles"] for w in windows[100:]) <= 20 + rolling.DEFAULT_KEEP_RECENT + 2
    early = max(w["manifestEntries"] for w in windows[50:100])
    assert max(w["manifestEntries"] for w in windows[-100:]) <= early + 5, (early, windows[-1])
    assert doc["verifyOk"], doc


def test_the_leaders_compactor_rolls_by_interval_and_sooner_by_file_count(env):
    """``rollingCompaction`` seconds after the last run, or at the next look once
    ``TRIGGER_FILES`` files arrived: the compactor merges the open hour, and not between."""
    from datetime import UTC, datetime

    from reconciler.model import SupervisorSpec
    from reconciler.runtime.compactor import ROLLING_CHECK, Compactor
    from reconciler.runtime.supervisor import RuntimeContext
    from tests.e2e import helpers as h

    store, tables = env
    store.create_supervisor(SupervisorSpec.from_document(h.spec_doc("clicks", h.kafka_source("127.0.0.1:1", "t"))),
                            None, actor="test")
    this_minute = int((datetime.now(UTC) - T0).total_seconds() // 60)  # the open hour, whenever the test runs
    for b in range(6):
        _batch(tables, b, minute=lambda k: this_minute)
    ctx = RuntimeContext(store=store, segments_dir=tables.warehouse, spark=lambda: None)
    now = [1000.0]
    compactor = Compactor(ctx, every=0.0, rolling_every=60.0, first_delay=5.0, clock=lambda: now[0])

    def run(at: float) -> bool:
        now[0] = at
        started = compactor.maybe_run()
        if started:
            compactor._thread.join(60)
            assert compactor.last_error is None, compactor.last_error
        return started

    assert not run(1004.0)
    assert run(1005.0) and len(_files(tables, "clicks")) == 1 + rolling.DEFAULT_KEEP_RECENT  # due: merged
    assert compactor.rolling_runs == 1 and compactor.rolling_cpu > 0
    for b in range(6, 6 + rolling.TRIGGER_FILES - 1):
        _batch(tables, b, minute=lambda k: this_minute)
    assert run(1005.0 + ROLLING_CHECK)  # a look: too few new files, nothing merged
    assert compactor.rolling_runs == 1
    _batch(tables, 100, minute=lambda k: this_minute)
    assert run(1005.0 + 2 * ROLLING_CHECK)  # the next look finds TRIGGER_FILES new files
    assert compactor.rolling_runs == 2 and len(_files(tables, "clicks")) == 1 + rolling.DEFAULT_KEEP_RECENT
    compactor.configure(every=0.0, lateness=3600.0, maintain_every=0.0, snapshot_retention=3600.0, rolling_every=0.0)
    assert not run(1005.0 + 3600)  # off (SIGHUP): never again
    compactor.stop()


def test_a_datasource_whose_compaction_fails_leaves_the_others_and_maintenance_to_run(env):
    """The first datasource's hourly and rolling compactions raise (a disk error, here at the
    point after the rewrite): each is logged and counted, and in the same run the next
    datasource's closed and open hours are compacted and the maintenance due runs. Before,
    the first error ended the run: every datasource after it and the maintenance waited for
    the next run, where the same datasource failed first again."""
    from datetime import UTC, datetime

    from reconciler import faults
    from reconciler.model import SupervisorSpec
    from reconciler.runtime.compactor import Compactor
    from reconciler.runtime.supervisor import RuntimeContext
    from tests.e2e import helpers as h

    store, tables = env
    this_minute = int((datetime.now(UTC) - T0).total_seconds() // 60)  # the open hour, whenever the test runs
    for name in ("aaa", "clicks"):  # sorted: the failing one first
        store.create_supervisor(SupervisorSpec.from_document(h.spec_doc(name, h.kafka_source("127.0.0.1:1", "t"))),
                                None, actor="test")
        for b in range(3):
            _batch(tables, b, name=name)  # the closed hour T0
        for b in range(3, 9):
            _batch(tables, b, minute=lambda k: this_minute, name=name)

    def disk_error(point, subject):
        if point == "compact-written" and subject == "aaa":
            raise OSError(28, "No space left on device")

    ctx = RuntimeContext(store=store, segments_dir=tables.warehouse, spark=lambda: None)
    now = [1000.0]
    compactor = Compactor(ctx, every=60.0, rolling_every=60.0, maintain_every=60.0, first_delay=5.0,
                          clock=lambda: now[0])
    faults.install(disk_error)
    try:
        now[0] = 1060.0
        assert compactor.maybe_run()
        compactor._thread.join(60)
    finally:
        faults.install(None)
        compactor.stop()
    assert compactor.failures == 2
    assert "compaction of aaa: OSError" in compactor.last_error
    assert "rolling compaction of aaa: OSError" in compactor.last_error
    assert [(r.table, r.committed) for r in compactor.last_results] == [("clicks", True)]
    assert len(_files(tables, "aaa")) == 9  # untouched, and what its runs wrote is gone
    assert not list((tables.warehouse / "aaa" / "data" / "compacted").rglob("*.parquet"))
    ops = [s.summary.additional_properties for s in tables.load("clicks").snapshots()]
    assert [p.get(mc.ROLLING) for p in ops if p.get(mc.OPERATION) == "compact"] == [None, "true"]
    assert len(_files(tables, "clicks")) < 3 + 6  # T0 merged into one, then the open hour rolled
    assert {r.table for r in compactor.last_maintenance} >= {"aaa", "clicks"}
