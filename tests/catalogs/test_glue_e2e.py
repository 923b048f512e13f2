"""The lake's catalog end to end (issue 44): real Tansu broker, real Spark (local), moto's S3
and Glue (``UpdateTable`` refusing a stale ``VersionId``, devservices/glue.py), the daemon
with ``catalog: {type: glue}``. Every record is read back through pyiceberg's own
``GlueCatalog`` (and DuckDB's ``iceberg_scan`` as a second reader) and counted by key; the
metadata database holds no Iceberg table of its own for the datasource."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyiceberg.catalog.glue import GlueCatalog

import devservices
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

TS0 = devservices.DEFAULT_TS_START_MS


def keys(start: int, n: int) -> list[str]:
    return [f"k{i:06d}" for i in range(start, start + n)]


def produce(broker, name: str, start: int, n: int) -> None:
    devservices.produce_kafka(broker.bootstrap, name, devservices.make_records(
        n, start=start, ts_start_ms=TS0 + start * 1000, step_ms=1000))


def glue_counts(glue, table: str = "clicks") -> collections.Counter:
    catalog = GlueCatalog("reader", **glue["properties"])
    rows = catalog.load_table((glue["database"], table)).scan(selected_fields=("id",)).to_arrow()
    return collections.Counter(rows.column("id").to_pylist())


def duckdb_counts(glue) -> collections.Counter:
    """DuckDB's own Iceberg reader over S3 (httpfs), from the metadata file Glue points at."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    location = GlueCatalog("reader", **glue["properties"]).load_table((glue["database"], "clicks")).metadata_location

    def extension(module, name: str) -> str:
        [found] = Path(module.__file__).parent.glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
        return str(found)

    props = glue["properties"]
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        for module, name in ((duckdb_extension_httpfs, "httpfs"), (duckdb_extension_avro, "avro"),
                             (duckdb_extension_iceberg, "iceberg")):
            con.execute(f"LOAD '{extension(module, name)}'")
        con.execute(f"CREATE SECRET s3 (TYPE s3, KEY_ID '{props['s3.access-key-id']}', "
                    f"SECRET '{props['s3.secret-access-key']}', REGION '{props['s3.region']}', "
                    f"ENDPOINT '{props['s3.endpoint'].removeprefix('http://')}', URL_STYLE 'path', USE_SSL false)")
        rows = con.execute("SELECT id, count(*) FROM iceberg_scan(?) GROUP BY id", [location]).fetchall()
    finally:
        con.close()
    return collections.Counter({k: n for k, n in rows})


def no_sql_table(s) -> None:
    store = Store(s.db_url)
    try:
        with store.engine.connect() as c:
            rows = (c.execute(sa.text("SELECT table_name FROM iceberg_tables")).all()
                    if sa.inspect(c).has_table("iceberg_tables") else [])
    finally:
        store.close()
    assert rows == [], "the metadata database holds an Iceberg table of its own"


