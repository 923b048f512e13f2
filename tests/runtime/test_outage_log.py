"""A broker that is down is one WARNING per supervisor per outage, naming the supervisor, and
one line when it works again (issue 46, the newcomer's third look: ``listing partitions of topic
'clicks'...`` twice every ~11 s, once for each of two supervisors, for as long as it was down).

The failures come from the real Kafka client against a loopback port nobody listens on; the
broker that answers again is the stand-in of tests/observe/test_status_restarted.py. The
database is a real SQLite file."""

from __future__ import annotations

import logging

import pytest

import devservices
from reconciler.logs import _TextFormatter
from reconciler.model import SupervisorSpec
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store
from reconciler.streams import adapter_for

LOGGER = "reconciler.runtime.supervisor"


class UpBroker:
    """A broker that answers, caught up at offset 5 on one partition."""

    def earliest(self):
        return {"0": 0}

    def latest(self):
        return {"0": 5}

    def identity(self):
        return "A"

    def holds(self, partition, offset):
        return True

    def record_times(self, partitions):
        return dict.fromkeys(partitions, 0)

    def close(self):
        pass


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    dead = f"127.0.0.1:{devservices.free_port()}"
    for sid in ("clicks", "views"):
        s.create_supervisor(SupervisorSpec.from_document({
            "id": sid, "source": {"type": "kafka", "bootstrapServers": dead, "topic": "clicks"},
            "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}}), None, actor="test")
        s.init_checkpoints(sid, {"0": 5})
    yield s
    s.close()


def _runtime(store, tmp_path, sid):
    return SupervisorRuntime(sid, RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None,
                                                 adapters=lambda source: adapter_for(source, timeout=1.0)))


def _lines(caplog):
    return [(r.levelno, getattr(r, "supervisor", None), r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_a_broker_down_is_one_warning_per_supervisor_per_outage(store, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    runtimes = {sid: _runtime(store, tmp_path, sid) for sid in ("clicks", "views")}
    for _round in range(3):
        for rt in runtimes.values():
            rt.step()
    warnings = [(sid, msg) for level, sid, msg in _lines(caplog) if level == logging.WARNING]
    assert sorted(sid for sid, _ in warnings) == ["clicks", "views"], warnings
    assert all("listing partitions of topic 'clicks'" in msg and "(failure 1," in msg for _, msg in warnings)
    retries = [ln for ln in _lines(caplog) if ln[0] == logging.DEBUG and "listing partitions" in ln[2]]
    assert len(retries) == 4  # the other rounds: still in the log at DEBUG
    text = _TextFormatter(journald=False).format(next(r for r in caplog.records if r.levelno == logging.WARNING))
    assert text.endswith("[supervisor=clicks]"), text

    caplog.clear()
    rt = runtimes["clicks"]
    rt._adapter_for = lambda rec: UpBroker()  # noqa: SLF001 - the broker answers again
    rt.step()
    rt.step()
    ended = [ln for ln in _lines(caplog) if "working again" in ln[2]]
    assert ended == [(logging.INFO, "clicks", ended[0][2])]
    assert "after 3 failed attempts" in ended[0][2] and "cannot reach Kafka" in ended[0][2]

    caplog.clear()
    del rt._adapter_for  # noqa: SLF001 - down again: a new outage, said again
    rt.step()
    rt.step()
    assert [ln[0] for ln in _lines(caplog) if "listing partitions" in ln[2]] == [logging.WARNING, logging.DEBUG]
