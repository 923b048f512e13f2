"""Reset and backfill on Kafka, end to end: real Tansu broker, real Spark, real database.

Each test ingests, lets the main supervisor fall behind (the daemon is stopped, or the
supervisor is SUSPENDED), asks for a reset through one of the three triggers (CLI,
``backfill:`` stanza, marker file) and runs the in-process daemon until everything is
caught up. The committed segments are then read back and counted by key: every key
exactly once (or, for a deliberate skip or rewind, exactly the multiset the plan
announced).
"""

from __future__ import annotations

import collections
import getpass
import json
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

import devservices
from reconciler.cli import cli
from reconciler.daemon import Daemon
from reconciler.observe.status import all_status
from reconciler.store.engine import create_engine
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

TS0 = devservices.DEFAULT_TS_START_MS


# --------------------------------------------------------------------------- local helpers


def daemon(settings, timeout: float = 120.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


def cli_out(settings, *args: str, code: int = 0) -> str:
    got, out = h.run_cli(settings, *args)
    assert got == code, f"reconciler {' '.join(args)} exited {got}, not {code}:\n{out}"
    return out


def cli_error(settings, *args: str) -> str:
    """A command that must fail: its exit code is 1, and its message (stderr) is returned."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        res = CliRunner().invoke(cli, list(args), env=h.settings_env(settings), catch_exceptions=False)
    finally:
        root.handlers[:], root.level = handlers, level
    assert res.exit_code == 1, res.output
    return res.stderr


def once(spark, settings, datasource: str, expected_keys) -> None:
    h.assert_exactly_once(h.key_counts(spark, settings, datasource), expected_keys)


def dump_db(url: str) -> dict[str, list]:
    """Every row of every table (for 'changes nothing' comparisons)."""
    engine = create_engine(url)
    md = sa.MetaData()
    md.reflect(engine)
    try:
        with engine.connect() as c:
            return {t.name: sorted(repr(tuple(r)) for r in c.execute(sa.select(t))) for t in md.sorted_tables}
    finally:
        engine.dispose()


def key_range(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def produce(broker, name: str, start: int, n: int, *, ts_ms: int | None = None, step_ms: int = 1000) -> dict[int, int]:
    """Records ``start..start+n``; with ``ts_ms`` the Kafka timestamp is the event time too."""
    recs = devservices.make_records(n, start=start, ts_start_ms=ts_ms if ts_ms is not None else TS0 + start * 1000,
                                    step_ms=step_ms)
    if ts_ms is not None:
        recs = [(k, v, json.loads(v)["ts"]) for k, v in recs]
    return devservices.produce_kafka(broker.bootstrap, name, recs)


def rows_by_supervisor(store: Store, datasource: str) -> dict[str, int]:
    out: dict[str, int] = collections.Counter()
    for seg in store.segments(datasource):
        out[seg["supervisor_id"]] += seg["rows"]
    return dict(out)


def source(broker, name: str) -> dict:
    return h.kafka_source(broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10})


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("trigger", ["cli", "stanza", "marker"])
def test_fall_behind_then_reset_to_latest_with_backfill(spark, kafka_broker, topic, tmp_path, db_url, trigger):
    name = topic(partitions=3)
    s = h.make_settings(tmp_path, db_url)
    specs = Path(s.specs)
    doc = h.spec_doc("clicks", source(kafka_broker, name), task_count=2)
    h.write_spec(specs, doc)
    produce(kafka_broker, name, 0, 3000)
    daemon(s)
    store = Store(s.db_url)
    try:
        before = store.checkpoints("clicks")
        assert sum(before.values()) == 3000

        # The daemon is down: the main supervisor falls 5000 records behind.
        ends = produce(kafka_broker, name, 3000, 5000)
        if trigger == "cli":
            out = cli_out(s, "reset", "clicks", "--to", "latest", "--backfill", "--reason", "lag INC-1", "-o", "json")
            assert json.loads(out)["backfill"] == "clicks-backfill-1"
        elif trigger == "stanza":
            h.write_spec(specs, doc | {"backfill": {"request": "inc-1", "resetTo": "latest", "taskCount": 1,
                                                  "reason": "lag INC-1"}})
        else:
            (specs / "clicks.reset.yaml").write_text("resetTo: latest\nbackfill: true\nreason: lag INC-1\n")
        with h.TableWatcher(s, "clicks") as watcher:  # a reader scanning the table all along
            daemon(s)  # applies stanza/marker in its first tick, ingests the backfill
            final = produce(kafka_broker, name, 8000, 1000)
            daemon(s)

        once(spark, s, "clicks", key_range(0, 9000))
        watcher.check()  # every batch appeared whole, none in part, nothing uncommitted
        assert len(watcher.states) > 2
        # from the table alone: main and backfill tile every offset, each row once
        report = h.cli_json(s, "verify", "clicks", "--deep")
        assert report["ok"] and report["findings"] == []
        assert {(c["partition"], c["start"], c["end"]) for c in report["coverage"]} == {
            (str(p), 0, e) for p, e in final.items()}
        assert report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 9000
        rec = store.get("clicks-backfill-1")
        assert rec is not None and str(rec.state) == "COMPLETED"
        assert rec.start_offsets == {p: o for p, o in before.items() if o < ends[int(p)]}
        assert rec.end_offsets == {str(p): e for p, e in ends.items()}
        assert store.get("clicks-backfill-2") is None
        # The skipped range was ingested by the backfill, not by the main supervisor.
        by_sup = rows_by_supervisor(store, "clicks")
        assert by_sup == {"clicks": 4000, "clicks-backfill-1": 5000}

        # history: the reset with its trigger, reason, offsets and backfill id
        hist = json.loads(cli_out(s, "history", "clicks", "-o", "json"))
        resets = [e for e in hist if e["action"] == "reset-and-backfill"]
        assert len(resets) == 1
        r = resets[0]
        assert r["reason"] == "lag INC-1"
        want_trigger = {"cli": "cli: ", "stanza": "stanza: inc-1", "marker": "marker: "}[trigger]
        assert r["trigger"].startswith(want_trigger)
        if trigger == "marker":
            assert r["trigger"].endswith("clicks.reset.yaml")
        if trigger == "cli":
            assert r["trigger"].startswith(f"cli: {getpass.getuser()} (operation ")
        parts = {p["partition"]: p for p in r["details"]["partitions"]}
        assert {p: (x["checkpoint"], x["new"], x["backfill"]) for p, x in parts.items()} == {
            p: (before[p], ends[int(p)], ends[int(p)] - before[p]) for p in before}
        assert r["details"]["backfill"] == "clicks-backfill-1"
        text = cli_out(s, "history", "clicks")
        assert "reset-and-backfill" in text and "backfill supervisor: clicks-backfill-1 (5000 records)" in text

        # status: backfill progress done/total, a rate, and COMPLETED
        st = json.loads(cli_out(s, "status", "clicks-backfill-1", "-o", "json"))["supervisors"][0]
        assert st["state"] == "COMPLETED" and st["parent"] == "clicks"
        assert st["backfill"]["done"] == st["backfill"]["total"] == 5000
        assert st["backfill"]["complete"] is True and st["backfill"]["ratePerSecond"] > 0
        line = next(x for x in cli_out(s, "status", "clicks-backfill-1").splitlines() if x.startswith("clicks-backfill-1"))
        assert "COMPLETED" in line and "5000/5000" in line and "/s" in line

        # the generated bounded spec: in the state directory, never in the watched one
        rendered = Path(s.state_dir) / "backfills" / "clicks-backfill-1.yaml"
        assert rendered.exists()
        gen = yaml.safe_load(rendered.read_text())
        assert gen["id"] == "clicks-backfill-1" and gen["generated"]["parent"] == "clicks"
        assert not any("backfill-1" in p.name for p in specs.iterdir())
        if trigger == "marker":
            assert not (specs / "clicks.reset.yaml").exists()
            assert (specs / "clicks.reset.yaml.applied").exists()
    finally:
        store.close()


def test_reset_on_suspended_supervisor(spark, kafka_broker, topic, tmp_path, db_url):
    """A SUSPENDED main supervisor can be reset: the backfill runs, the main stays suspended."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, db_url)
    specs = Path(s.specs)
    doc = h.spec_doc("views", source(kafka_broker, name), max_batch_records=1000)
    h.write_spec(specs, doc)
    produce(kafka_broker, name, 0, 2000)
    daemon(s)
    h.write_spec(specs, doc | {"suspended": True})
    daemon(s)
    store = Store(s.db_url)
    try:
        assert str(store.get("views").state) == "SUSPENDED"
        before, epoch = store.checkpoints("views"), store.get("views").epoch
        ends = produce(kafka_broker, name, 2000, 3000)
        out = json.loads(cli_out(s, "reset", "views", "--to", "latest", "--backfill-task-count", "1", "-o", "json"))
        assert out["backfill"] == "views-backfill-1" and out["backfillRecords"] == 3000
        main = store.get("views")
        assert str(main.state) == "SUSPENDED" and main.epoch == epoch + 1
        assert store.checkpoints("views") == {str(p): e for p, e in ends.items()}
        assert store.get("views-backfill-1").spec.task_count == 1
        pending = all_status(store, "views-backfill-1", with_latest=False)[0]
        assert pending["state"] == "PENDING" and pending["backfill"]["done"] == 0
        assert pending["backfill"]["total"] == 3000 and pending["backfill"]["etaSeconds"] is None

        # The backfill runs although its parent is suspended (3 batches of maxBatchRecords 1000);
        # status while it runs: records done/total, a rate and an ETA.
        result: dict = {}
        d = Daemon(s)  # in a thread: it installs no signal handlers there
        t = threading.Thread(target=lambda: result.update(code=d.run(until_caught_up=True, timeout=120)))
        t.start()
        seen = None
        while t.is_alive():
            b = all_status(store, "views-backfill-1", with_latest=False)[0]["backfill"]
            if 0 < b["done"] < b["total"]:
                seen = b
            time.sleep(0.02)
        t.join()
        assert result["code"] == 0
        assert seen is not None, "never saw the backfill half way"
        assert seen["ratePerSecond"] > 0 and seen["etaSeconds"] > 0 and not seen["complete"]
        assert seen["done"] % 1000 == 0  # whole batches only: progress is the committed checkpoint
        assert str(store.get("views-backfill-1").state) == "COMPLETED"
        assert str(store.get("views").state) == "SUSPENDED"
        assert rows_by_supervisor(store, "views") == {"views": 2000, "views-backfill-1": 3000}
        assert store.checkpoints("views-backfill-1") == {str(p): e for p, e in ends.items() if e > before[str(p)]}

        h.write_spec(specs, doc)  # resume; the main continues from the reset checkpoint
        produce(kafka_broker, name, 5000, 1000)
        daemon(s)
        once(spark, s, "views", key_range(0, 6000))
        assert rows_by_supervisor(store, "views") == {"views": 3000, "views-backfill-1": 3000}
    finally:
        store.close()


def _count_before(records_ts: list[tuple[int, int]], partition: int, limit_ms: float) -> int:
    return sum(1 for p, ts in records_ts if p == partition and ts < limit_ms)


@pytest.mark.parametrize("position", ["timestamp", "relative", "offsets", "shift"])
def test_forward_reset_to_position_with_backfill(spark, kafka_broker, topic, tmp_path, position):
    """Forward jumps to a timestamp, a relative time, explicit offsets and a shift, each with a backfill."""
    import zlib

    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    h.write_spec(Path(s.specs), h.spec_doc("pos", source(kafka_broker, name)))
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    base = now_ms - 3 * 3600_000 if position == "relative" else TS0
    step = 3000  # ms between records: 3000 records span 2.5 h

    def ts_of(i: int) -> int:
        return base + i * step

    produce(kafka_broker, name, 0, 1000, ts_ms=ts_of(0), step_ms=step)
    daemon(s)
    store = Store(s.db_url)
    try:
        cp = store.checkpoints("pos")
        ends = produce(kafka_broker, name, 1000, 2000, ts_ms=ts_of(1000), step_ms=step)
        part_ts = [(zlib.crc32(k.encode()) % 2, ts_of(i)) for i, k in enumerate(key_range(0, 3000))]
        if position == "timestamp":
            t = ts_of(1700)
            to = datetime.fromtimestamp(t / 1000, UTC).isoformat().replace("+00:00", "Z")
            expected = {str(p): _count_before(part_ts, p, t) for p in (0, 1)}
        elif position == "relative":
            to = "-2h"
            t_lo = datetime.now(UTC).timestamp() * 1000 - 2 * 3600_000
        elif position == "offsets":
            expected = {"0": cp["0"] + 300, "1": cp["1"] + 500}
            to = json.dumps(expected)
        else:
            expected = {p: c + 400 for p, c in cp.items()}
            to = json.dumps({"shiftBy": 400})
        out = json.loads(cli_out(s, "reset", "pos", "--to", to, "--reason", f"to {position}", "-o", "json"))
        new = {p["partition"]: p["new"] for p in out["partitions"]}
        if position == "relative":
            t_hi = datetime.now(UTC).timestamp() * 1000 - 2 * 3600_000
            for p in (0, 1):
                assert _count_before(part_ts, p, t_lo) <= new[str(p)] <= _count_before(part_ts, p, t_hi)
            expected = new
        assert new == expected
        assert all(cp[p] < new[p] < ends[int(p)] for p in new), (cp, new, ends)
        assert out["backfillRecords"] == sum(new[p] - cp[p] for p in new)
        bf = store.get("pos-backfill-1")
        assert bf.start_offsets == cp and bf.end_offsets == new
        produce(kafka_broker, name, 3000, 500, ts_ms=ts_of(3000), step_ms=step)
        daemon(s)
        once(spark, s, "pos", key_range(0, 3500))
        assert str(store.get("pos-backfill-1").state) == "COMPLETED"
        assert rows_by_supervisor(store, "pos")["pos-backfill-1"] == out["backfillRecords"]
    finally:
        store.close()


def test_reset_to_earliest_before_the_first_batch(spark, kafka_broker, topic, tmp_path):
    """startFrom: latest, but before anything ran the operator asks for everything: earliest."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    specs = Path(s.specs)
    doc = h.spec_doc("early", source(kafka_broker, name), start_from="latest", suspended=True)
    h.write_spec(specs, doc)
    ends = produce(kafka_broker, name, 0, 1500)
    daemon(s)  # creates it, SUSPENDED, without a checkpoint
    store = Store(s.db_url)
    try:
        assert store.checkpoints("early") == {}
        # Moving back from where startFrom would begin is a rewind: refused unless asked for.
        dump = dump_db(s.db_url)
        err = cli_error(s, "reset", "early", "--to", "earliest")
        assert "would read" in err and "--allow-rewind" in err
        assert dump_db(s.db_url) == dump and store.checkpoints("early") == {}
        out = json.loads(cli_out(s, "reset", "early", "--to", "earliest", "--allow-rewind", "-o", "json"))
        assert {p["partition"]: (p["checkpoint"], p["new"]) for p in out["partitions"]} == {
            str(p): (e, 0) for p, e in ends.items()}
        assert out["backfill"] is None
        assert any("1500 records will be read again" in w for w in out["warnings"])
        h.write_spec(specs, doc | {"suspended": False})
        produce(kafka_broker, name, 1500, 500)
        daemon(s)
        once(spark, s, "early", key_range(0, 2000))
    finally:
        store.close()


def test_skip_and_rewind_do_exactly_what_the_plan_announced(spark, kafka_broker, topic, tmp_path):
    """--no-backfill skips exactly the announced records; --allow-rewind reads exactly the announced ones again."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path)
    h.write_spec(Path(s.specs), h.spec_doc("skip", source(kafka_broker, name)))
    produce(kafka_broker, name, 0, 1000)
    daemon(s)
    store = Store(s.db_url)
    try:
        produce(kafka_broker, name, 1000, 1200)
        out = json.loads(cli_out(s, "reset", "skip", "--to", "latest", "--no-backfill", "-o", "json"))
        assert out["backfill"] is None
        assert "no backfill: 1200 records will be skipped" in out["warnings"]
        assert sum(p["skipped"] for p in out["partitions"]) == 1200
        produce(kafka_broker, name, 2200, 300)
        daemon(s)
        got = h.key_counts(spark, s, "skip")
        assert got == collections.Counter(key_range(0, 1000) + key_range(2200, 300))  # the skipped 1200, nothing else

        # A rewind without --allow-rewind is refused and changes nothing.
        dump = dump_db(s.db_url)
        err = cli_error(s, "reset", "skip", "--to", "earliest")
        assert "moving the checkpoint back" in err and "--allow-rewind" in err
        assert dump_db(s.db_url) == dump

        out = json.loads(cli_out(s, "reset", "skip", "--to", "earliest", "--allow-rewind", "-o", "json"))
        assert "rewind: 2500 records will be read again (duplicates by request)" in out["warnings"]
        daemon(s)
        got = h.key_counts(spark, s, "skip")
        want = collections.Counter(key_range(0, 2500)) + collections.Counter(key_range(0, 1000) + key_range(2200, 300))
        assert got == want  # read again: exactly the 1300 ingested before; the skipped 1200 now once
    finally:
        store.close()


def test_plan_and_dry_run_change_nothing(spark, kafka_broker, topic, tmp_path, db_url):
    """`plan` and `reset --dry-run` preview per partition and leave every table and file untouched."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, db_url)
    specs = Path(s.specs)
    doc = h.spec_doc("dry", source(kafka_broker, name))
    h.write_spec(specs, doc)
    produce(kafka_broker, name, 0, 1000)
    daemon(s)
    store = Store(s.db_url)
    try:
        cp = store.checkpoints("dry")
        ends = produce(kafka_broker, name, 1000, 2000)
        h.write_spec(specs, doc | {"backfill": {"request": "r1", "reason": "catch up"}})
        (specs / "dry.reset.yaml").write_text("resetTo: {shiftBy: 100}\nreason: try\n")
        files = sorted((p.name, p.read_bytes()) for p in specs.iterdir())
        before = dump_db(s.db_url)

        plan = json.loads(cli_out(s, "plan", "-o", "json", code=2))
        kinds = [(a["kind"], a.get("request", {}).get("trigger")) for a in plan["actions"]]
        assert kinds == [("update", None), ("reset-and-backfill", "stanza"), ("reset-and-backfill", "marker")]
        stanza = plan["actions"][1]
        assert {p["partition"]: (p["checkpoint"], p["latest"], p["new"], p["backfill"]) for p in stanza["partitions"]} == {
            str(p): (cp[str(p)], e, e, e - cp[str(p)]) for p, e in ends.items()}
        assert stanza["backfillRecords"] == 2000
        assert [p["new"] for p in plan["actions"][2]["partitions"]] == [cp["0"] + 100, cp["1"] + 100]
        text = cli_out(s, "plan", code=2)
        assert "reset-and-backfill" in text and "checkpoint" in text and "backfill 2000 records" in text

        dry = json.loads(cli_out(s, "reset", "dry", "--to", "latest", "--dry-run", "-o", "json"))
        assert dry["dryRun"] is True and dry["backfillRecords"] == 2000
        assert {p["partition"]: (p["checkpoint"], p["latest"], p["new"]) for p in dry["partitions"]} == {
            str(p): (cp[str(p)], e, e) for p, e in ends.items()}
        text = cli_out(s, "reset", "dry", "--to", "latest", "--no-backfill", "--dry-run")
        assert "nothing changed" in text and "2000 records will be skipped" in text
        bad = json.loads(cli_out(s, "reset", "dry", "--to", '{"0": 999999}', "--dry-run", "-o", "json", code=1))
        assert any(f"outside the valid range [0, {ends[0]}]" in e for e in bad["errors"])
        assert dump_db(s.db_url) == before
        assert sorted((p.name, p.read_bytes()) for p in specs.iterdir()) == files

        # Applying it does what the plan said.
        daemon(s)
        hist = [e for e in store.history("dry") if e["action"] in ("reset-and-backfill", "reset")]
        assert [(e["action"], e["trigger"].split(":")[0]) for e in hist] == [
            ("reset-and-backfill", "stanza"), ("reset", "marker")]  # the marker's reset made no backfill
        assert {p["partition"]: p["new"] for p in hist[0]["details"]["partitions"]} == {
            str(p): e for p, e in ends.items()}
        assert hist[1]["details"]["backfill"] is None  # shift of 100 was clamped to the end: nothing skipped
        once(spark, s, "dry", key_range(0, 3000))
    finally:
        store.close()
