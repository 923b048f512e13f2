"""Issue 34's continuous expiry under review: each publish expires the snapshots beyond the
newest ``snapshotsKept`` in its own staged metadata and deletes, after the commit, what only
they needed. Each test pins one schedule against the real ``Store`` and ``Tables`` (SQLite
and PostgreSQL), data files written with pyarrow, and the real publish, compaction, expiry
and orphan clean-up; the moment is chosen by running the other writer inside a call the
first one makes (as ``test_write_races.py`` does)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler import faults
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.store.store import SegmentFile, Store, TableConflict
from reconciler.table import catalog as cat
from reconciler.table import reach, retention, summary
from reconciler.table.compact import compact
from reconciler.table.expire import expire_snapshots
from reconciler.table.orphans import remove_orphans
from reconciler.table.verify import SupervisorFacts, verify
from reconciler.table.writeids import new_write_id

T0 = datetime(2026, 11, 20, 10, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])
FAR = datetime(2100, 1, 1, tzinfo=UTC)
KEPT = 3  # snapshotsKept: a publish expires down to 3 once there are more than 3 + SLACK


@pytest.fixture
def env(db_url, tmp_path):
    store = Store(db_url)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"},
                       "dimensions": ["id", "__partition", "__offset"]}}), None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    tables = cat.Tables(store.engine, tmp_path / "segments", snapshots_kept=KEPT, reader_grace=0)
    tables.ensure("clicks", SCHEMA, "hour")
    yield store, tables
    store.close()


def _publish(store: Store, tables: cat.Tables, start: int, end: int, hour: int = 0, sid: str = "clicks") -> int:
    """One batch as the runtime publishes it: recorded, its file, its staged snapshot, the
    compare-and-swap with the checkpoint, then the deletion of what it superseded; staged
    again when another writer moved the table (``Supervisor._publish``). Returns the
    number of stagings that lost."""
    batch = new_write_id()
    store.begin_write(batch, "batch", tables=["clicks"], supervisor_id=sid)
    at = T0 + timedelta(hours=hour)
    d = tables.data_dir(tables.current("clicks"), batch) / f"time_chunk={at:%Y%m%dT%H%MZ}"
    d.mkdir(parents=True)
    path = d / "part-00000.parquet"
    pq.write_table(pa.table({"__time": pa.array([at + timedelta(minutes=o % 50) for o in range(start, end)],
                                                pa.timestamp("us", tz="UTC")),
                             "id": [f"{sid}{o}" for o in range(start, end)], "__partition": ["0"] * (end - start),
                             "__offset": pa.array(range(start, end), pa.int64())}, schema=SCHEMA), path)
    summary_ = {cat.SUPERVISOR: sid, cat.BATCH: batch, cat.EPOCH: "1", cat.RANGES: json.dumps([["0", start, end]]),
                cat.READ: json.dumps({"0": end - start})}
    for attempt in range(50):
        commit = tables.stage_append("clicks", [str(path)], summary_, schema=SCHEMA, granularity="hour",
                                     write_id=batch, attempt=attempt)
        try:
            store.publish(supervisor_id=sid, epoch=1, batch_id=batch, datasource="clicks",
                          ranges=[PartitionRange("0", start, end)],
                          files=[SegmentFile("x", "", "", str(path), end - start, 1)],
                          records=end - start, unparseable=0, table_commits=[commit])
        except TableConflict:
            tables.discard_staged([commit])
            continue
        tables.committed([commit])
        return attempt
    raise AssertionError("never won the table")


def _offsets(table, snapshot_id: int | None = None) -> list[int]:
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow()["__offset"].to_pylist())


def _verify(store: Store, tables: cat.Tables, sids=("clicks",)):
    """``reconciler verify clicks --deep``, as the command assembles it."""
    actual = store.read_actual()
    facts = {sid: SupervisorFacts(sid, r.kind, r.state, r.generation, actual.checkpoints.get(sid, {}),
                                  store.first_offsets(sid), r.end_offsets)
             for sid in sids if (r := actual.supervisors[sid])}
    return verify(tables.load("clicks"), "clicks", {sid: store.history(sid) for sid in sids}, deep=True, facts=facts)


def _forget_cached_manifests() -> None:
    """What another process (``reconciler maintain``) knows of the manifests: nothing."""
    reach._LISTS._data.clear()
    reach._ENTRIES._data.clear()


@pytest.mark.parametrize("ref", ["tag", "branch"])
def test_a_snapshot_kept_by_a_ref_keeps_the_files_a_later_compaction_replaced(env, ref):
    """``expire_beyond`` keeps the heads of tags and branches, however old. A compaction
    two batches after the tagged snapshot replaced its small files; once the compaction's
    parent is expired, the publish deleted those files as "replaced", although the tagged
    snapshot, still in the table, lists them: time travel to the tag failed with a missing
    file. And verify, which walks the current snapshot's ancestors until the first expired
    one, never reached the tagged snapshot, whose ranges are not folded either (it is not
    expired): its rows were "at offsets no committed batch read"."""
    store, tables = env
    for lo in range(0, 20, 10):
        _publish(store, tables, lo, lo + 10, hour=0)
    table = tables.load("clicks")
    held = table.current_snapshot().snapshot_id
    manage = table.manage_snapshots()
    (manage.create_tag(held, "audit") if ref == "tag" else manage.create_branch(held, "audit")).commit()
    for lo in range(20, 40, 10):  # the compaction's parent is one of these, not the ref's head
        _publish(store, tables, lo, lo + 10, hour=0)
    result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    assert result.committed, result.message
    for lo in range(40, 150, 10):  # enough publishes to expire the compaction's parent and the compaction
        _publish(store, tables, lo, lo + 10, hour=1)
    table = tables.load("clicks")
    assert held in {s.snapshot_id for s in table.metadata.snapshots}, "the ref's head was expired"
    assert len(table.metadata.snapshots) <= KEPT + 5 + 1
    assert _offsets(table, held) == list(range(20)), "the ref's snapshot cannot be read"
    assert _offsets(table) == list(range(150))
    report = _verify(store, tables)
    assert report.ok, report.to_dict()


def test_maintenance_expiry_planned_before_a_publish_expired_commits_on_what_it_planned(env, monkeypatch):
    """``reconciler maintain`` plans its expiry on the version it read, then stages it on
    the table's current version. A publish that expired snapshots in between (continuous
    expiry) made the staging expire ids that no longer exist: pyiceberg's ValueError, out
    of ``maintain`` with a traceback and the write left ``writing``. Planned and staged on
    one version, it plans again instead, and verify still covers every range."""
    store, tables = env
    for lo in range(0, 80, 10):  # 8 snapshots: the next publish expires 6 of them
        _publish(store, tables, lo, lo + 10)
    begin = store.begin_write

    def publish_first(write_id, kind, **kw):  # after the expiry's plan, before its staging
        if kind == "expire":
            monkeypatch.setattr(store, "begin_write", begin)
            _publish(store, tables, 80, 90)
        return begin(write_id, kind, **kw)

    monkeypatch.setattr(store, "begin_write", publish_first)
    result = expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1)
    monkeypatch.undo()
    assert result.committed, result.message
    table = tables.load("clicks")
    assert len(table.metadata.snapshots) <= 2  # the current one, and the one current after the cut-off
    assert _offsets(table) == list(range(90))
    assert store.writes_in_flight() == []
    report = _verify(store, tables)
    assert report.ok, report.to_dict()


def test_orphan_clean_up_beside_a_publish_that_expires_while_it_reads(env, monkeypatch):
    """Orphan clean-up reads the table, then every snapshot's manifest list. A publish that
    expires snapshots between the two deletes their manifest lists: the clean-up (another
    process: nothing cached) failed with FileNotFoundError, a traceback out of ``reconciler
    maintain`` ("safe while the daemon runs") and a failed maintenance pass in the daemon.
    It reads the table again instead; nothing referenced is deleted."""
    store, tables = env
    for lo in range(0, 80, 10):
        _publish(store, tables, lo, lo + 10)
    _forget_cached_manifests()
    manifests = reach._ManifestReader.manifests
    state = {"done": False}

    def publish_first(self, snapshot, missing_ok=False):
        if not state["done"]:
            state["done"] = True
            _publish(store, tables, 80, 90)  # expires 6 snapshots, deletes their manifest lists
            _forget_cached_manifests()
        return manifests(self, snapshot, missing_ok)

    monkeypatch.setattr(reach._ManifestReader, "manifests", publish_first)
    result = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    monkeypatch.undo()
    assert state["done"]
    table = tables.load("clicks")
    assert _offsets(table) == list(range(90)), result.message
    assert _verify(store, tables).ok


def test_a_crash_between_the_commit_and_its_deletions_is_cleaned_by_orphans(env):
    """A power cut after the publish committed, before it deleted what it superseded: the
    files stay, unreferenced once the metadata log no longer names the versions that
    listed them; orphan clean-up then deletes them (their writes are committed batches) and
    nothing a kept snapshot needs."""
    store, tables = env
    for lo in range(0, 80, 10):
        _publish(store, tables, lo, lo + 10)

    def cut(point, subject):
        if point == "superseded-delete":
            raise SystemExit("power cut")
        return None

    faults.install(cut)
    try:
        with pytest.raises(SystemExit):
            _publish(store, tables, 80, 90)  # expires 6 snapshots: their files stay
    finally:
        faults.install(None)
    for lo in range(90, 230, 10):  # past the metadata log (10 versions)
        _publish(store, tables, lo, lo + 10)
    table = tables.load("clicks")
    root = cat.local_path(table.location())
    unreferenced = {str(p) for p in (root / "metadata").iterdir()} - reach._referenced(table)
    assert unreferenced, "the power cut left nothing behind: the schedule did not happen"
    result = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    assert unreferenced <= set(result.deleted_files)
    table = tables.load("clicks")
    assert {str(p) for p in (root / "metadata").iterdir()} <= reach._referenced(table)
    assert _offsets(table) == list(range(230))
    for s in table.metadata.snapshots:
        end = summary.summary_ranges(dict(s.summary.additional_properties))[0][2]
        assert _offsets(table, s.snapshot_id) == list(range(end))
    assert _verify(store, tables).ok


def test_two_supervisors_racing_into_one_table_fold_exactly(env):
    """Two supervisors publish into one table at once (as a main and its backfill, or two
    sources of one datasource), each losing some compare-and-swaps and staging again on the
    winner's version, every publish expiring beyond ``KEPT``: the ranges folded into the
    table's properties plus those of the kept snapshots are exactly what was published, and
    verify --deep passes (each record once)."""
    store, tables = env
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "views", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "v"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"},
                       "dimensions": ["id", "__partition", "__offset"]}}), None, actor="test")
    store.init_checkpoints("views", {"0": 0})
    lost = {"clicks": 0, "views": 0}
    errors = []

    def run(sid):
        try:
            for lo in range(0, 240, 8):
                lost[sid] += _publish(store, tables, lo, lo + 8, sid=sid)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(sid,)) for sid in lost]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sum(lost.values()) > 0, "no publish ever lost: the race did not happen"
    table = tables.load("clicks")
    assert len(table.metadata.snapshots) <= KEPT + 5
    ids = table.scan().to_arrow()["id"].to_pylist()
    assert sorted(ids) == sorted(f"{sid}{o}" for sid in lost for o in range(240))
    folded = summary.expired_ranges(table.properties)
    assert folded == {"clicks": [("0", 0, folded["clicks"][0][2])], "views": [("0", 0, folded["views"][0][2])]}
    report = _verify(store, tables, sids=("clicks", "views"))
    assert report.ok, report.to_dict()


def test_a_deletion_that_fails_after_the_commit_does_not_fail_the_published_batch(tmp_path, db_url, monkeypatch):
    """The deletions run after the commit, inside the publish. One that the file system
    refuses (EACCES: a compaction's directory made by ``reconciler compact`` run as root, a
    read-only mount) raised out of the publish of a batch that had committed: the runtime
    counted a failed batch (UNHEALTHY after three), the batch's metrics and timings were lost,
    and the fence had to find out that it committed. A deletion is best effort: what is left
    is orphan clean-up's."""
    from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
    from tests.benchmarks.load import benchmark

    bench = benchmark("commit_growth")
    store = Store(db_url)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": bench.SID, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": bench.SID},
        "maxBatchRecords": 3, "dataSchema": {"datasource": bench.SID, "timestamp": {"column": "ts"},
                                             "dimensions": ["id", "__partition", "__offset"]}}), None, actor="test")
    phases = bench.Phases()
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None, metrics=phases,
                         job=bench.TinyJob(), adapters=lambda source: counter, snapshots_kept=KEPT, reader_grace=0)
    counter = bench.Counter(3)
    rt = SupervisorRuntime(bench.SID, ctx)
    try:
        for _ in range(KEPT + 5):  # no expiry yet
            rt.step()
        assert len(phases.publish) == KEPT + 5 and rt.failures == 0
        from reconciler.table import storage
        from reconciler.table.locations import local_path

        delete = storage.Storage.delete
        refused = []

        def eacces(self, locations):  # the warehouse's one file layer: local disk or a bucket
            locations = list(locations)
            for x in locations:
                if "/metadata/snap-" in str(x):
                    refused.append(str(local_path(str(x))))
                    raise PermissionError(13, "Permission denied", str(x))
            return delete(self, locations)

        monkeypatch.setattr(storage.Storage, "delete", eacces)
        rt.step()  # publishes and expires: deleting the expired snapshots' manifest lists is refused
        monkeypatch.undo()
        assert refused, "nothing was deleted after the commit: the schedule did not happen"
        assert rt.failures == 0, rt.recent_errors
        assert len(phases.publish) == KEPT + 6
        assert store.checkpoints(bench.SID) == {"0": 3 * (KEPT + 6)}
        assert store.get(bench.SID).state not in ("UNHEALTHY_SUPERVISOR", "UNHEALTHY_TASKS")
        assert all(Path(p).exists() for p in refused)  # left for orphan clean-up
        table = ctx.tables().load(bench.SID)
        assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted(f"k{o}" for o in range(3 * (KEPT + 6)))
    finally:
        store.close()


