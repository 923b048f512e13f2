"""``benchmarks/backfill.py --partitions 1`` runs end to end (issue 30): backfills of one
partition with taskCount 1 and 2, each exactly once, both rates and their ratio in the JSON.
No speed threshold: the ratio depends on the cores free at the time (benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.kafka
def test_one_partition_backfill_benchmark_reports_both_rates_and_the_ratio():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "backfill.py"), "--partitions", "1",
                           "--records", "20000"], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["partitions"] == 1 and doc["records"] == 20_000 and doc["exactly_once"] is True
    runs = {b["task_count"]: b for b in doc["backfills"]}
    assert sorted(runs) == [1, 2] and all(b["batches"] == 1 for b in runs.values()), doc["backfills"]
    for b in runs.values():
        assert b["verify"]["rows"] == b["verify"]["distinct_ids"] == 20_000 and b["verify"]["exactly_once"], b
        assert 0 < b["drain_s"] <= b["backfill_s"] and b["drain_records_per_s"] > 0, b
    assert doc["task_count_1_drain_records_per_s"] == runs[1]["drain_records_per_s"]
    assert doc["task_count_2_drain_records_per_s"] == runs[2]["drain_records_per_s"]
    assert doc["speedup"] == pytest.approx(runs[2]["drain_records_per_s"] / runs[1]["drain_records_per_s"], abs=0.001)
    assert doc["speedup_by_round"] == [pytest.approx(doc["speedup"], abs=0.001)]
    # the cores the machine kept busy while each drained, and the ceiling they leave a second task
    assert all(0 < r["cores_busy"] <= doc["cores"] * 1.2 for r in runs.values()), runs  # ticks of 10 ms
    assert doc["speedup_ceiling"] == pytest.approx(doc["cores"] / runs[1]["cores_busy"], rel=0.01)
