"""Marker files and ``backfill:`` stanzas: each request is applied once, whatever happens.

A consumed marker is renamed ``.applied`` with its result appended as YAML comments;
an invalid one ``.rejected`` with the reason, changing nothing; one that cannot be
renamed is still applied once. A stanza is applied once per request id; removing it
changes nothing, a new id resets again. Real Tansu, real Spark, real database; every
test that ingests counts the committed rows by key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

import devservices
from reconciler.spec import markerfiles
from reconciler.store.engine import create_engine
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

# Tables a rejected request may not touch (``requests`` and ``audit_log`` record the rejection).
STATE_TABLES = ("supervisors", "checkpoints", "batches", "segments", "spec_versions")


def daemon(settings, timeout: float = 120.0) -> None:
    code, _ = h.run_daemon(settings, timeout=timeout)
    assert code == 0, "the daemon did not catch up in time"


def produce(broker, name: str, start: int, n: int) -> dict[int, int]:
    return devservices.produce_kafka(broker.bootstrap, name, devservices.make_records(n, start=start))


def key_range(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def dump(url: str, tables=STATE_TABLES) -> dict[str, list]:
    engine = create_engine(url)
    md = sa.MetaData()
    md.reflect(engine, only=list(tables))
    try:
        with engine.connect() as c:
            return {t: sorted(repr(tuple(r)) for r in c.execute(sa.select(md.tables[t]))) for t in tables}
    finally:
        engine.dispose()


def requests_rows(url: str) -> list[dict]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return [dict(r) for r in c.execute(sa.text("SELECT token, supervisor_id, kind, status, result FROM requests"
                                                       " ORDER BY handled_at, token")).mappings()]
    finally:
        engine.dispose()


def resets(store: Store, sid: str) -> list[dict]:
    return [e for e in store.history(sid) if e["action"] in ("reset", "reset-and-backfill")]


def backfills(store: Store, parent: str) -> list[str]:
    return sorted(sid for sid, r in store.read_actual().supervisors.items() if r.parent_id == parent)


def comments(path: Path) -> dict:
    """The YAML appended as comments to a retired marker (after its ``# <status> at`` line)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# applied at") or line.startswith("# rejected at"))
    return yaml.safe_load("\n".join(line[2:] for line in lines[start + 1:]))


@pytest.fixture
def ingested(spark, kafka_broker, topic, tmp_path, db_url):
    """A supervisor 'clicks' on a fresh 2-partition topic, 1000 records ingested, daemon stopped."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, db_url)
    doc = h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_count=2)
    h.write_spec(s.specs, doc)
    produce(kafka_broker, name, 0, 1000)
    daemon(s)
    store = Store(s.db_url)
    yield s, store, name, doc
    store.close()


def test_marker_is_applied_once_and_retired_with_its_result(spark, kafka_broker, ingested):
    s, store, name, _ = ingested
    specs = Path(s.specs)
    cp = store.checkpoints("clicks")
    ends = produce(kafka_broker, name, 1000, 2000)
    body = "resetTo: latest\nbackfill: true\nbackfillTaskCount: 2\nreason: lag alarm INC-42\n"
    (specs / "clicks.reset.yaml").write_text(body)
    daemon(s)

    applied = specs / "clicks.reset.yaml.applied"
    assert not (specs / "clicks.reset.yaml").exists() and applied.exists()
    text = applied.read_text()
    assert text.startswith(body)  # the request as written, then the result as comments
    result = comments(applied)
    assert result["backfill"] == "clicks-backfill-1" and result["backfillRecords"] == 2000
    assert {p["partition"]: (p["checkpoint"], p["new"]) for p in result["partitions"]} == {
        str(p): (cp[str(p)], e) for p, e in ends.items()}
    assert yaml.safe_load(text) == yaml.safe_load(body)  # still valid YAML: the comments are comments

    # The same bytes dropped again are a new incident (issue 10 item 8): a second reset, once.
    (specs / "clicks.reset.yaml").write_text(body)
    produce(kafka_broker, name, 3000, 500)
    daemon(s)
    assert not (specs / "clicks.reset.yaml").exists()
    again = [p for p in specs.iterdir() if p.name.startswith("clicks.reset.yaml.") and p != applied]
    assert len(again) == 1 and again[0].name.endswith(".applied")
    assert comments(again[0])["backfill"] == "clicks-backfill-2"
    code, out = h.run_cli(s, "apply")
    assert code == 0 and "No changes." in out
    assert len(resets(store, "clicks")) == 2
    assert backfills(store, "clicks") == ["clicks-backfill-1", "clicks-backfill-2"]
    rows = [r for r in requests_rows(s.db_url) if r["kind"] == "marker"]
    assert [r["status"] for r in rows] == ["applied", "applied"]
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 3500))
    assert store.get("clicks-backfill-1").spec.task_count == 2


def test_invalid_markers_are_rejected_and_change_nothing(spark, kafka_broker, ingested):
    s, store, name, _ = ingested
    specs = Path(s.specs)
    ends = produce(kafka_broker, name, 1000, 1000)
    before = dump(s.db_url)
    cases = [
        ("clicks", "resetTo: [latest\n", "malformed YAML"),  # not YAML
        ("clicks", "resetTo: latest\nbackfil: true\n", "backfil"),  # a typo is an error, not ignored
        ("ghost", "resetTo: latest\n", "unknown supervisor 'ghost'"),
        ("clicks", 'resetTo: {offsets: {"0": 999999}}\n', f"outside the valid range [0, {ends[0]}]"),
        ("clicks", 'resetTo: {offsets: {"7": 5}}\n', "unknown partition(s) 7"),
        ("clicks", "resetTo: earliest\n", "allowRewind"),  # a rewind must be asked for
    ]
    for sid, body, why in cases:
        seen = {p.name for p in specs.iterdir()}
        marker = specs / f"{sid}.reset.yaml"
        marker.write_text(body)
        code, out = h.run_cli(s, "apply")
        assert code == 1, out
        assert not marker.exists()
        [new] = [p for p in specs.iterdir() if p.name not in seen]  # earlier rejections keep their files
        assert new.name.startswith(f"{sid}.reset.yaml.") and new.name.endswith(".rejected")
        rejected = new
        assert rejected.read_text().startswith(body)
        reason = comments(rejected)["reason"]
        assert why in reason, reason
        assert dump(s.db_url) == before, f"{body!r} changed the state"
    assert len([p for p in specs.iterdir() if p.name.endswith(".rejected")]) == len(cases)
    rows = requests_rows(s.db_url)
    assert len(rows) == len(cases) and {r["status"] for r in rows} == {"rejected"}
    assert any(e["action"] == "reject-request" for e in store.history("ghost"))

    # A valid marker afterwards is applied as usual.
    (specs / "clicks.reset.yaml").write_text("reason: after the typos\n")
    daemon(s)
    assert (specs / "clicks.reset.yaml.applied").exists()
    assert backfills(store, "clicks") == ["clicks-backfill-1"]
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 2000))


def test_marker_that_cannot_be_renamed_is_still_applied_once(spark, kafka_broker, ingested, monkeypatch):
    s, store, name, _ = ingested
    specs = Path(s.specs)
    produce(kafka_broker, name, 1000, 1500)
    marker = specs / "clicks.reset.yaml"
    marker.write_text("reason: rename blocked\n")
    # The retirement writes a temporary file beside the marker first: refused, as in a read-only
    # checkout (the tests run as root, whom permissions would not stop).
    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(markerfiles, "_write_new", read_only)
    daemon(s)
    assert marker.exists() and not (specs / "clicks.reset.yaml.applied").exists()
    for _ in range(2):  # more passes and another daemon run: still one reset
        code, out = h.run_cli(s, "apply")
        assert code == 0 and "retire-marker" in out and "could not rename" in out
    produce(kafka_broker, name, 2500, 500)
    daemon(s)
    assert marker.exists()
    assert len(resets(store, "clicks")) == 1 and backfills(store, "clicks") == ["clicks-backfill-1"]
    assert [r["status"] for r in requests_rows(s.db_url)] == ["applied"]

    monkeypatch.undo()
    code, out = h.run_cli(s, "apply")
    assert code == 0 and "renamed to" in out
    assert not marker.exists() and (specs / "clicks.reset.yaml.applied").exists()
    assert comments(specs / "clicks.reset.yaml.applied")["note"] == "already handled"
    assert len(resets(store, "clicks")) == 1
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 3000))


def test_stanza_is_applied_once_per_request_id(spark, kafka_broker, ingested):
    s, store, name, doc = ingested
    produce(kafka_broker, name, 1000, 1000)
    h.write_spec(s.specs, doc | {"backfill": {"request": "r1", "reason": "first"}})
    daemon(s)
    assert backfills(store, "clicks") == ["clicks-backfill-1"]
    assert store.get("clicks").last_request == "r1"
    epoch = store.get("clicks").epoch

    # Restarting, editing other fields, and removing the stanza: no new reset.
    produce(kafka_broker, name, 2000, 300)
    daemon(s)
    h.write_spec(s.specs, doc | {"taskDuration": "700ms", "backfill": {"request": "r1", "reason": "first"}})
    daemon(s)
    h.write_spec(s.specs, doc)
    produce(kafka_broker, name, 2300, 300)
    daemon(s)
    code, out = h.run_cli(s, "apply")
    assert code == 0 and "No changes." in out
    assert len(resets(store, "clicks")) == 1 and store.get("clicks").epoch == epoch
    assert backfills(store, "clicks") == ["clicks-backfill-1"]

    # A new request id is a new reset.
    produce(kafka_broker, name, 2600, 700)
    h.write_spec(s.specs, doc | {"backfill": {"request": "r2", "reason": "second", "taskCount": 1}})
    daemon(s)
    assert backfills(store, "clicks") == ["clicks-backfill-1", "clicks-backfill-2"]
    assert [e["trigger"] for e in resets(store, "clicks")] == ["stanza: r1", "stanza: r2"]
    assert store.get("clicks-backfill-2").spec.task_count == 1
    assert str(store.get("clicks-backfill-2").state) == "COMPLETED"
    assert store.get("clicks").last_request == "r2"
    status = h.cli_json(s, "status", "clicks")["supervisors"][0]
    assert status["lastRequest"] == "r2"
    counts = h.key_counts(spark, s, "clicks")
    h.assert_exactly_once(counts, key_range(0, 3300))
    by_sup = {}
    for seg in store.segments("clicks"):
        by_sup[seg["supervisor_id"]] = by_sup.get(seg["supervisor_id"], 0) + seg["rows"]
    assert by_sup["clicks-backfill-1"] == 1000 and by_sup["clicks-backfill-2"] == 700
    json.dumps(status)  # status is plain JSON


def test_same_marker_text_dropped_again_is_a_new_request(spark, kafka_broker, ingested):
    """Issue 10 item 8: the same bytes dropped again for a new incident are a new request
    (one request per appearance of the file), and each reset is backfilled exactly once."""
    s, store, name, _ = ingested
    specs = Path(s.specs)
    body = "resetTo: latest\nreason: lag alarm\n"
    produce(kafka_broker, name, 1000, 1000)
    (specs / "clicks.reset.yaml").write_text(body)
    daemon(s)
    assert (specs / "clicks.reset.yaml.applied").exists() and not (specs / "clicks.reset.yaml").exists()

    produce(kafka_broker, name, 2000, 1000)
    (specs / "clicks.reset.yaml").write_text(body)  # the same text, the next incident
    daemon(s)
    assert not (specs / "clicks.reset.yaml").exists()
    assert len(resets(store, "clicks")) == 2
    # Each daemon's runtimes wait for its first pass, which applies the marker: no batch reads
    # the 1,000 new records first, so both resets skip them and each has its own backfill.
    assert backfills(store, "clicks") == ["clicks-backfill-1", "clicks-backfill-2"]
    assert [r["status"] for r in requests_rows(s.db_url)] == ["applied", "applied"]
    assert all(store.get(b).state == "COMPLETED" for b in backfills(store, "clicks"))
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), key_range(0, 3000))