def test_two_compactions_of_one_partition_at_once_keep_every_key_once(env):
    """``reconciler compact`` beside the daemon's compactor: both plan the same closed
    partition. The first writes its files while the second commits, then stages on the
    table as it is now, where the files it planned to replace are no longer live: pyiceberg's
    own check refuses the removal ("Missing required files to delete") and it plans again,
    finding nothing left to do; then the publishes that expire both compactions' parents
    delete the replaced files, and every key stays once (this held)."""
    store, tables = env
    for lo in range(0, 40, 10):
        _publish(store, tables, lo, lo + 10, hour=0)
    at_written, go = threading.Event(), threading.Event()

    def hook(point, subject):
        if point == "compact-written" and threading.current_thread().name == "cli-compaction":
            at_written.set()
            go.wait(60)
        return None

    outcome = {}

    def cli_compaction():
        outcome["result"] = compact(cat.Tables(store.engine, tables.warehouse, snapshots_kept=KEPT, reader_grace=0), "clicks",
                                    store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)

    faults.install(hook)
    try:
        t = threading.Thread(target=cli_compaction, name="cli-compaction")
        t.start()
        assert at_written.wait(60), "the first compaction never wrote its files"
        daemon = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
        assert daemon.committed, daemon.message
        go.set()
        t.join(60)
    finally:
        faults.install(None)
        go.set()
    table = tables.load("clicks")
    assert _offsets(table) == list(range(40)), f"{outcome['result'].message}; rows: {len(_offsets(table))}"
    for lo in range(40, 120, 10):  # the replaced files go as the compactions' parents expire
        _publish(store, tables, lo, lo + 10, hour=1)
    assert _offsets(tables.load("clicks")) == list(range(120))
    assert _verify(store, tables).ok


