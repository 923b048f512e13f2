"""Issue 41.1 through the command line: a supervisor whose stored spec carries `lagPolicy.for:
100000000h` (accepted before the bound existed) and is behind made `plan` and `apply` exit 1
with `OverflowError: date value out of range`, so another team's new spec was never created.
Now its file is invalid (file, line, field), its policy is skipped, and the others go on.
A real SQLite database, the real CLI through CliRunner."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from reconciler.cli import cli
from reconciler.control.actual import State
from reconciler.control.lagpolicy import LagObservation
from reconciler.model import SupervisorSpec
from reconciler.store.store import Store
from tests.cli.test_cli import CLEAN_ENV

SPEC = """\
id: {sid}
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: {sid}
dataSchema:
  datasource: {sid}
  timestamp: {{column: ts}}
"""
POISON = "lagPolicy:\n  maxRecords: 10\n  for: 100000000h\n  action: resetToLatestAndBackfill\n"


def test_plan_and_apply_go_on_for_the_others(tmp_path: Path):
    specs, state = tmp_path / "specs", tmp_path / "state"
    specs.mkdir()
    state.mkdir()
    (specs / "a-team.yaml").write_text(SPEC.format(sid="a-team") + POISON)
    db = f"sqlite:///{state / 'cli.db'}"
    store = Store(db)
    try:
        store.migrate()
        doc = {"id": "a-team", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "a-team"},
               "dataSchema": {"datasource": "a-team", "timestamp": {"column": "ts"}}}
        stored = {**doc, "lagPolicy": {"maxRecords": 10, "for": "100000000h", "action": "resetToLatestAndBackfill"}}
        store.create_supervisor(replace(SupervisorSpec.from_document(doc), document=stored),
                                str(specs / "a-team.yaml"), actor="test")
        store.set_state("a-team", State.RUNNING)
        now = datetime.now(UTC)  # behind its threshold for a minute: the policy's deadline is due to be computed
        store.save_lag([LagObservation("a-team", now, store.get("a-team").epoch, 5_000, None,
                                       breach_since=now - timedelta(minutes=1))], now=now)
    finally:
        store.close()
    (specs / "b-team.yaml").write_text(SPEC.format(sid="b-team"))  # another team's new spec
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(cli, ["--specs", str(specs), "--state-dir", str(state), "--db", db, *args],
                             env=CLEAN_ENV)

    planned = run("plan", "-o", "json")
    # exit 1 for the invalid file, as for any invalid file: the plan itself was made and printed
    assert planned.exit_code == 1 and isinstance(planned.exception, SystemExit), planned.output
    doc = json.loads(planned.stdout)
    assert [(a["kind"], a["supervisor"]) for a in doc["actions"]] == [("mark-invalid", "a-team"), ("create", "b-team")]
    assert doc["errors"] == [f"{specs / 'a-team.yaml'}:11:8: lagPolicy.for: '100000000h' is too long: at most "
                             "87600h (10 years)"]
    applied = run("apply")
    assert applied.exit_code == 0, (applied.output, applied.exception)
    status = json.loads(run("status", "-o", "json", "--no-lag").stdout)
    assert {s["id"]: s["state"] for s in status["supervisors"]} == {"a-team": "RUNNING", "b-team": "PENDING"}
