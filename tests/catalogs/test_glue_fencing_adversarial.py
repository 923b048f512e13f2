"""Adversarial review of issue 44 (external catalogs): fencing by leader changes and resets,
on moto's Glue and S3 with pyiceberg's own GlueCatalog and the real store. No catalog mocks.

Helpers are tests/catalogs/glueworld.py's."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconciler.model import PartitionRange
from reconciler.runtime.supervisor import RuntimeContext
from reconciler.store.base import utcnow
from reconciler.table.catalogs.external import ExternalTables
from reconciler.table.writeids import new_write_id
from tests.catalogs.glueworld import DEAD, DS, SCHEMA, ensure_tables, store_with
from tests.catalogs.glueworld import ids as _ids
from tests.catalogs.glueworld import referenced_files as _referenced_files
from tests.catalogs.glueworld import summary as _summary
from tests.catalogs.glueworld import write_batch as _batch


@pytest.fixture
def env(glue, db_url):
    store = store_with(db_url, "clicks")
    warehouse = f"s3://{glue['bucket']}/wh"
    yield store, warehouse, glue
    store.close()


def _ctx(store, warehouse, glue, lease=None) -> RuntimeContext:
    return RuntimeContext(store=store, segments_dir=warehouse, spark=lambda: None, catalog=glue["setting"],
                          lease=(lambda: lease))


def _ensure(tables):
    assert isinstance(tables, ExternalTables)
    ensure_tables(tables)


class Step:
    """One runtime step split at its publish: epoch, fence (prepare), checkpoints, the batch's
    files written and recorded in flight; ``publish()`` later."""

    def __init__(self, ctx, store, sid="clicks", size=5):
        self.ctx, self.store, self.tables = ctx, store, ctx.tables()
        self.rec = store.get(sid)
        self.head = ctx.publisher().prepare(self.rec, "clicks")
        start = store.checkpoints(sid)["0"]
        self.ranges = [PartitionRange("0", start, start + size)]
        self.written = _batch(self.tables, store, sid, start, start + size)

    def publish(self):
        self.ctx.publisher().publish(self.rec, DS(), self.written, _summary(self.rec, self.written, self.ranges),
                                     [], SCHEMA, DEAD, self.ranges, self.ranges[0].size, head=self.head)


def test_a_zombie_leaders_batch_lands_after_the_new_leaders_recovery_deleted_its_files(env, s3_server):
    """Leader A's lease runs out while its batch [5, 10) is being committed: A has staged the
    Glue commit (pyiceberg read the Parquet footers) and pauses before ``commit_table`` (the
    ``external-commit`` point; a GC pause, a slow Glue call). Leader B takes the lease and runs
    recovery before its runtimes start: it rolls forward (the table has nothing new: A has not
    committed), then fences A's write and deletes its files. A's ``commit_table`` then goes
    through: the fence tag is still at the H A read (B has not committed yet), and the
    database's lease check comes only after the table's commit. RELIABILITY.md: a zombie's
    batch "either fails ... or lands on top of the last commit and is rolled forward". It
    lands, and its data file is gone: the table references a deleted file (every scan of the
    table fails), and B's next step rolls the range forward, so [5, 10) is never read again."""
    from reconciler import faults
    from reconciler.runtime.recovery import recover

    store, warehouse, glue = env
    token_a = store.acquire_lease("A", ttl=5)
    ctx_a = _ctx(store, warehouse, glue, lease=("A", token_a))
    _ensure(ctx_a.tables())
    Step(ctx_a, store).publish()  # [0, 5) by A, A still leads

    zombie = Step(ctx_a, store)  # A's batch [5, 10): files written, write in flight
    armed, tokens = [], []

    def hook(name, subject):
        if name == "external-commit" and subject == "clicks" and armed:
            armed.clear()
            # A is paused here, staged; its lease expires and B starts leading
            token_b = store.acquire_lease("B", ttl=30, now=utcnow() + timedelta(seconds=10))
            assert token_b is not None and token_b != token_a
            tokens.append(token_b)  # not in ``armed``: recovery's own fence commit passes here too
            recover(store, warehouse, glue["setting"])  # B's start: before any of its runtimes

    faults.install(hook)
    try:
        armed.append("go")
        try:  # A's publish: the table first, then the database (which refuses A's lease)
            zombie.publish()
        except Exception:  # noqa: BLE001 - whatever A makes of it, the question is what the table holds
            pass
    finally:
        faults.install(None)
    token_b = tokens[0]

    ctx_b = _ctx(store, warehouse, glue, lease=("B", token_b))
    try:
        Step(ctx_b, store).publish()  # B's runtime: rolls A's batch forward, then the next range
    except Exception:  # noqa: BLE001
        pass

    n = store.checkpoints("clicks")["0"]
    try:
        referenced = _referenced_files(glue)
    except FileNotFoundError as exc:  # the snapshot's own manifest list was deleted (the write's tag)
        pytest.fail(f"the Glue table's current snapshot cannot be read: recovery deleted the zombie's files and "
                    f"the zombie's commit then landed ({exc}); checkpoint now {n}")
    keys = {f"s3://{glue['bucket']}/{k}" for k in s3_server.keys(glue["bucket"], "wh/")}
    missing = [f for f in referenced if f not in keys]
    assert missing == [], f"the Glue table references data files recovery deleted: {missing}; checkpoint now {n}"
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(n))


