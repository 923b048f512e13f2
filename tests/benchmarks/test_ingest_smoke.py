"""``benchmarks/ingest.py`` runs end to end (issue 12's smoke test): 100,000 records on
Kafka, every figure reported, every product run exactly once. No speed threshold: speed
is read from the benchmark's JSON, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.kafka
def test_ingest_benchmark_reports_every_figure_with_exactly_once():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--records", "100000",
                           "--system", "kafka"], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    kafka = doc["kafka"]
    for figure in ("raw_consume", "naive_pipeline", "product_cold", "product_warm_first", "product_warm",
                   "small_batches"):
        assert kafka[figure]["records"] == 100_000 and kafka[figure]["records_per_s"] > 0, figure
    for run in ("product_cold", "product_warm_first", "product_warm", "small_batches"):
        assert kafka[run]["verify"] == {**kafka[run]["verify"], "rows": 100_000, "distinct_ids": 100_000,
                                        "exactly_once": True}, run
    part = kafka["product_warm_part"]  # g: the same daemon, a quarter of the records
    assert part["records"] == 25_000 and part["verify"]["exactly_once"] and part["verify"]["rows"] == 25_000, part
    marginal = kafka["product_warm_marginal"]  # the slope between e and that run
    assert marginal["records"] == 75_000, marginal
    assert marginal["seconds"] == pytest.approx(kafka["product_warm"]["seconds"] - part["seconds"], abs=0.002)
    assert len(kafka["product_warm"]["earlier_runs_records_per_s"]) == 1, kafka["product_warm"]
    assert set(kafka["ratios"]) == {"cold_over_raw", "cold_over_naive", "warm_over_raw", "warm_over_naive",
                                    "warm_first_over_raw", "warm_first_over_naive", "marginal_over_raw",
                                    "marginal_over_naive", "cold_marginal_over_raw", "cold_marginal_over_naive"}
    cold_part = kafka["product_cold_part"]  # a second fresh process, a quarter of the records
    assert cold_part["records"] == 25_000 and cold_part["verify"]["exactly_once"], cold_part
    assert kafka["product_cold_marginal"]["records"] == 75_000, kafka["product_cold_marginal"]
    cold = kafka["product_cold"]  # the first committed records, seen from the outside while it ran
    assert 0 < cold["first_visible_seconds"] <= cold["first_100k_visible_seconds"] < cold["seconds"], cold
    for run in ("product_warm_first", "product_warm"):  # the run's one batch, its phases from the log
        phases = kafka[run]["batch_phases"]
        assert set(phases) == {"capture", "plan", "job", "publish"} and phases["job"] > 0, (run, phases)
        assert sum(phases.values()) <= kafka[run]["seconds"], (run, kafka[run])
    small = kafka["small_batches"]  # 100,000 records in batches of 10,000, each batch's phases read from the log
    assert small["batches"] == 10 and small["batch_records"] == 10_000, small
    assert set(small["phases_median"]) == {"capture", "plan", "job", "publish"}, small
    assert 0 < small["fixed_seconds_median"] < small["batch_seconds_median"] + small["phases_median"]["capture"]
    for run in ("product_cold", "product_warm"):  # sampled, and the JVM counted (it alone is > 200 MiB)
        assert 200 < kafka[run]["peak_rss_mib"] < 16384, (run, kafka[run]["peak_rss_mib"])
        # sampled just after the RSS: at most the RSS, give or take what grew in between
        assert 200 < kafka[run]["peak_pss_mib"] < 1.1 * kafka[run]["peak_rss_mib"], (run, kafka[run])
