"""Every epoch bump fences an external catalog's table (issue 44's review): terminate and a
fresh start as a reset does; a reset refused after its fence lifts it; a supervisor held by
a fence longer than a step says why in its status. Real pyiceberg GlueCatalog on moto's Glue
and S3, the real store; helpers are test_glue_fencing_adversarial.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reconciler import faults
from reconciler.control.actual import DetailedState
from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions
from reconciler.errors import PublishConflict
from reconciler.model import Position
from reconciler.runtime import publish_external
from reconciler.runtime.publishing import ResetUnderway
from reconciler.runtime.supervisor import SupervisorRuntime
from reconciler.table.catalogs import fence
from reconciler.table.writeids import new_write_id
from tests.catalogs import test_glue_fencing_adversarial as base
from tests.catalogs.test_glue_fencing_adversarial import Step, _ctx, _ensure, _ids

env = base.env  # moto's Glue and S3, the store, supervisor clicks at checkpoint 0


@pytest.mark.parametrize("bump", ["terminate", "fresh start"])
def test_an_epoch_bump_fences_the_batch_in_flight(env, bump):
    """Without the fence the batch in flight commits to the table (its tag unmoved), the
    database refuses its epoch, and the publish rolls it forward whatever the epoch: a
    terminated supervisor's checkpoint moves, a fresh start's batch of the old source lands."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())
    Step(ctx, store).publish()  # [0, 5)
    in_flight = Step(ctx, store)  # [5, 10): read, written, not committed yet
    applier = Applier(store, warehouse=warehouse, catalog=glue["setting"])
    if bump == "terminate":
        action = Action(ActionKind.TERMINATE, "clicks", "test")
    else:
        action = Action(ActionKind.UPDATE, "clicks", "test", spec=store.get("clicks").spec,
                        fresh_start="the topic was recreated")
    [result] = applier.apply([action])
    assert result.ok, result.message
    with pytest.raises(PublishConflict):
        in_flight.publish()
    assert _ids(glue) == [f"clicks-{o}" for o in range(5)]
    assert store.committed_batch_ids([in_flight.written.batch_id]) == set()


def test_a_reset_refused_after_its_fence_lifts_it(env):
    """The dry run passes on the database's checkpoint (0: a rewind to earliest moves
    nothing), the fence's roll-forward then records a batch the table held (a crash between
    the two commits: the checkpoint is 5 now), and the reset's transaction refuses the rewind
    it has become. The fence must not stay: the main reads on."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    _ensure(ctx.tables())
    crashed = Step(ctx, store)  # [0, 5): in the table, not in the database

    def crash(name, subject):
        if name == "between-commits":
            raise RuntimeError("killed between the two commits")

    faults.install(crash)
    try:
        with pytest.raises(RuntimeError):
            crashed.publish()
    finally:
        faults.install(None)
    assert store.checkpoints("clicks") == {"0": 0}

    def capture(spec, position, now):
        return Positions(earliest={"0": 0}, latest={"0": 100}), {"0": 0}

    req = ResetRequest("clicks", "rewind-after-roll-forward", "stanza", "test", Position("earliest"))
    [result] = Applier(store, warehouse=warehouse, catalog=glue["setting"], capture=capture).apply(
        [Action(ActionKind.RESET, "clicks", "test", request=req)])
    assert not result.ok and "allowRewind" in result.message
    assert store.checkpoints("clicks") == {"0": 5}
    Step(ctx, store).publish()  # not ResetUnderway: [5, 10)
    assert _ids(glue) == [f"clicks-{o}" for o in range(10)]


def test_a_supervisor_held_by_a_fence_says_why_in_its_status(env, monkeypatch):
    """A reset that fenced the table and crashed before its transaction: the supervisor's
    steps wait; after more than a step its status names the fence and what finishes it."""
    store, warehouse, glue = env
    ctx = _ctx(store, warehouse, glue)
    ctx.adapters = lambda source: SimpleNamespace(close=lambda: None)
    _ensure(ctx.tables())
    rec = store.get("clicks")
    fence.fence(ctx.tables(), store, "clicks", "clicks", rec.epoch + 1, new_write_id())  # then the crash
    runtime = SupervisorRuntime("clicks", ctx)
    runtime.step()
    assert store.get("clicks").runtime_error is None  # a reset finishes within a step: nothing to say yet
    clock = publish_external.time.monotonic() + 3600
    monkeypatch.setattr(publish_external.time, "monotonic", lambda: clock)
    with pytest.raises(ResetUnderway) as held:
        ctx.publisher().prepare(store.get("clicks"), "clicks")
    assert held.value.stalled
    runtime.step()
    now = store.get("clicks")
    assert now.detailed_state == DetailedState.UNHEALTHY_SUPERVISOR
    assert "a reset fenced table clicks" in now.runtime_error and "applied again" in now.runtime_error


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    faults.install(None)
