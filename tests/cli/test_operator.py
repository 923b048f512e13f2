"""The operator at 3 a.m. (issue 14): a plan that tells the truth, quiet client logs, a
status that answers fast while every broker is down, error columns that wrap.

Brokers here are real addresses that refuse connections (a free loopback port nobody
listens on), which is exactly what a dead broker looks like to a client.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import devservices
from reconciler import logs
from reconciler.observe import render

SCRIPT = Path(sys.executable).parent / "reconciler"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "RECONCILER_CONFIG": "/dev/null"}
    return subprocess.run([str(SCRIPT), "--specs", str(tmp_path / "specs"), "--state-dir", str(tmp_path / "state"),
                           "--http", "", *args], env=env, capture_output=True, text=True, timeout=120)


def _spec(sid: str, bootstrap: str) -> dict:
    return {"id": sid, "source": {"type": "kafka", "bootstrapServers": bootstrap, "topic": sid},
            "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}}


@pytest.fixture
def dead_broker_specs(tmp_path) -> list[str]:
    (tmp_path / "specs").mkdir()
    dead = f"127.0.0.1:{devservices.free_port()}"
    ids = [f"down{i}" for i in range(6)]
    for sid in ids:
        (tmp_path / "specs" / f"{sid}.yaml").write_text(yaml.safe_dump(_spec(sid, dead)))
    return ids


# -- plan ---------------------------------------------------------------------------------------

def test_plan_lists_an_invalid_file_the_daemon_already_recorded(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    (tmp_path / "specs" / "down0.yaml").write_text("id: down0\nsource: [broken\n")
    assert _run(tmp_path, "apply").returncode == 0  # as the daemon would: the error is recorded
    result = _run(tmp_path, "plan")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "No changes: the database matches" not in result.stdout
    assert "error: " + str(tmp_path / "specs" / "down0.yaml") + ":" in result.stdout
    doc = json.loads(_run(tmp_path, "plan", "-o", "json").stdout)
    assert len(doc["errors"]) == 1 and "down0.yaml:" in doc["errors"][0]


def test_plan_of_a_missing_spec_directory_is_an_error_with_the_held_terminations(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    (tmp_path / "specs").rename(tmp_path / "moved")
    result = _run(tmp_path, "plan")
    assert result.returncode == 1
    assert "does not exist" in result.stdout
    held = json.loads(_run(tmp_path, "plan", "-o", "json").stdout)["heldTerminations"]
    assert sorted(held) == sorted(dead_broker_specs)
    assert "held: terminate down0" in result.stdout


def test_plan_exit_codes(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "plan", "--no-positions").returncode == 2  # creates pending
    assert _run(tmp_path, "apply").returncode == 0
    assert _run(tmp_path, "plan", "--no-positions").returncode == 0


# -- status while every broker is down -------------------------------------------------------------

def test_status_while_brokers_are_down_reports_each_stream_unreachable_and_stays_quiet(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    result = _run(tmp_path, "status", "-o", "json")
    assert result.returncode == 0, result.stderr
    items = {s["id"]: s for s in json.loads(result.stdout)["supervisors"]}
    for sid in dead_broker_specs:
        assert items[sid]["lag"] is None
        assert "cannot reach Kafka" in items[sid]["streamError"]
    # librdkafka's connection failures: at most one line per kind of message, not one per retry
    library_lines = [ln for ln in result.stderr.splitlines() if "librdkafka" in ln]
    assert len(library_lines) <= 3, result.stderr
    # the lookups run side by side, each bounded: the whole answer in a few seconds (reported, not timed)
    text = _run(tmp_path, "status")
    assert "cannot reach Kafka" in text.stdout and "withi\n" not in text.stdout


# -- quiet client logs -------------------------------------------------------------------------------

def test_repeated_library_messages_are_collapsed_with_a_count():
    stream = io.StringIO()
    logs.setup("INFO", "text")
    logging.getLogger().handlers[0].setStream(stream)
    lib = logging.getLogger("reconciler.streams.kafka.librdkafka")
    try:
        for i in range(300):
            lib.error("FAIL [consumer-%d]: Connect to 127.0.0.1:9092 failed (after %dms)", i, i)
        lib.error("Broker 127.0.0.1:9092 is now UP")
        logging.getLogger("reconciler.daemon").info("ours %d", 1)
        logging.getLogger("reconciler.daemon").info("ours %d", 1)  # the product's own lines are never held
        collapse = next(f for f in logging.getLogger().handlers[0].filters if isinstance(f, logs._CollapseRepeats))
        collapse.window = 0.0  # the window passed: the next copy says how many were held back
        lib.error("FAIL [consumer-%d]: Connect to 127.0.0.1:9092 failed (after %dms)", 1, 1)
    finally:
        logging.getLogger().handlers.clear()
    lines = stream.getvalue().splitlines()
    assert len([ln for ln in lines if "Connect to" in ln]) == 2, lines
    assert "and 299 more like it" in lines[-1]
    assert any("is now UP" in ln for ln in lines)
    assert len([ln for ln in lines if "ours 1" in ln]) == 2


# -- tables --------------------------------------------------------------------------------------------

def test_a_long_error_wraps_at_words_instead_of_being_cut():
    error = "listing partitions of topic 'clicks': cannot reach Kafka at 127.0.0.1:9092 within 1s; check bootstrapServers"
    text = render.table(["supervisor", "error"], [["clicks", error]], wrap_last=40)
    lines = text.splitlines()
    assert all(len(ln) <= len("supervisor") + 2 + 40 for ln in lines)
    body = " ".join(ln[len("supervisor") + 2:].strip() for ln in lines[2:])
    assert body == error


# -- validate for CI, refusals printed once, segments that name the datasources ---------------------

def test_validate_json_for_ci(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "ok.yaml").write_text(yaml.safe_dump(_spec("ok", "127.0.0.1:9092")))
    (tmp_path / "specs" / "typo.yaml").write_text(yaml.safe_dump(_spec("typo", "127.0.0.1:9092")).replace("topic:", "topc:"))
    result = _run(tmp_path, "validate", "-o", "json", str(tmp_path / "specs"))
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert (doc["ok"], doc["specs"], doc["markers"]) == (False, 1, 0)
    [problem] = doc["problems"]
    assert problem["path"].endswith("typo.yaml") and problem["field"] == "source.topc"
    assert isinstance(problem["line"], int) and "did you mean 'topic'" in problem["message"]
    assert not (tmp_path / "state").exists()  # no database, no state: fit for a pre-commit hook


def test_the_shipped_pre_commit_hook_runs_validate():
    hooks = yaml.safe_load((Path(__file__).resolve().parents[2] / ".pre-commit-hooks.yaml").read_text())
    assert hooks[0]["id"] == "reconciler-validate" and hooks[0]["entry"] == "reconciler validate"


def test_a_refusal_is_printed_once_and_as_json_with_o_json(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    text = _run(tmp_path, "reset", "down0", "--to", '{"0": 5}')
    assert text.returncode == 1
    assert text.stderr.count("cannot reach Kafka") == 1, text.stderr
    as_json = _run(tmp_path, "reset", "down0", "--to", '{"0": 5}', "-o", "json")
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and "cannot reach Kafka" in doc["error"]
    unknown = json.loads(_run(tmp_path, "reset", "nope", "--to", "latest", "-o", "json").stdout)
    assert unknown == {"ok": False, "error": "no main supervisor 'nope' (see `reconciler status`)"}


def test_segments_of_a_supervisor_id_names_the_datasources(tmp_path, dead_broker_specs):
    (tmp_path / "specs" / "down0.yaml").write_text(
        yaml.safe_dump(_spec("down0", "127.0.0.1:1") | {"dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}))
    assert _run(tmp_path, "apply").returncode == 0
    out = _run(tmp_path, "segments", "down0").stdout
    assert "Supervisor 'down0' writes datasource 'clicks'." in out and "Datasources: clicks, down1" in out


def test_without_a_leader_states_are_shown_as_last_seen_and_when(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    text = _run(tmp_path, "status", "--no-lag").stdout
    assert "PENDING (as of " in text
    doc = json.loads(_run(tmp_path, "status", "--no-lag", "-o", "json").stdout)
    assert all(s["stale"] is True for s in doc["supervisors"])


@pytest.mark.parametrize("command", [("status", "nope", "--no-lag"), ("history", "nope")])
def test_unknown_supervisor_with_o_json_answers_json(tmp_path, dead_broker_specs, command):
    assert _run(tmp_path, "apply").returncode == 0
    result = _run(tmp_path, *command, "-o", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"ok": False, "error": "no supervisor 'nope'"}
