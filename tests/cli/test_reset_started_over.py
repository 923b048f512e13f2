"""Issue 46 (the newcomer's re-run): after a topic was deleted and re-created below a checkpoint,
`status` advises a rewind (`reset ... --allow-rewind`); its `--dry-run` warned "records will be
read again (duplicates by request)", though the advice says those are new records. The dry run
says what the reset does: the new source's records, read once, in a new source generation
(`clicks@1`); and the reset begins that generation in its own transaction, for a source with ids
and one without alike (without ids the records were read in the old generation, offsets verify
saw twice).

The supervisor is made UNHEALTHY by the real runtime step; the broker is a stand-in answering
positions, the topic id and whether an offset is still held (as in tests/runtime/test_truncation.py;
the real broker's answers: tests/e2e/test_recreated_topic.py). The database is a real SQLite file,
the command line is click's runner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.control import positions
from reconciler.control.actual import State
from reconciler.model import SupervisorSpec
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store
from reconciler.streams import kafka  # noqa: F401 - imported before patching adapter_for

CLEAN_ENV: dict[str, str | None] = {env: None for _, env, _, _ in settings_mod.describe()}
CLEAN_ENV |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None}
REWIND = '{"0": 0, "1": 0}'


class Broker:
    def __init__(self, latest, topic_id):
        self.latest_, self.topic_id, self.held = latest, topic_id, True

    def earliest(self):
        return dict.fromkeys(self.latest_, 0)

    def latest(self):
        return dict(self.latest_)

    def identity(self):
        return self.topic_id

    def holds(self, partition, offset):
        return self.held

    def offsets_for_time(self, ms):
        return self.earliest()

    def close(self):
        pass


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = Store(db)
    store.migrate()
    yield store, db, tmp_path, monkeypatch
    store.close()


def _recreated(world, topic_id):
    """``clicks`` ingested to 15 per partition; the topic re-created with 20 records per
    partition (with ids: A, then B) or truncated to 10 (without ids: the record below the
    checkpoint is gone). The runtime holds it UNHEALTHY with the advice."""
    store, db, tmp_path, monkeypatch = world
    spec = SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}})
    store.create_supervisor(spec, None, actor="t")
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    broker = Broker({"0": 15, "1": 15}, topic_id)
    ran: list = []
    rt = SupervisorRuntime("clicks", RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker
    rt._run_batch = lambda rec, spec, ranges, **_: ran.append([(r.partition, r.start, r.end) for r in ranges]) or 0  # noqa: SLF001
    rt.step()
    if topic_id:
        broker.topic_id, broker.latest_ = "B", {"0": 20, "1": 20}
    else:
        broker.held, broker.latest_ = False, {"0": 10, "1": 10}
    rt.step()
    rec = store.get("clicks")
    assert rec.state == State.UNHEALTHY_SUPERVISOR and f"--to '{REWIND}' --allow-rewind" in rec.runtime_error
    monkeypatch.setattr(positions, "adapter_for", lambda source, **_: broker)  # the reset's capture
    monkeypatch.setattr("reconciler.streams.adapter_for", lambda source, **_: broker)
    return rt, ran, broker


def _cli(db, tmp_path, *args):
    return CliRunner().invoke(cli, ["--specs", str(tmp_path), "--state-dir", str(tmp_path / "state"), "--db", db,
                                    *args], env=CLEAN_ENV, catch_exceptions=False)


@pytest.mark.parametrize("topic_id, end", [("A", 20), (None, 10)], ids=["recreated-with-ids", "truncated-without-ids"])
def test_the_advised_rewind_previews_and_reads_new_records_once_in_a_new_generation(world, topic_id, end):
    store, db, tmp_path, _ = world
    rt, ran, _ = _recreated(world, topic_id)

    dry = _cli(db, tmp_path, "reset", "clicks", "--to", REWIND, "--allow-rewind", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "read again" not in dry.output and "duplicates" not in dry.output, dry.output
    assert (f"the {30} records below the checkpoints are new ones, read once in a new source generation "
            "(clicks@1); nothing is read twice") in dry.output
    assert "new source" in dry.output.splitlines()[0]  # the table's column where reread counted them
    doc = json.loads(_cli(db, tmp_path, "reset", "clicks", "--to", REWIND, "--allow-rewind", "--dry-run",
                          "-o", "json").stdout)
    assert [(p["reread"], p["renewed"]) for p in doc["partitions"]] == [(0, 15), (0, 15)]
    assert doc["startedOver"]
    assert store.get("clicks").generation == 0 and store.checkpoints("clicks") == {"0": 15, "1": 15}  # a dry run

    done = _cli(db, tmp_path, "reset", "clicks", "--to", REWIND, "--allow-rewind", "--reason", "topic re-created")
    assert done.exit_code == 0, done.output
    assert "read again" not in done.output and "new source generation (clicks@1)" in done.output
    rec = store.get("clicks")
    assert (rec.generation, store.checkpoints("clicks")) == (1, {"0": 0, "1": 0})
    history = store.history("clicks")
    [restart] = [h for h in history if h["action"] == "source-restarted"]
    assert restart["details"]["generation"] == 1
    assert [h["action"] for h in history if h["action"].startswith("reset")] == ["reset"]  # no backfill: a rewind

    rt.reconsider()
    rt.step()  # the new generation is begun already: its first step reads (the stand-in publishes nothing)
    assert ran == [[("0", 0, end), ("1", 0, end)]]  # the new records
    assert store.get("clicks").generation == 1  # the runtime began no other generation
    assert store.source_restarts() == {"clicks": 1}


def test_a_rewind_of_a_source_that_did_not_start_over_still_says_read_again(world):
    store, db, tmp_path, monkeypatch = world
    _recreated(world, "A")
    broker = Broker({"0": 20, "1": 20}, "A")  # the same topic after all: nothing started over
    monkeypatch.setattr(positions, "adapter_for", lambda source, **_: broker)
    monkeypatch.setattr("reconciler.streams.adapter_for", lambda source, **_: broker)
    store.set_state("clicks", State.RUNNING, "RUNNING", actor="t", reason="recovered")
    dry = _cli(db, tmp_path, "reset", "clicks", "--to", REWIND, "--allow-rewind", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "rewind: 30 records will be read again (duplicates by request)" in dry.output
    assert "new source" not in dry.output