def test_ingest_reset_with_backfill_and_a_kill_between_the_commits(spark, kafka_broker, topic, glue, tmp_path,
                                                                   monkeypatch):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{glue['bucket']}/warehouse", catalog=json.dumps(glue["setting"]))
    assert s.catalog["type"] == "glue"
    monkeypatch.setenv("RECONCILER_CATALOG", json.dumps(glue["setting"]))  # the CLI's, as the daemon's
    h.write_spec(Path(s.specs), h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                           max_batch_records=400))
    produce(kafka_broker, name, 0, 1500)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    h.assert_exactly_once(glue_counts(glue), keys(0, 1500))

    # A reset to latest with a backfill, while the daemon is down (the fence, then the epoch).
    produce(kafka_broker, name, 1500, 1500)
    code, out = h.run_cli(s, "reset", "clicks", "--to", "latest", "--backfill", "--reason", "glue", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["backfill"] == "clicks-backfill-1"
    produce(kafka_broker, name, 3000, 500)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    h.assert_exactly_once(glue_counts(glue), keys(0, 3500))

    # SIGKILL after the table committed a batch and before the database did: the restart
    # rolls the database forward from the table, and reads on from there.
    produce(kafka_broker, name, 3500, 800)
    env = {"RECONCILER_CATALOG": json.dumps(glue["setting"]), "RECONCILER_CRASH_AT": "between-commits",
           "RECONCILER_CRASH_SUPERVISOR": "clicks"}
    proc = h.run_subprocess(s, "run", "--until-caught-up", "--timeout", "180", env=env)
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    in_table = sum(glue_counts(glue).values())
    assert in_table > 3500  # the killed batch is in the table, not in the database
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    h.assert_exactly_once(glue_counts(glue), keys(0, 4300))
    h.assert_exactly_once(duckdb_counts(glue), keys(0, 4300))
    no_sql_table(s)
    store = Store(s.db_url)
    try:
        assert store.writes_in_flight() == []
        assert str(store.get("clicks-backfill-1").state) == "COMPLETED"
    finally:
        store.close()

    # Compaction commits to Glue (its write finished first, then the catalog's commit), and
    # verify --deep proves every offset once from the Glue table alone.
    files_before = len(GlueCatalog("r", **glue["properties"]).load_table((glue["database"], "clicks"))
                       .inspect.files())
    report = h.cli_json(s, "compact", "clicks", "--lateness", "0s")
    assert report["ok"] and report["committed"], report
    table = GlueCatalog("r", **glue["properties"]).load_table((glue["database"], "clicks"))
    assert len(table.inspect.files()) < files_before
    assert table.current_snapshot().summary.additional_properties["reconciler.operation"] == "compact"
    h.assert_exactly_once(glue_counts(glue), keys(0, 4300))
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["findings"] == [], report
    assert report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 4300
    # Expiry and orphan clean-up commit to Glue too (tests/catalogs/test_maintain_*.py).
    report = h.cli_json(s, "maintain", "clicks", "--older-than", "0s", "--retain-last", "2")
    assert report["ok"], report
    h.assert_exactly_once(glue_counts(glue), keys(0, 4300))


def test_twenty_thousand_records_two_kills_a_marker_reset_and_compaction(spark, kafka_broker, topic, glue,
                                                                         tmp_path, monkeypatch):
    """The issue's scenario: 20,000 records, a reset with a backfill by marker, two SIGKILLs
    (a main batch before its table commit; a backfill batch between the two commits), a
    compaction: every id once through Glue, verify --deep passes, no SQL-catalog table."""
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{glue['bucket']}/warehouse", catalog=json.dumps(glue["setting"]))
    monkeypatch.setenv("RECONCILER_CATALOG", json.dumps(glue["setting"]))
    h.write_spec(Path(s.specs), h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                           max_batch_records=1500))
    produce(kafka_broker, name, 0, 6000)
    env = {"RECONCILER_CATALOG": json.dumps(glue["setting"]), "RECONCILER_CRASH_AT": "before-commit",
           "RECONCILER_CRASH_AFTER": "2", "RECONCILER_CRASH_SUPERVISOR": "clicks"}
    proc = h.run_subprocess(s, "run", "--until-caught-up", "--timeout", "180", env=env)
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    produce(kafka_broker, name, 6000, 8000)
    (Path(s.specs) / "clicks.reset.yaml").write_text("resetTo: latest\nbackfill: true\nreason: glue\n")
    env = {"RECONCILER_CATALOG": json.dumps(glue["setting"]), "RECONCILER_CRASH_AT": "between-commits",
           "RECONCILER_CRASH_AFTER": "1", "RECONCILER_CRASH_SUPERVISOR": "clicks-backfill"}
    proc = h.run_subprocess(s, "run", "--until-caught-up", "--timeout", "180", env=env)
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    produce(kafka_broker, name, 14000, 6000)
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0
    report = h.cli_json(s, "compact", "clicks", "--lateness", "0s")
    assert report["ok"], report
    h.assert_exactly_once(glue_counts(glue), keys(0, 20000))
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["findings"] == [], report
    assert report["deep"]["duplicateOffsets"] == 0 and report["deep"]["rows"] == 20000
    no_sql_table(s)
    store = Store(s.db_url)
    try:
        actual = store.read_actual()
        bfs = [sid for sid, r in actual.supervisors.items() if r.parent_id == "clicks"]
        assert bfs and all(str(actual.supervisors[b].state) == "COMPLETED" for b in bfs)
    finally:
        store.close()