def test_merged_manifests_stop_growing_at_the_target_size(env, monkeypatch):
    """A merge rewrites every entry of the manifests it merges, and a merged manifest is merged
    again every ``MERGE_MIN_COUNT`` commits until it reaches ``commit.manifest.target-size-bytes``:
    at Iceberg's 8 MiB that was seconds of rewriting per merge once a table held ~20,000 live
    files. The product's cap (scaled down here so that 160 one-file batches cross it several
    times) bounds every manifest, so a merge never rewrites more than one target's worth, and
    the table still holds every batch's rows exactly once."""
    store, tables = env
    # the product's cap: a merge rewrites at most ~600-1,400 entries (under 0.3 s)
    assert int(retention.PROPERTIES["commit.manifest.target-size-bytes"]) <= 1024 * 1024
    target = 16 * 1024  # a manifest of one entry is ~4.6 KiB (its header); an entry ~0.3 KiB
    monkeypatch.setitem(retention.PROPERTIES, "commit.manifest.target-size-bytes", str(target))
    batches = 160
    for i in range(batches):
        _publish(store, tables, i * 2, i * 2 + 2)
    table = tables.load("clicks")
    assert table.metadata.properties["commit.manifest.target-size-bytes"] == str(target)
    manifests = table.current_snapshot().manifests(table.io)
    sizes = sorted(m.manifest_length for m in manifests)
    assert max(sizes) <= target, sizes
    full = [s for s in sizes if s > target // 2]
    assert len(full) >= 3, sizes  # the files spread over several capped manifests, not one growing one
    live = sum(len(m.fetch_manifest_entry(table.io, discard_deleted=True)) for m in manifests)
    assert live == batches
    assert _offsets(table) == list(range(batches * 2))
    assert _verify(store, tables).ok


def test_cached_manifest_lists_share_one_object_per_manifest(env):
    """pyiceberg shares a manifest's object between lists through a cache of 128 manifests
    only; a table listing more made every cached list (8,192 of them) hold its own copies,
    ~800 bytes a manifest. The reader's cache keeps one object per manifest path."""
    store, tables = env
    for i in range(4):
        _publish(store, tables, i * 2, i * 2 + 2)
    _forget_cached_manifests()
    from pyiceberg.manifest import clear_manifest_cache

    table = tables.load("clicks")
    reader = reach._ManifestReader(table.io)
    lists = []
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number):
        clear_manifest_cache()  # what more than 128 manifests do to pyiceberg's sharing
        lists.append(reader.manifests(snapshot))
    by_path: dict[str, object] = {}
    shared = 0
    for manifests in lists:
        for m in manifests:
            if m.manifest_path in by_path:
                assert by_path[m.manifest_path] is m
                shared += 1
            by_path.setdefault(m.manifest_path, m)
    assert shared >= 3  # each snapshot's list repeats the manifests of the one before


