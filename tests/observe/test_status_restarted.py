"""Issue 46 (the newcomer's re-run): a supervisor held UNHEALTHY because its topic was re-created
below its checkpoint showed lag 0 in `status`, its JSON and the status page. Its lag is unknown
(the new records below the checkpoint are not read yet), and every surface says so and why.

The supervisor is made UNHEALTHY by the real runtime step against a stand-in broker (as in
tests/runtime/test_truncation.py); the database is a real SQLite file."""

from __future__ import annotations

import pytest

from reconciler.control.actual import State
from reconciler.model import SupervisorSpec
from reconciler.observe import render, statuspage, supervisorpage
from reconciler.observe import status as status_mod
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime


class Broker:
    """Positions, the topic id and whether an offset is still held; record times for lag in time."""

    def __init__(self, latest, topic_id="A", held=True):
        self.latest_, self.topic_id, self.held = latest, topic_id, held

    def earliest(self):
        return dict.fromkeys(self.latest_, 0)

    def latest(self):
        return dict(self.latest_)

    def identity(self):
        return self.topic_id

    def holds(self, partition, offset):
        return self.held

    def record_times(self, partitions):
        return dict.fromkeys(partitions, 0)

    def close(self):
        pass


def _spec(sid="clicks"):
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}})


def _unhealthy(store, tmp_path, broker, after):
    """``clicks`` ingested to 15 per partition of topic A; then the topic became ``after``."""
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    rt = SupervisorRuntime("clicks", RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker
    rt._run_batch = lambda *a, **k: 0  # noqa: SLF001 - nothing to run: caught up
    rt.step()  # topic A's id recorded
    after(broker)
    rt.step()
    assert store.get("clicks").state == State.UNHEALTHY_SUPERVISOR
    assert "the offsets started again below the checkpoints" in store.get("clicks").runtime_error
    return broker


def _fewer(b):  # re-created with fewer records than the checkpoint: latest - checkpoint was 0
    b.topic_id, b.latest_ = "B", {"0": 10, "1": 10}


def _more(b):  # re-created with more: latest - checkpoint was 5, of 20 new records
    b.topic_id, b.latest_ = "B", {"0": 20, "1": 20}


def _truncated(b):  # a source without ids: found by the record below the checkpoint
    b.held, b.latest_ = False, {"0": 10, "1": 10}


@pytest.mark.parametrize("after", [_fewer, _more], ids=["fewer-records", "more-records"])
def test_status_of_a_source_that_started_over_says_lag_unknown_and_why(store, tmp_path, monkeypatch, after):
    broker = _unhealthy(store, tmp_path, Broker({"0": 15, "1": 15}), after)
    monkeypatch.setattr(status_mod, "adapter_for", lambda source, timeout: broker)
    [item] = status_mod.all_status(store)
    assert item["lag"] is None and item["lagSeconds"] is None, item
    assert [p["lag"] for p in item["partitions"]] == [None, None]
    assert item["lagUnknown"].startswith("unknown: the source started over below the checkpoints")

    text = render.status_text([item], detail=False)
    [row] = [line for line in text.splitlines() if line.startswith("clicks ")]
    assert row.split()[3] == "?", text  # the lag column
    assert "clicks: lag unknown: the source started over below the checkpoints" in text
    detail = render.status_text([item], detail=True)
    assert [line.split()[4] for line in detail.splitlines() if line.startswith(("0 ", "1 "))] == ["?", "?"], detail

    # the page: the lag observer's figure (latest minus checkpoint) must not stand in for it
    observed = {"records": 0, "seconds": 0.0, "partitions": [{"partition": "0", "records": 0, "seconds": 0.0}]}
    cell = statuspage._lag(item, {"0": 0.0, "1": 0.0}, observed)  # noqa: SLF001
    assert ">?</span>" in cell and "started over" in cell
    assert statuspage.lag_time(item, observed) == '<span class=muted>?</span>'
    page = supervisorpage._partitions(item, observed)  # noqa: SLF001
    assert "<td class=num>0</td>" not in page.split("</td>", 2)[-1], page  # neither lag nor lag in time is 0
    assert "started over" in supervisorpage._summary(item, observed)  # noqa: SLF001


def test_a_partition_truncated_below_the_checkpoint_shows_lag_unknown(store, tmp_path, monkeypatch):
    broker = _unhealthy(store, tmp_path, Broker({"0": 15, "1": 15}, topic_id=None), _truncated)
    monkeypatch.setattr(status_mod, "adapter_for", lambda source, timeout: broker)
    [item] = status_mod.all_status(store)
    assert item["lag"] is None
    assert "partition(s) 0, 1: checkpoint above the stream's end" in item["lagUnknown"]


def test_a_healthy_supervisor_keeps_its_lag(store, tmp_path, monkeypatch):
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    monkeypatch.setattr(status_mod, "adapter_for", lambda source, timeout: Broker({"0": 15, "1": 20}))
    [item] = status_mod.all_status(store)
    assert (item["lag"], item["lagUnknown"]) == (5, None)
