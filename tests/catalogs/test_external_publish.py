"""The external-catalog commit protocol (``runtime.publish_external``, ``table/catalogs/fence.py``)
on moto's Glue and S3 with the real store (SQLite) and pyiceberg's own ``GlueCatalog``: the
table first, then the database; a fence tag per supervisor; the database rolled forward from
the table after a crash between the two commits. The batch's files are real Parquet files in
the bucket; only the Spark job that would have written them is left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.errors import PublishConflict
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.runtime.publishing import ResetUnderway
from reconciler.runtime.supervisor import RuntimeContext
from reconciler.store.store import Store
from reconciler.table.catalogs import fence
from reconciler.table.catalogs.external import ExternalTables
from reconciler.table.writeids import new_write_id
from tests.catalogs.glueworld import DEAD, DS, SCHEMA, ensure_tables, store_with
from tests.catalogs.glueworld import ids as _ids
from tests.catalogs.glueworld import summary as _summary
from tests.catalogs.glueworld import write_batch as _batch


@pytest.fixture
def env(glue, db_url):
    store = store_with(db_url, "clicks", "other")
    warehouse = f"s3://{glue['bucket']}/wh"
    ctx = RuntimeContext(store=store, segments_dir=warehouse, spark=lambda: None, catalog=glue["setting"])
    tables = ctx.tables()
    assert isinstance(tables, ExternalTables)
    ensure_tables(tables)
    yield ctx, store, tables, glue
    store.close()


def _step(ctx, store, tables, sid, *, dead=False, before_publish=None):
    """One step as the runtime runs it: epoch, then the fence (prepare), then the checkpoints,
    a batch of up to 5 records, the publish."""
    rec = store.get(sid)
    head = ctx.publisher().prepare(rec, "clicks")
    start = store.checkpoints(sid)["0"]
    ranges = [PartitionRange("0", start, start + 5)]
    written = _batch(tables, store, sid, start, start + 5, dead=dead)
    if before_publish:
        before_publish()
    ctx.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges, 5,
                            head=head)
    return written


def test_batches_land_in_glue_and_the_database_follows(env):
    ctx, store, tables, glue = env
    _step(ctx, store, tables, "clicks", dead=True)
    _step(ctx, store, tables, "clicks")
    assert store.checkpoints("clicks") == {"0": 10}
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(10))
    assert _ids(glue, "clicks_deadletter") == ["bad-clicks-0"]
    with store.engine.connect() as c:  # the metadata database holds no table of its own for it
        has = sa.inspect(c).has_table("iceberg_tables")
        rows = c.execute(sa.text("SELECT table_name FROM iceberg_tables")).all() if has else []
    assert rows == []


def test_a_reset_fence_fails_the_batch_in_flight_and_nothing_lands(env):
    ctx, store, tables, glue = env
    _step(ctx, store, tables, "clicks")
    rec = store.get("clicks")
    # the reset's first step lands while the batch [5, 10) is being written
    with pytest.raises(PublishConflict, match="another leader came first"):
        _step(ctx, store, tables, "clicks",
              before_publish=lambda: fence.fence(tables, store, "clicks", "clicks", rec.epoch + 1, new_write_id()))
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(5))
    assert store.checkpoints("clicks") == {"0": 5}
    # until the reset bumps the epoch, no batch starts on the fence
    with pytest.raises(ResetUnderway):
        ctx.publisher().prepare(store.get("clicks"), "clicks")


def test_a_crash_between_the_table_and_the_database_is_rolled_forward(env):
    ctx, store, tables, glue = env
    _step(ctx, store, tables, "clicks")
    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")
    written = _batch(tables, store, "clicks", 5, 10, dead=True)
    ranges = [PartitionRange("0", 5, 10)]
    summary = _summary(rec, written, ranges) | {fence.FENCE_PREV: str(head.snapshot_id),
                                                fence.DEAD_FILES: json.dumps([written.dead_files[0].path])}
    # the table's commit, then the process dies: the database never heard of the batch
    tables.commit_append("clicks", [written.files[0].path], summary, fence=(fence.tag_name("clicks"), head.snapshot_id),
                         write_id=written.batch_id)
    assert store.checkpoints("clicks") == {"0": 5}
    _step(ctx, store, tables, "clicks")  # the next step rolls forward first, then reads [10, 15)
    assert store.checkpoints("clicks") == {"0": 15}
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(15))
    assert _ids(glue, "clicks_deadletter") == ["bad-clicks-5"]
    assert store.committed_batch_ids([written.batch_id]) == {written.batch_id}
    assert store.writes_in_flight() == []


def test_another_supervisors_commit_restages_with_the_fence_kept(env):
    """A backfill of the same datasource commits between this batch's staging and its commit:
    Glue refuses the stale VersionId (the devservice's patch), the batch stages again, and its
    retry still asserts the fence (pyiceberg's own retry would have dropped it)."""
    ctx, store, tables, glue = env
    _step(ctx, store, tables, "clicks", before_publish=lambda: _step(ctx, store, tables, "other"))
    assert _ids(glue) == sorted([f"clicks-{o}" for o in range(5)] + [f"other-{o}" for o in range(5)])
    rec = store.get("clicks")
    stale = ctx.publisher().prepare(rec, "clicks")
    _step(ctx, store, tables, "clicks")
    written = _batch(tables, store, "clicks", 5, 10)
    with pytest.raises(PublishConflict):  # a zombie's batch read the fence before the last commit
        ranges = [PartitionRange("0", 5, 10)]
        ctx.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges, 5,
                                head=stale)
    assert len([i for i in _ids(glue) if i.startswith("clicks-")]) == 10


def test_recovery_rolls_forward_before_it_fences_writes_in_flight(env, s3_server):
    """A new leader's recovery: the batch the table holds keeps its files and is recorded; the
    batch the table does not hold is fenced and its files deleted."""
    from reconciler.runtime.recovery import recover

    ctx, store, tables, glue = env
    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")
    landed = _batch(tables, store, "clicks", 0, 5)
    ranges = [PartitionRange("0", 0, 5)]
    tables.commit_append("clicks", [landed.files[0].path],
                         _summary(rec, landed, ranges) | {fence.FENCE_PREV: str(head.snapshot_id or "")},
                         fence=(fence.tag_name("clicks"), head.snapshot_id), write_id=landed.batch_id)
    lost = _batch(tables, store, "other", 0, 5)  # written, never committed anywhere
    recover(store, ctx.segments_dir, glue["setting"])
    assert store.checkpoints("clicks") == {"0": 5}
    assert store.committed_batch_ids([landed.batch_id, lost.batch_id]) == {landed.batch_id}
    assert store.writes_in_flight() == []
    keys = s3_server.keys(glue["bucket"], "wh/")
    assert any(f"batch={landed.batch_id}/" in k for k in keys)
    assert not any(f"batch={lost.batch_id}/" in k for k in keys)
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(5))


