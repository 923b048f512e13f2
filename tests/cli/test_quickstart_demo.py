"""The quick start's closing check (scripts/demo.py) and its burst: a newcomer who produced
more events into the demo's topic (the README's tour suggests a burst) was told MISMATCH and
"counts add up: False", because the check compared the tables with the 200,000 events the
demo produced itself. It compares with what the topic holds (the broker's end minus start
offset per partition) and says so."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from devservices import make_records, produce_kafka

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("quickstart_demo", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("rows", "distinct", "stopped_early", "ok", "words"), [
    pytest.param(250, 250, True, True, "exactly once", id="a-burst-counted"),
    pytest.param(250, 250, False, True, "exactly once", id="caught-up"),
    pytest.param(251, 250, True, False, "1 duplicated", id="a-duplicate"),
    pytest.param(240, 240, True, True, "10 records not ingested yet", id="stopped-before-catching-up"),
    pytest.param(240, 240, False, False, "-10 against what the topic holds", id="run-until-caught-up-short"),
    pytest.param(260, 260, True, False, "+10 against what the topic holds", id="more-than-the-topic"),
])
def test_rows_are_checked_against_what_the_topic_holds(demo, rows, distinct, stopped_early, ok, words):
    held = {0: 100, 1: 100, 2: 50}  # 250 records: the demo's 200 and a burst of 50
    got, verdict = demo.check_rows(rows, distinct, held, stopped_early=stopped_early)
    assert (got, words in verdict) == (ok, True), verdict
    assert ("MISMATCH" in verdict) == (not ok)


@pytest.mark.integration
def test_a_burst_lands_in_the_running_demos_topic_and_the_check_counts_it(demo, kafka_broker, topic, tmp_path,
                                                                          monkeypatch):
    name = topic(partitions=4)
    monkeypatch.setattr(demo, "TOPIC", name)
    produce_kafka(kafka_broker.bootstrap, name, make_records(200))  # what the demo produced itself
    assert demo.burst(tmp_path, 50) == 1  # no running demo: said so, nothing produced
    (tmp_path / "bootstrap").write_text(kafka_broker.bootstrap)  # as --serve leaves it
    assert demo.burst(tmp_path, 50) == 0
    held = demo.topic_holds(kafka_broker.bootstrap, name)
    assert sum(held.values()) == 250 and len(held) == 4
    assert demo.check_rows(250, 250, held, stopped_early=True) == (True, "exactly once")
    text = demo.holds_text(held, name)
    assert text.startswith(f"topic '{name}' holds 250 records (end - start offset per partition: 0: ")


def test_quickstart_offers_a_burst():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--burst N" in out and "end minus start offset per partition" in out
