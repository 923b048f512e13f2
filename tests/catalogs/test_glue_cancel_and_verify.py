"""Two findings of the explorer's external path (issue 44): ``backfill cancel`` fences the
table before it bumps the backfill's epoch (its batch in flight fails instead of landing in
the range the cancel reports unread), and ``verify`` between a batch's table commit and its
database commit says the batch is pending, not that the table is ahead. Real pyiceberg
GlueCatalog on moto's Glue and S3, the real store; helpers are test_glue_fencing_adversarial.py's."""

from __future__ import annotations

import json

import pytest

from reconciler import faults
from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions
from reconciler.errors import PublishConflict
from reconciler.model import PartitionRange, Position
from tests.catalogs import test_glue_fencing_adversarial as base
from tests.catalogs.test_glue_fencing_adversarial import Step, _batch, _ctx, _ensure, _ids
from tests.e2e import helpers as h

env = base.env  # moto's Glue and S3, the store, supervisor clicks at checkpoint 0


def _cli(tmp_path, monkeypatch, store, warehouse, glue, *args):
    """``reconciler <args>`` on the test's database and Glue catalog, as an operator runs it."""
    monkeypatch.setenv("RECONCILER_CATALOG", json.dumps(glue["setting"]))
    s = h.make_settings(tmp_path, db=store.engine.url.render_as_string(hide_password=False), segments=warehouse,
                        catalog=json.dumps(glue["setting"]))
    return h.run_cli(s, *args)


def _crash_between_commits(step: Step) -> None:
    def crash(name, subject):
        if name == "between-commits":
            raise RuntimeError("killed between the two commits")

    faults.install(crash)
    try:
        with pytest.raises(RuntimeError):
            step.publish()
    finally:
        faults.install(None)


def test_backfill_cancel_fences_the_backfills_batch_in_flight(env, tmp_path, monkeypatch):
    """Without the fence the backfill's batch in flight commits to the table (its tag
    unmoved) after the cancel reported [0, 20) unread, and is rolled forward: the table then
    holds records the audit log says were never read."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())

    def capture(spec, position, now):
        return Positions(earliest={"0": 0}, latest={"0": 20}), {"0": 0}

    req = ResetRequest("clicks", "to-latest", "stanza", "test", Position("latest"))
    [result] = Applier(store, warehouse=warehouse, catalog=glue["setting"], capture=capture).apply(
        [Action(ActionKind.RESET_AND_BACKFILL, "clicks", "test", request=req)])
    assert result.ok, result.message
    backfill = "clicks-backfill-1"
    assert store.checkpoints(backfill) == {"0": 0}
    in_flight = Step(ctx, store, sid=backfill)  # [0, 5): read, written, not committed yet
    code, out = _cli(tmp_path, monkeypatch, store, warehouse, glue, "backfill", "cancel", backfill,
                     "--reason", "not needed")
    assert code == 0, out
    assert "left unread (20 records" in out and "0: [0, 20)" in out
    with pytest.raises(PublishConflict):
        in_flight.publish()
    assert _ids(glue) == []
    assert store.committed_batch_ids([in_flight.written.batch_id]) == set()
    assert store.checkpoints(backfill) == {"0": 0}


def test_verify_between_the_two_commits_says_pending_not_ahead(env, tmp_path, monkeypatch):
    """A batch in the table whose database commit has not happened (a crash, or verify run in
    between): the next step rolls it forward, so verify passes and marks it pending."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())
    Step(ctx, store).publish()  # [0, 5)
    _crash_between_commits(Step(ctx, store))  # [5, 10): in the table, not in the database
    assert store.checkpoints("clicks") == {"0": 5}
    code, out = _cli(tmp_path, monkeypatch, store, warehouse, glue, "verify", "clicks", "-o", "json")
    assert code == 0, out
    [finding] = json.loads(out)["findings"]
    assert finding["kind"] == "ahead" and (finding["start"], finding["end"]) == (5, 10)
    assert finding["pending"] and not finding["fails"]
    assert "recorded by the next step" in finding["explanation"]
    Step(ctx, store).publish()  # the next step rolls it forward, then [10, 15)
    code, out = _cli(tmp_path, monkeypatch, store, warehouse, glue, "verify", "clicks", "-o", "json")
    assert code == 0 and json.loads(out)["findings"] == [], out


def test_verify_fails_a_batch_past_the_checkpoint_that_does_not_start_there(env, tmp_path, monkeypatch):
    """A batch on the supervisor's chain that does not start where the database stopped
    ([7, 10) over a checkpoint at 5) is rolled forward by nobody: still a failure."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())
    Step(ctx, store).publish()  # [0, 5)
    step = Step(ctx, store)
    step.ranges = [PartitionRange("0", 7, 10)]
    step.written = _batch(step.tables, store, "clicks", 7, 10)
    _crash_between_commits(step)
    code, out = _cli(tmp_path, monkeypatch, store, warehouse, glue, "verify", "clicks", "-o", "json")
    assert code == 1, out
    report = json.loads(out)
    ahead = [f for f in report["findings"] if f["kind"] == "ahead"]
    assert [(f["start"], f["end"], f["fails"], f["pending"]) for f in ahead] == [(5, 10, True, False)]


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    faults.install(None)