def test_the_publish_keeps_the_history_short_and_deletes_what_it_unreferenced(env, s3_server):
    """As with sql (retention.py): snapshots beyond snapshotsKept expire in the publish's own
    commit, their ranges folded into the table's properties; the files only they needed go
    (readerGrace 0 here); the fence tags' snapshots stay; every row still reads once."""
    ctx, store, tables, glue = env
    short = RuntimeContext(store=store, segments_dir=ctx.segments_dir, spark=lambda: None, catalog=glue["setting"],
                           snapshots_kept=2, reader_grace=0.0)
    tables = short.tables()
    for _ in range(12):
        _step(short, store, tables, "clicks")
    table = tables.load("clicks")
    assert len(table.metadata.snapshots) <= 2 + 5 + 1  # keep + slack (+ a tag's head)
    assert table.metadata.refs[fence.tag_name("clicks")].snapshot_id == table.current_snapshot().snapshot_id
    assert json.loads(table.metadata.properties["reconciler.expired-ranges"])["clicks"][0][1] == 0
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(60))
    listed = {k.rsplit("/", 1)[-1] for k in s3_server.keys(glue["bucket"], "wh/") if "/metadata/" in k}
    assert sum(1 for n in listed if n.startswith("snap-")) < 12  # expired manifest lists deleted
    assert store.checkpoints("clicks") == {"0": 60}


def test_apply_refuses_a_column_change_the_glue_table_cannot_take(glue, tmp_path):
    """apply's table check asks the lake's catalog (the metadata database has no table)."""
    from reconciler.control.apply import Applier
    from reconciler.control.plan import Action, ActionKind
    from reconciler.pipeline.transform import output_schemas

    def spec(qty_type):
        return SupervisorSpec.from_document({
            "id": "orders", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "o"},
            "dataSchema": {"datasource": "orders", "timestamp": {"column": "ts"},
                           "dimensions": [{"name": "qty", "type": qty_type}]}})

    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    warehouse = f"s3://{glue['bucket']}/wh"
    good = spec("long")
    store.create_supervisor(good, "specs/orders.yaml", actor="test")
    ExternalTables(store.engine, warehouse, glue["setting"]).ensure("orders", output_schemas(good.data_schema)[0],
                                                                   "hour")
    applier = Applier(store, actor="test", warehouse=warehouse, catalog=glue["setting"])
    [result] = applier.apply([Action(ActionKind.UPDATE, "orders", "spec changed", spec=spec("string"),
                                     path="specs/orders.yaml")])
    assert not result.ok and "qty long -> string: refused" in result.message
    assert store.get("orders").spec_hash == good.spec_hash
    store.close()


def test_validate_checks_the_columns_against_the_glue_table(glue, tmp_path, monkeypatch):
    import yaml

    from reconciler.pipeline.transform import output_schemas
    from tests.e2e import helpers as h

    doc = {"id": "orders", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "o"},
           "dataSchema": {"datasource": "orders", "timestamp": {"column": "ts"},
                          "dimensions": [{"name": "qty", "type": "long"}]}}
    s = h.make_settings(tmp_path, segments=f"s3://{glue['bucket']}/wh", catalog=json.dumps(glue["setting"]))
    monkeypatch.setenv("RECONCILER_CATALOG", json.dumps(glue["setting"]))
    store = Store(s.db_url)
    store.migrate()
    ExternalTables(store.engine, s.warehouse, glue["setting"]).ensure(
        "orders", output_schemas(SupervisorSpec.from_document(doc).data_schema)[0], "hour")
    store.close()
    doc["dataSchema"]["dimensions"] = [{"name": "qty", "type": "string"}]
    (Path(s.specs) / "orders.yaml").write_text(yaml.safe_dump(doc))
    code, out = h.run_cli(s, "validate")
    assert code != 0 and "qty long -> string" in out, out
