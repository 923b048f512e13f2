"""Behind retention (issue 10 item 1): what the broker deleted is reported, never retried forever.

The offset arithmetic of resets is in tests/control/test_resets.py and tests/store/test_store.py
(``test_reset_behind_retention_records_the_loss``). Here the runtime's rule for a checkpoint
that falls behind retention while ingesting: a main supervisor turns UNHEALTHY with the
count and the way out (default) or continues from earliest (``onRetentionLoss: continue``);
a backfill always continues. Database: a real SQLite file. The broker is a stand-in that
answers earliest/latest (Tansu cannot delete records: see RELIABILITY.md); the batch is
recorded, not run, since only the ranges it is handed matter here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.control.actual import State
from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import Position, SupervisorSpec
from reconciler.runtime.supervisor import MAX_BACKOFF, RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store


class Broker:
    def __init__(self, earliest, latest):
        self._earliest, self._latest = earliest, latest

    def earliest(self):
        return dict(self._earliest)

    def latest(self):
        return dict(self._latest)

    def close(self):
        pass


def make_spec(**over) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}, **over})


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    yield s
    s.close()


def runtime(store: Store, sid: str, broker: Broker, tmp_path: Path) -> tuple[SupervisorRuntime, list]:
    ran: list = []
    rt = SupervisorRuntime(sid, RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker
    rt._run_batch = lambda rec, spec, ranges, **_: ran.append([(r.partition, r.start, r.end) for r in ranges]) or 0
    return rt, ran


def test_main_behind_retention_is_unhealthy_with_the_count_and_the_way_out(store, tmp_path):
    store.create_supervisor(make_spec(), None, actor="t")
    store.init_checkpoints("clicks", {"0": 10, "1": 20})
    rt, ran = runtime(store, "clicks", Broker({"0": 40, "1": 0}, {"0": 100, "1": 50}), tmp_path)
    out = rt.step()
    assert ran == [] and out.delay == MAX_BACKOFF
    rec = store.get("clicks")
    assert rec.state == State.UNHEALTHY_SUPERVISOR
    assert rec.runtime_error.startswith("checkpoint behind the broker's retention: 30 records were deleted "
                                        "before they were ingested (0: [10, 40))")
    assert """reconciler reset clicks --to '{"0": 40}'""" in rec.runtime_error
    assert "onRetentionLoss: continue" in rec.runtime_error
    assert store.checkpoints("clicks") == {"0": 10, "1": 20}  # nothing skipped silently

    # the way out it names: a reset to those offsets records the loss and moves on
    pos = Positions(earliest={"0": 40, "1": 0}, latest={"0": 100, "1": 50})
    to = Position("offsets", offsets={"0": 40})
    req = from_cli("clicks", to, operation_id="out")
    res = store.apply_reset(req, lambda cp: compute_reset(to, cp, pos, backfill=True),
                            initial={}, earliest=pos.earliest, actor="t")
    assert (res.outcome.lost_records, res.backfill_id) == (30, None)
    assert store.checkpoints("clicks") == {"0": 40, "1": 20}
    assert store.lost_records("clicks") == 30


def test_main_with_continue_skips_the_deleted_range_and_records_it(store, tmp_path):
    store.create_supervisor(make_spec(onRetentionLoss="continue"), None, actor="t")
    store.init_checkpoints("clicks", {"0": 10, "1": 20})
    rt, ran = runtime(store, "clicks", Broker({"0": 40, "1": 0}, {"0": 100, "1": 50}), tmp_path)
    rt.step()
    assert ran == [[("0", 40, 100), ("1", 20, 50)]]
    [entry] = [e for e in store.history("clicks") if e["action"] == "retention-loss"]
    assert entry["details"] == {"lostRecords": 30, "lostRanges": {"0": [10, 40]}}
    assert store.lost_records("clicks") == 30


def test_backfill_behind_retention_completes_and_records_the_loss(store, tmp_path):
    """Retention moved on between the reset and the backfill: the backfill never retries the
    deleted range, it ingests what is left and completes."""
    store.create_supervisor(make_spec(), None, actor="t")
    store.init_checkpoints("clicks", {"0": 10, "1": 20})
    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})
    res = store.apply_reset(from_cli("clicks", Position("latest"), operation_id="r"),
                            lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True), initial={},
                            earliest=pos.earliest, actor="t")
    bf = res.backfill_id
    rt, ran = runtime(store, bf, Broker({"0": 60, "1": 0}, {"0": 120, "1": 50}), tmp_path)
    rt.step()
    assert ran == [[("0", 60, 100), ("1", 20, 50)]]
    assert store.lost_records(bf) == 50


def test_deleted_range_past_the_backfill_end_loses_only_its_own_range(store, tmp_path):
    store.create_supervisor(make_spec(), None, actor="t")
    store.init_checkpoints("clicks", {"0": 10})
    pos = Positions(earliest={"0": 0}, latest={"0": 100})
    res = store.apply_reset(from_cli("clicks", Position("latest"), operation_id="r"),
                            lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True), initial={},
                            earliest=pos.earliest, actor="t")
    rt, ran = runtime(store, res.backfill_id, Broker({"0": 500}, {"0": 600}), tmp_path)
    rt.step()  # everything of [10, 100) is gone: lost, and the backfill is at its end
    assert store.lost_records(res.backfill_id) == 90
    rt.step()
    assert store.get(res.backfill_id).state == State.COMPLETED
