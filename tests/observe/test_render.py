"""Text output cannot be forged (issue 29): control characters in what a person or a broker
supplied are escaped in ``history``, ``status``, ``plan`` and the text log; JSON stays exact."""

from __future__ import annotations

import io
import json
import logging
import re
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from reconciler import logs
from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.model import SupervisorSpec
from reconciler.observe import render
from reconciler.store.store import Store

FORGED = "INC-42\n2026-11-24 09:00:00Z  reset              by cli:root  reason: approved\x1b[2J\x1b[31m\u202e\x9b1m\r"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _spec(sid: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}})


def _lines_without_raw_controls(text: str) -> list[str]:
    assert not RAW.search(text), repr(text)
    return text.splitlines()


def test_printable_escapes_every_control_character():
    assert render.printable(FORGED) == ("INC-42\\n2026-11-24 09:00:00Z  reset              by cli:root  reason: "
                                        "approved\\x1b[2J\\x1b[31m\\u202e\\x9b1m\\r")
    assert render.printable("ünïcödé ✓ tab\there") == "ünïcödé ✓ tab\\there"


def test_history_status_and_plan_print_no_raw_control_character(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        store.create_supervisor(_spec("clicks"), "specs/clicks.yaml", actor="test")
        store.suspend_by_operator("clicks", FORGED, actor="cli:mallory")
        store.set_detailed("clicks", *("UNHEALTHY_SUPERVISOR",) * 2, f"broker said: {FORGED}")
        entries = store.history("clicks")
    finally:
        store.close()
    text = render.history_text(entries)
    lines = _lines_without_raw_controls(text)
    assert len(lines) == len(entries), "one line per entry: no forged entry"
    assert "reason: INC-42\\n2026-11-24" in text
    status = [{"id": "clicks", "state": "SUSPENDED", "detailedState": "SUSPENDED", "lag": None, "records": 0,
               "unparseable": 0, "lastError": FORGED, "streamError": None, "kind": "main", "parent": None,
               "epoch": 1, "specHash": "h", "specPath": "specs/x\n.yaml", "partitions": [],
               "override": {"description": f"suspended by operator: {FORGED}"}}]
    _lines_without_raw_controls(render.status_text(status, detail=True))
    error = str(SpecInvalid([SpecProblem("specs/x\n.reset.yaml", 2, 9, "reason", FORGED),
                             SpecProblem("specs/x\n.reset.yaml", 3, 1, "", "second problem")]))
    plan = {"actions": [{"kind": "reject-marker", "supervisor": "x\x1b[2J", "reason": FORGED,
                         "path": "specs/x\n.reset.yaml", "error": error}],
            "notes": [FORGED]}
    out = _lines_without_raw_controls(render.plan_text(plan))
    assert len(out) == 4  # the action, its two problems, the note


def test_the_cli_escapes_text_and_keeps_json_exact(tmp_path):
    env = {e: None for _, e, _, _ in settings_mod.describe()} | {"RECONCILER_CONFIG": None}
    env |= {"RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_SPECS": str(tmp_path)}
    (tmp_path / "clicks.yaml").write_text(
        "id: clicks\nsource: {type: kafka, bootstrapServers: 'h:9092', topic: clicks}\n"
        "dataSchema: {datasource: clicks, timestamp: {column: ts}}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["apply"], env=env).exit_code == 0
    assert runner.invoke(cli, ["suspend", "clicks", "--reason", FORGED], env=env).exit_code == 0
    text = runner.invoke(cli, ["history", "clicks"], env=env)
    _lines_without_raw_controls(text.stdout)
    assert "reason: INC-42\\n" in text.stdout
    exact = json.loads(runner.invoke(cli, ["history", "clicks", "-o", "json"], env=env).stdout)
    assert [e["reason"] for e in exact if e["action"] == "operator-suspend"] == [FORGED]
    status = runner.invoke(cli, ["status", "clicks", "--no-lag"], env=env)
    _lines_without_raw_controls(status.stdout)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_log_escapes_in_text_and_stays_exact_in_json(fmt):
    stream = io.StringIO()
    logs.setup("INFO", fmt)
    logging.getLogger().handlers[0].setStream(stream)
    try:
        logging.getLogger("reconciler.control.apply").info("reset clicks: reason %s", FORGED)
    finally:
        logging.getLogger().handlers.clear()
    out = stream.getvalue()
    if fmt == "text":
        assert len(_lines_without_raw_controls(out)) == 1
        assert "reason INC-42\\n2026-11-24" in out
    else:
        assert json.loads(out)["msg"] == f"reset clicks: reason {FORGED}"
    assert datetime.now(UTC)  # (the line carries its own timestamp)


def test_a_broker_that_is_down_is_said_once_under_the_table():
    from reconciler.observe.render import status_text

    down = "cannot reach Kafka at 127.0.0.1:9092 within 1s"
    items = [{"id": sid, "state": "RUNNING", "detailedState": "RUNNING", "lag": None, "lagSeconds": None,
              "records": 0, "unparseable": 0, "lastError": None, "streamError": down, "kind": "main",
              "parent": None, "backfill": None} for sid in ("a", "b", "c")]
    items[2]["streamError"] = "other"
    text = status_text(items, detail=False)
    assert text.count(down) == 1 and text.count("other") == 1
    assert "[1] 2 supervisors (a, b): " + down in text and "[2] c: other" in text
    assert text.splitlines()[2].endswith("lag unknown: see [1] below")
