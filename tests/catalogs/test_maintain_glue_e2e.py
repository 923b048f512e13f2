"""``reconciler maintain`` beside ingestion with ``catalog: {type: glue}`` (issue 44): real
Tansu broker, real Spark (local), moto's S3 and Glue. Expiry and orphan clean-up run in their
own processes, again and again, while the daemon publishes; every key is in the Glue table
once, ``verify --deep`` passes, the orphans are gone and no file the table references is."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.glue import GlueCatalog

from reconciler.table import storage
from reconciler.table.writeids import BATCH_DIR_PREFIX, new_write_id
from tests.catalogs.test_glue_e2e import glue_counts, keys, no_sql_table, produce
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _objects(glue, prefix: str) -> set[str]:
    return set(storage.at(prefix).list(prefix))


def _referenced(glue) -> set[str]:
    """Every file the Glue table's current metadata references (metadata log, manifest lists,
    manifests, data files)."""
    from reconciler.table.reach import _referenced

    return _referenced(GlueCatalog("r", **glue["properties"]).load_table((glue["database"], "clicks")))


def test_maintain_beside_ingestion_on_glue(spark, kafka_broker, topic, glue, tmp_path, monkeypatch):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{glue['bucket']}/warehouse", catalog=json.dumps(glue["setting"]),
                        reader_grace=0, snapshots_kept=1000)
    monkeypatch.setenv("RECONCILER_CATALOG", json.dumps(glue["setting"]))
    env = {"RECONCILER_CATALOG": json.dumps(glue["setting"])}
    h.write_spec(Path(s.specs), h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_count=2,
                                           max_batch_records=150))
    produce(kafka_broker, name, 0, 600)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    location = GlueCatalog("r", **glue["properties"]).load_table((glue["database"], "clicks")).location()
    # Orphans: the files of a batch directory no database ever recorded (an older version's,
    # or a publish that crashed before this version recorded writes) and of a lost compaction.
    planted = []
    for directory in (f"{BATCH_DIR_PREFIX}{new_write_id()}", f"compacted/{new_write_id()}"):
        path = f"{location}/data/{directory}/part-0.parquet"
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": ["orphan"]}), buf)
        storage.at(path).write_bytes(path, buf.getvalue())
        planted.append(path)
    before = _objects(glue, location)

    produce(kafka_broker, name, 600, 2400)
    runs: list = []
    stop = threading.Event()

    def maintain() -> None:  # its own process, again and again while the daemon publishes
        while not stop.is_set() and len(runs) < 6:
            proc = h.run_subprocess(s, "maintain", "clicks", "--older-than", "0s", "--retain-last", "2",
                                    "--orphans-older-than", "0s", "-o", "json", env=env, timeout=180)
            runs.append(proc)

    beside = threading.Thread(target=maintain)
    beside.start()
    try:
        code, _ = h.run_daemon(s, timeout=240)
    finally:
        stop.set()
        beside.join()
    assert code == 0
    assert runs and all(p.returncode == 0 for p in runs), [p.stdout + p.stderr[-2000:] for p in runs]
    expired = sum(t["expire"]["expiredSnapshots"] for p in runs for t in json.loads(p.stdout)["tables"]
                  if t["table"] == "clicks")
    assert expired > 0, [p.stdout for p in runs]
    h.assert_exactly_once(glue_counts(glue), keys(0, 3000))

    # Once more with ingestion done: the planted orphans are gone, nothing referenced is.
    report = h.cli_json(s, "maintain", "--older-than", "0s", "--retain-last", "2", "--orphans-older-than", "0s")
    after = _objects(glue, location)
    referenced = _referenced(glue)
    assert not set(planted) & after, "an orphan was left"
    assert referenced <= after, f"referenced files deleted: {sorted(referenced - after)[:5]}"
    assert set(planted) <= before - after
    deleted = sum(t["orphans"]["deletedFileCount"] for t in [*report["tables"],
                  *(t for p in runs for t in json.loads(p.stdout)["tables"])])
    assert deleted >= len(planted), report
    h.assert_exactly_once(glue_counts(glue), keys(0, 3000))
    deep = h.cli_json(s, "verify", "clicks", "--deep")
    assert deep["ok"] and deep["findings"] == [], deep
    assert deep["deep"]["duplicateOffsets"] == 0 and deep["deep"]["rows"] == 3000
    no_sql_table(s)