# The files a compaction replaced are deleted by the publishes once no kept snapshot sees
# them, also when the compaction outlives its parent.
#
# Found by a review: ``retention.superseded`` looked for "kept snapshots whose parent was
# expired" in the NEW metadata, but pyiceberg's ``RemoveSnapshotsUpdate`` sets the
# ``parent_snapshot_id`` of such a snapshot to None, so a compaction among the newest
# ``snapshotsKept`` whose parent a publish expired was never found, nor later when it expired
# itself (its parent id already None): its inputs stayed until an orphan clean-up. With
# ``SLACK`` 5 a publish expires six snapshots at a time, so about one compaction in six.
# No file a kept snapshot needs was deleted; this test checks that too.
def test_files_a_kept_compaction_replaced_go_once_no_kept_snapshot_sees_them(env):
    store, tables = env
    assert KEPT == 3
    # Six batches, then the compaction: 7 snapshots. The publish that makes 9 expires down to
    # the newest 3 (the compaction and two batches after it): the compaction's parent goes,
    # the compaction stays.
    for lo in range(0, 30, 5):
        _publish(store, tables, lo, lo + 5, hour=0)
    result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    assert result.committed, result.message
    table = tables.load("clicks")
    compaction = table.current_snapshot()
    reader = reach._ManifestReader(table.io)
    replaced = set()
    for m in reader.manifests(compaction):
        if m.added_snapshot_id == compaction.snapshot_id:
            replaced |= reader.deleted_files(m)
    assert len(replaced) == 6
    seen = []
    lo = 30
    for _ in range(20):  # the compaction's parent expires at the 2nd, the compaction at the 8th
        _publish(store, tables, lo, lo + 5, hour=1)
        lo += 5
        ids = {s.snapshot_id for s in tables.load("clicks").metadata.snapshots}
        seen.append((compaction.parent_snapshot_id in ids, compaction.snapshot_id in ids))
    assert (False, True) in seen, f"the schedule did not happen: {seen}"
    table = tables.load("clicks")
    assert compaction.snapshot_id not in {s.snapshot_id for s in table.metadata.snapshots}
    # safety holds: every kept snapshot is whole, every record once, verify passes
    for s in table.metadata.snapshots:
        _offsets(table, s.snapshot_id)
    assert _offsets(table) == list(range(lo))
    assert _verify(store, tables).ok
    # the defect: no kept snapshot (and no version in the metadata log) sees them, yet they stay
    left = sorted(f for f in replaced if Path(f).exists())
    assert not left, f"{len(left)} replaced data file(s) never deleted by the publishes: {left[:2]}"
