"""Adversarial review of the external-catalog publish (issue 44): schedules that broke it.

Real pyiceberg ``GlueCatalog`` on moto's Glue and S3 (``UpdateTable`` refusing a stale
``VersionId``, devservices/glue.py), the real store; the fixtures and helpers are
``test_external_publish.py``'s. Each test fails on the code as reviewed.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC
from types import SimpleNamespace

import pytest

from reconciler import faults
from reconciler.errors import PublishConflict
from reconciler.model import PartitionRange
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.table.catalogs import fence
from reconciler.table.summary import BATCH
from tests.catalogs import test_external_publish as base
from tests.catalogs.test_external_publish import DEAD, DS, SCHEMA, _batch, _ids, _step, _summary

env = base.env  # the fixture: moto's Glue and S3, the store, clicks and clicks_deadletter


def _abandon(ctx, written):
    """What the runtime does with a batch whose publish raised anything but BatchInTable
    (``SupervisorRuntime._abandon``: fence the write, delete its files)."""
    tables = ctx.tables()
    dirs = (tables.data_dir(tables.load("clicks"), written.batch_id),
            tables.data_dir(tables.load("clicks_deadletter"), written.batch_id))
    SupervisorRuntime._abandon(SimpleNamespace(ctx=ctx), written.batch_id, ("clicks", "clicks_deadletter"), dirs)


def test_a_commit_whose_answer_was_lost_is_not_taken_for_a_fence(env, s3_server, monkeypatch):
    """Glue applies the batch's UpdateTable and its answer is lost (a 500 after the write, a
    read timeout). botocore retries the call (pyiceberg's glue.max-retries, 10 by default)
    with the same VersionId, which is stale now (our own update moved it): Glue refuses it,
    pyiceberg raises CommitFailedException, commit_fenced reloads the table, finds the fence
    tag moved (to OUR snapshot) and raises FenceMoved -> PublishConflict "batch discarded".
    The runtime then abandons the batch: its files are deleted while the table references
    them, and the next step rolls the batch forward (checkpoints move past records whose rows
    are gone). Expected: a commit whose tag now points at its own snapshot is a success (or
    BatchInTable), never a conflict."""
    ctx, store, tables, glue = env
    _step(ctx, store, tables, "clicks")
    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")
    written = _batch(tables, store, "clicks", 5, 10)
    ranges = [PartitionRange("0", 5, 10)]
    _lose_next_answer(monkeypatch)
    conflict = None
    try:
        ctx.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges, 5,
                                head=head)
    except PublishConflict as exc:  # what the runtime does with it
        conflict = exc
        _abandon(ctx, written)
    table = tables.load("clicks")
    landed = table.metadata.snapshot_by_id(table.metadata.refs[fence.tag_name("clicks")].snapshot_id)
    assert landed.summary.additional_properties.get(BATCH) == written.batch_id  # it committed
    keys = set(s3_server.keys(glue["bucket"], "wh/"))
    gone = [p for p in (landed.manifest_list, written.files[0].path) if p.split(f"s3://{glue['bucket']}/", 1)[-1]
            not in keys]
    assert conflict is None and gone == [], (
        f"the batch committed, the publish said {conflict!r}; the current snapshot's files were deleted: {gone} "
        "(every later commit and every scan of the table now fails)")
    _step(ctx, store, tables, "clicks")  # the next step reads [10, 15)
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(15))


def _lose_next_answer(monkeypatch):
    """Glue's UpdateTable applies the update and its answer is lost (a 500): botocore retries
    the same call, now with a stale VersionId. Server-side, one shot."""
    from moto.core.exceptions import JsonRESTError
    from moto.glue.responses import GlueResponse

    class InternalError(JsonRESTError):
        code = 500

    patched = GlueResponse.update_table
    armed = {"on": True}

    def update_table(self):
        out = patched(self)
        if armed["on"]:
            armed["on"] = False
            raise InternalError("InternalServiceException", "the answer is lost after the update")
        return out

    monkeypatch.setattr(GlueResponse, "update_table", update_table)
    return armed


def test_a_compaction_whose_answer_was_lost_keeps_the_files_the_table_references(env, s3_server, monkeypatch):
    """The same lost answer on a compaction's commit: ``_commit_staged`` turns the retried
    call's CommitFailedException into TableConflict, ``_commit_external`` puts the write back
    in flight, the compaction plans again (nothing left to merge) and ``_finish`` fences the
    write and deletes data/compacted/<write id>/: the files the table's current snapshot
    references now. The inputs the compaction replaced are no longer in the table."""
    import io
    from datetime import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from reconciler.table import compact as mc
    from reconciler.table import storage
    from reconciler.table.writeids import new_write_id

    ctx, store, tables, glue = env
    tables.ensure("hourly", SCHEMA, "hour", rollup=False)
    at = None
    for n in range(3):  # three small files in the hour 1970-01-01T00
        wid = new_write_id()
        path = f"{tables.data_dir(tables.load('hourly'), wid)}/p.parquet"
        buf = io.BytesIO()
        pq.write_table(pa.table({"__time": pa.array(range(n * 5, n * 5 + 5), pa.timestamp("us", tz="UTC")),
                                 "id": [f"h-{o}" for o in range(n * 5, n * 5 + 5)]}, schema=SCHEMA), buf)
        storage.at(path).write_bytes(path, buf.getvalue())
        at = tables.commit_append("hourly", [path], {}, fence=("reconciler-fence-h", at), write_id=wid)
    armed = _lose_next_answer(monkeypatch)
    result = mc.compact(tables, "hourly", store=store, now=datetime.now(UTC))
    assert not armed["on"], f"the compaction never committed: {result.message}"
    table = tables.load("hourly")
    keys = set(s3_server.keys(glue["bucket"], "wh/"))
    snap = table.current_snapshot()
    gone = [p for p in (snap.manifest_list,) if p.split(f"s3://{glue['bucket']}/", 1)[-1] not in keys]
    if not gone:
        paths = [t.file.file_path for t in table.scan().plan_files()]
        gone = [p for p in paths if p.split(f"s3://{glue['bucket']}/", 1)[-1] not in keys]
    assert gone == [], (f"compaction said {result.message!r} (committed={result.committed}); the table's current "
                        f"snapshot references deleted files {gone}")
    assert _ids(glue, "hourly") == sorted(f"h-{o}" for o in range(15))


def test_a_zombie_batch_cannot_land_on_files_the_new_leaders_recovery_deleted(env, s3_server):
    """Leader A (lease token 1) reads the fence, writes batch [0, 5) and builds its commit
    (footers read, manifests written), then stalls (GC pause, VM freeze) at external-commit,
    just before Glue's UpdateTable, past its lease. Leader B takes the lease and runs
    recovery: nothing of clicks is in the table yet, so the batch in flight is fenced in the
    database and its files deleted (data and its tagged manifests). A wakes and commits to
    Glue: the fence tag has not moved (recovery moves no fence, and nothing checks the lease
    before the table commit), so the commit lands referencing the deleted files; A's database
    publish fails on the lease and rolls the batch forward, so the checkpoint passes records
    that are in no readable file. Expected (issue 44: a leader change must make a batch in
    flight fail its table commit): the commit fails, or its files stay."""
    from reconciler.runtime.recovery import recover

    _, store, _, glue = env
    token_a = store.acquire_lease("A", 0.2)
    ctx_a = RuntimeContext(store=store, segments_dir=f"s3://{glue['bucket']}/wh", spark=lambda: None,
                           catalog=glue["setting"], lease=lambda: ("A", token_a))
    tables = ctx_a.tables()
    rec = store.get("clicks")
    head = ctx_a.publisher().prepare(rec, "clicks")
    written = _batch(tables, store, "clicks", 0, 5)
    ranges = [PartitionRange("0", 0, 5)]
    held, release, outcome = threading.Event(), threading.Event(), []

    def hook(name, subject):
        if name == "external-commit" and threading.current_thread() is a_thread:
            held.set()
            release.wait(60)

    def a():
        try:
            ctx_a.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges,
                                      5, head=head)
            outcome.append("published")
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    a_thread = threading.Thread(target=a, daemon=True)
    faults.install(hook)
    try:
        a_thread.start()
        assert held.wait(60), "A never reached external-commit"
        time.sleep(0.4)  # A stalls past its lease
        assert store.acquire_lease("B", 60.0) == token_a + 1
        recover(store, f"s3://{glue['bucket']}/wh", glue["setting"])  # B's recovery, before its runtimes
        release.set()
        a_thread.join(60)
    finally:
        faults.install(None)
        release.set()
    table = tables.load("clicks")
    keys = set(s3_server.keys(glue["bucket"], "wh/"))
    snap = table.current_snapshot()
    # what the table references must exist: its manifest list and every data file (A's file
    # only if A's commit landed: the issue allows either outcome, never a deleted reference)
    referenced = [] if snap is None else [snap.manifest_list, *(t.file.file_path for t in table.scan().plan_files())]
    gone = [p for p in referenced if p.split(f"s3://{glue['bucket']}/", 1)[-1] not in keys]
    landed = store.committed_batch_ids([written.batch_id])
    assert landed or isinstance(outcome[0], PublishConflict), f"zombie A's publish ended with {outcome!r}"
    assert landed or written.files[0].path not in referenced
    assert gone == [], (f"zombie A's publish ended with {outcome!r}; the table's current snapshot references "
                        f"files the new leader's recovery deleted: {gone}; checkpoints {store.checkpoints('clicks')}, "
                        f"committed {store.committed_batch_ids([written.batch_id])}")


def test_a_zombies_dead_letters_are_not_appended_twice(env):
    """Leader A commits batch [0, 5) (one dead letter) to the data table and stalls at
    between-commits. Leader B's recovery rolls it forward (its dead letter appended, the
    batch recorded), then B's next batch [5, 10) has a dead letter too: the dead-letter
    table's tag moves to B's batch. A wakes: commit_dead_letters only compares the tag's
    CURRENT batch with its own and reads the tag afresh (no fence from A's step), so it
    appends A's dead letter a second time. RELIABILITY.md: "the publish and any roll-forward
    may race for it, and it lands once"."""
    from reconciler.runtime.recovery import recover

    ctx, store, tables, glue = env
    held, release = threading.Event(), threading.Event()

    def hook(name, subject):
        if name == "between-commits" and threading.current_thread() is a_thread:
            held.set()
            release.wait(60)

    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")
    written = _batch(tables, store, "clicks", 0, 5, dead=True)
    ranges = [PartitionRange("0", 0, 5)]
    errors: list[BaseException] = []

    def a():
        try:
            ctx.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges,
                                    5, head=head)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    a_thread = threading.Thread(target=a, daemon=True)
    faults.install(hook)
    try:
        a_thread.start()
        assert held.wait(60), "A never reached between-commits"
        recover(store, ctx.segments_dir, glue["setting"])  # leader B
        _step(ctx, store, tables, "clicks", dead=True)  # B's batch [5, 10), one dead letter
        release.set()
        a_thread.join(60)
    finally:
        faults.install(None)
        release.set()
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(10))
    assert store.checkpoints("clicks") == {"0": 10}
    assert _ids(glue, "clicks_deadletter") == ["bad-clicks-0", "bad-clicks-5"], f"A ended with {errors!r}"


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    faults.install(None)
