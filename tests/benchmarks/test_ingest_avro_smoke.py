"""``benchmarks/ingest.py --format avro`` runs end to end: 20,000 Avro records in the
Confluent wire format (registered in devservices/registry.py by confluent-kafka's
AvroSerializer) through the product, the naive fastavro script and the product's JSON path;
every product run exactly once. No speed threshold: speed is read, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.kafka
def test_avro_benchmark_reports_every_figure_with_exactly_once():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--format", "avro",
                           "--records", "20000", "--typed-json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["format"] == "avro" and "kafka" not in doc and "rabbitmq" not in doc
    avro = doc["kafka_avro"]
    assert avro["naive_avro"]["records"] == 20_000 and avro["naive_avro"]["records_per_s"] > 0
    for run in ("product_avro", "product_json", "product_json_typed", "product_json_strings"):
        assert avro[run]["records_per_s"] > 0, run
        assert avro[run]["verify"] == {**avro[run]["verify"], "rows": 20_000, "distinct_ids": 20_000,
                                       "exactly_once": True}, run
        assert len(avro[run]["earlier_runs_records_per_s"]) == 1, run
    assert avro["avro_bytes_mean"] < avro["json_bytes_mean"]
    assert set(avro["ratios"]) == {"avro_over_naive_avro", "avro_over_json", "typed_over_strings"}
    assert all(v > 0 for v in avro["ratios"].values()), avro["ratios"]
    # one writer schema, fetched by id: by the naive script and once per process of the product
    assert avro["registry_requests"].get("GET /schemas/ids/1", 0) >= 1, avro["registry_requests"]