def test_a_reset_before_the_first_batch_created_the_table_does_not_fence_it(env):
    """A new supervisor's first step: ``prepare`` finds no table (Head(None)), the checkpoint
    is read (0), then the step asks Spark for its schemas (the session's first call, seconds)
    and only then ``ensure`` creates the table. A reset with a backfill (to latest, 100) lands
    in that window: its fence finds no table and fences nothing (``fence.fence`` returns
    Head(None)), the epoch moves, the backfill gets [0, 100). The first batch [0, 5) then
    creates the table and commits: on a table without snapshots no tag is asserted. The
    database refuses the old epoch, the publish rolls it forward instead, and the backfill
    reads [0, 100) again: offsets 0-4 are in the table twice."""
    from reconciler.control.requests import ResetRequest
    from reconciler.control.resets import Positions, compute_reset
    from reconciler.model import Position
    from reconciler.table.catalogs import fence

    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    tables = ctx.tables()
    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")  # no table yet
    start = store.checkpoints("clicks")["0"]
    assert head.snapshot_id is None and start == 0

    # the reset (Applier._reset's order): fence, roll forward, capture, one transaction
    # no table yet: the fence creates it, so the first batch finds a tag where it read none
    assert fence.fence(tables, store, "clicks", "clicks", rec.epoch + 1, new_write_id()).snapshot_id is not None
    pos = Positions(earliest={"0": 0}, latest={"0": 100})
    req = ResetRequest("clicks", "review-token-1", "cli", "review", Position("latest"), backfill=True)
    result = store.apply_reset(req, lambda cp: compute_reset(req.position, cp, pos, backfill=True),
                               initial={"0": 0}, earliest={"0": 0}, actor="test")
    backfill = result.backfill_id
    assert backfill and store.checkpoints("clicks") == {"0": 100}

    # the main's first batch goes on: ensure creates the table, the batch commits
    _ensure(tables)
    ranges = [PartitionRange("0", start, start + 5)]
    written = _batch(tables, store, "clicks", start, start + 5, key="k")
    try:
        ctx.publisher().publish(rec, DS(), written, _summary(rec, written, ranges), [], SCHEMA, DEAD, ranges, 5,
                                head=head)
    except Exception:  # noqa: BLE001 - a PublishConflict is the right outcome; the table decides
        pass

    # the backfill reads its range [0, 100)
    brec = store.get(backfill)
    bstart = store.checkpoints(backfill)["0"]
    bhead = ctx.publisher().prepare(brec, "clicks")
    end = dict(brec.end_offsets)["0"]
    branges = [PartitionRange("0", bstart, end)]
    bw = _batch(tables, store, backfill, bstart, end, key="k")
    ctx.publisher().publish(brec, DS(), bw, _summary(brec, bw, branges), [], SCHEMA, DEAD, branges, end - bstart,
                            head=bhead)

    ids = _ids(glue)
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert twice == [], f"offsets in the table twice (the main's first batch and the backfill): {twice}"


def test_a_rejected_reset_leaves_its_fence_and_the_main_waits_forever(env):
    """``Applier._reset`` fences the table first, then captures and runs the reset's
    transaction, whose checks can refuse the request: here a rewind to earliest without
    ``allowRewind`` (also: offsets outside the valid range, a missing topic, a policy's stale
    epoch). The request is rejected (recorded, a marker renamed ``rejected``), so nobody applies
    it again and the epoch is never bumped; but the fence snapshot stays, with
    ``fence-epoch`` = epoch + 1, and every step of the main then waits on ``ResetUnderway``:
    a refused request stops ingestion for good. With ``catalog: sql`` a rejected reset
    changes nothing."""
    from reconciler.control.apply import Applier
    from reconciler.control.plan import Action, ActionKind
    from reconciler.control.requests import ResetRequest
    from reconciler.control.resets import Positions
    from reconciler.model import Position
    from reconciler.runtime.publishing import ResetUnderway

    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())
    Step(ctx, store).publish()  # [0, 5)

    def capture(spec, position, now):  # the broker's positions (the broker is not under test)
        return Positions(earliest={"0": 0}, latest={"0": 100}), {"0": 0}

    applier = Applier(store, warehouse=warehouse, catalog=glue["setting"], capture=capture)
    req = ResetRequest("clicks", "review-rewind-1", "stanza", "review", Position("earliest"), backfill=False)
    [result] = applier.apply([Action(ActionKind.RESET, "clicks", "review", request=req)])
    assert not result.ok and "allowRewind" in result.message  # refused, as it should be
    assert store.checkpoints("clicks") == {"0": 5}

    try:
        Step(ctx, store).publish()  # the main's next step: [5, 10)
    except ResetUnderway as exc:
        pytest.fail(f"the rejected reset's fence holds the main supervisor: {exc}")
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(10))
