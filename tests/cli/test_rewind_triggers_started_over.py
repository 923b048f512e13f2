"""Issue 46 (the newcomer's re-run, second half): only the CLI's `reconciler reset` knew that a
source had started over below the checkpoint (a topic deleted and created again, a partition
truncated). The same rewind asked by a marker file (`resetTo:` beside the specs) or by a spec's
`backfill:` stanza, and `plan`'s preview of them, still said "read again (duplicates by request)"
and read the new records in the old source generation. Every trigger now asks the same
question (``runtime.startedover``) and ends the same way: the new records read once, in a new
source generation (`clicks@1`), said in the same words.

The setup is tests/cli/test_reset_started_over.py's: the real runtime step holds `clicks`
UNHEALTHY over a stand-in broker (positions, the topic id, whether an offset is still held);
the database is a real SQLite file; the marker is applied by `reconciler apply` and the stanza
by the daemon's own reconcile pass (``daemon.tick.Tick``)."""

from __future__ import annotations

import json

import pytest
import yaml

from reconciler import settings as settings_mod
from reconciler.control.actual import State
from reconciler.daemon.tick import Tick
from reconciler.observe.metrics import Metrics
from reconciler.store.store import Store
from tests.cli.test_reset_started_over import REWIND, Broker, _cli, _recreated

SPEC = {"id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}
NEW_ONES = ("the 30 records below the checkpoints are new ones, read once in a new source generation (clicks@1); "
            "nothing is read twice")
IDS = ["recreated-with-ids", "truncated-without-ids"]


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = Store(db)
    store.migrate()
    yield store, db, tmp_path, monkeypatch
    store.close()


def _specs(tmp_path, **extra):
    (tmp_path / "clicks.yaml").write_text(yaml.safe_dump(SPEC | extra))


def _began_new_generation(store):
    rec = store.get("clicks")
    assert (rec.generation, store.checkpoints("clicks")) == (1, {"0": 0, "1": 0})
    [restart] = [h for h in store.history("clicks") if h["action"] == "source-restarted"]
    assert restart["details"]["generation"] == 1


@pytest.mark.parametrize("topic_id", ["A", None], ids=IDS)
def test_a_marker_rewind_is_previewed_and_applied_as_new_records_in_a_new_generation(world, topic_id):
    store, db, tmp_path, _ = world
    _recreated(world, topic_id)
    _specs(tmp_path)
    (tmp_path / "clicks.reset.yaml").write_text(f"resetTo:\n  offsets: {REWIND}\nallowRewind: true\nbackfill: false\n")

    planned = _cli(db, tmp_path, "plan")
    assert planned.exit_code == 2, planned.output
    assert "read again" not in planned.output and "duplicates" not in planned.output, planned.output
    assert NEW_ONES in planned.output and "new source" in planned.output, planned.output
    [action] = [a for a in json.loads(_cli(db, tmp_path, "plan", "-o", "json").stdout)["actions"]
                if a["kind"] == "reset"]
    assert [(p["reread"], p["renewed"]) for p in action["partitions"]] == [(0, 15), (0, 15)]
    assert store.get("clicks").generation == 0  # plan changes nothing

    applied = _cli(db, tmp_path, "apply")
    assert applied.exit_code == 0, applied.output
    assert NEW_ONES in applied.output and "read again" not in applied.output, applied.output
    _began_new_generation(store)
    retired = (tmp_path / "clicks.reset.yaml.applied").read_text()
    assert "new source generation (clicks@1)" in retired and "read again" not in retired


class _Leading:
    """The daemon's leadership, held for the whole pass (no runtimes to poke)."""

    manager = None

    def begin_pass(self):
        pass

    def leading_in_pass(self):
        return True


@pytest.mark.parametrize("topic_id", ["A", None], ids=IDS)
def test_a_backfill_stanza_rewind_applied_by_the_daemon_begins_a_new_generation(world, topic_id, caplog):
    store, db, tmp_path, _ = world
    _recreated(world, topic_id)
    _specs(tmp_path, backfill={"request": "inc-46", "resetTo": {"offsets": json.loads(REWIND)}, "allowRewind": True})
    settings = settings_mod.Settings(specs=str(tmp_path), state_dir=str(tmp_path / "state"), db=db)
    tick = Tick(store, lambda: settings, "test-holder", Metrics(), _Leading())

    with caplog.at_level("INFO", logger="reconciler.control.apply"):
        assert tick._reconcile("files", lambda: True) == "changed"  # noqa: SLF001 - the daemon's pass, as its loop runs it
    _began_new_generation(store)
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reset-and-backfill clicks")]
    assert NEW_ONES in said and "read again" not in said
    [reset] = [h for h in store.history("clicks") if h["action"].startswith("reset")]
    assert reset["details"]["partitions"][0]["renewed"] == 15


def test_a_rewind_of_a_source_that_did_not_start_over_still_reads_again(world, monkeypatch):
    """The question is asked, not assumed: the same topic (its id unchanged, the records held)
    is a plain rewind, in the same generation."""
    store, db, tmp_path, _ = world
    _recreated(world, "A")
    broker = Broker({"0": 20, "1": 20}, "A")
    monkeypatch.setattr("reconciler.control.positions.adapter_for", lambda source, **_: broker)
    monkeypatch.setattr("reconciler.streams.adapter_for", lambda source, **_: broker)
    store.set_state("clicks", State.RUNNING, "RUNNING", actor="t", reason="recovered")
    _specs(tmp_path)
    (tmp_path / "clicks.reset.yaml").write_text(f"resetTo:\n  offsets: {REWIND}\nallowRewind: true\nbackfill: false\n")
    assert "rewind: 30 records will be read again" in _cli(db, tmp_path, "plan").output
    assert _cli(db, tmp_path, "apply").exit_code == 0
    assert store.get("clicks").generation == 0 and store.checkpoints("clicks") == {"0": 0, "1": 0}
