"""``status`` as a fourth newcomer read it (issue 46 item 5): the broker's error said twice by
``status clicks`` (under the table as [1], then again as "the broker, asked now"), a ``?`` for
the lag ``--no-lag`` never asked for, with no line saying why, and ``status --help`` putting a
completed backfill's lag under ``records``."""

from __future__ import annotations

import re
import socket

import pytest
from click.testing import CliRunner

from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.observe import render

DOWN = ("listing partitions of clicks: cannot reach Kafka at 127.0.0.1:9092 within 5s "
        "(_TRANSPORT: Local: Broker transport failure); check bootstrapServers, that the brokers are up, "
        "and network/TLS settings")


def _item(**kw) -> dict:
    base = {"id": "clicks", "kind": "main", "parent": None, "state": "IDLE", "detailedState": "IDLE", "epoch": 1,
            "specHash": "abc", "specPath": "/specs/clicks.yaml", "lastError": None, "streamError": None,
            "partitions": [{"partition": "0", "checkpoint": 75, "latest": None, "end": None, "lag": None,
                            "lagSeconds": None}],
            "lag": None, "lagSeconds": None, "records": 75, "unparseable": 0,
            "updatedAt": "2026-11-28T13:00:00+00:00", "createdAt": "2026-11-28T12:00:00+00:00",
            "taskDuration": 30.0}
    return base | kw


def _said(text: str, words: str) -> int:
    return " ".join(text.split()).count(words)


@pytest.mark.parametrize("last, asked", [
    pytest.param(None, DOWN, id="no daemon: only the broker asked now"),
    pytest.param(DOWN, DOWN, id="the daemon's error and the broker's, word for word"),
    pytest.param(DOWN, DOWN.replace("within 5s", "within 1s"), id="the same but for a timeout"),
    pytest.param(DOWN, "listing partitions of clicks: cannot reach Kafka at 127.0.0.1:9092 within 1s "
                 "(_ALL_BROKERS_DOWN: 1/1 brokers are down); check bootstrapServers", id="both unreachable"),
])
def test_the_same_broker_error_is_said_once_in_the_detail_view(last, asked):
    text = render.status_text([_item(lastError=last, streamError=asked, state="UNHEALTHY_SUPERVISOR",
                                     detailedState="LOST_CONTACT_WITH_STREAM")], detail=True)
    assert _said(text, "cannot reach Kafka") == 1, text
    assert "[1] clicks: listing partitions of clicks: cannot reach Kafka" in text
    assert "the broker, asked now by this command: the same ([1])" in text
    if last:
        assert "last error (the daemon's last step): see [1] above" in text


def test_a_broker_given_up_on_is_the_same_problem_as_one_not_reached():
    text = render.status_text([_item(lastError=DOWN, streamError="no answer from the stream within 10s (given up)")],
                              detail=True)
    assert "the broker, asked now by this command: the same ([1])" in text


def test_status_id_with_the_broker_down_says_its_error_once(tmp_path):
    """The real Kafka client against a port nobody listens on: its own words, said once."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # free, then closed: nothing listens there
    env = {e: None for _, e, _, _ in settings_mod.describe()} | {"RECONCILER_CONFIG": None}
    env |= {"RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_SPECS": str(tmp_path)}
    (tmp_path / "clicks.yaml").write_text(
        f"id: clicks\nsource: {{type: kafka, bootstrapServers: '127.0.0.1:{port}', topic: clicks}}\n"
        "dataSchema: {datasource: clicks, timestamp: {column: ts}}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["apply"], env=env).exit_code == 0
    out = runner.invoke(cli, ["status", "clicks"], env=env)
    assert out.exit_code == 0, out.output
    notes = [line for line in out.stdout.splitlines() if line.startswith("[1] clicks: ")]
    assert len(notes) == 1 and f"127.0.0.1:{port}" in notes[0], out.stdout
    assert _said(out.stdout, f"127.0.0.1:{port}") == 1, out.stdout
    assert "the broker, asked now by this command: the same ([1])" in out.stdout


def test_a_different_broker_error_is_still_said():
    text = render.status_text([_item(lastError="publishing batch 7: Spark job failed: OutOfMemoryError",
                                     streamError=DOWN)], detail=True)
    assert "[1] clicks: publishing batch 7: Spark job failed" in text
    assert "the broker, asked now by this command: listing partitions of clicks: cannot reach Kafka" in text


@pytest.mark.parametrize("detail", [False, True], ids=["status", "status ID"])
def test_no_lag_shows_a_dash_and_says_why(detail):
    done = _item(id="clicks-backfill-1", kind="backfill", state="COMPLETED", lag=0, lagSeconds=0.0,
                 partitions=[{"partition": "0", "checkpoint": 9, "latest": None, "end": 9, "lag": 0, "lagSeconds": 0.0}])
    text = render.status_text([_item(), done], detail=detail, lag_asked=False)
    row = next(line for line in text.splitlines() if line.startswith("clicks "))
    assert row.split()[3:5] == ["-", "-"] and "?" not in row, row
    assert "lag -: not asked of the brokers (--no-lag)" in text
    assert "?" not in text
    backfill = next(line for line in text.splitlines() if line.startswith("clicks-backfill-1 "))
    assert backfill.split()[3:5] == ["0", "0s"]
    if detail:
        part = next(line for line in text.splitlines() if line.startswith("0 ") and " 75 " in line)
        assert part.split()[-2:] == ["-", "-"], part
    asked = render.status_text([_item()], detail=detail)  # asked, not known: a "?" as before
    assert "not asked" not in asked and "?" in asked


def test_status_no_lag_through_the_cli(tmp_path):
    env = {e: None for _, e, _, _ in settings_mod.describe()} | {"RECONCILER_CONFIG": None}
    env |= {"RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_SPECS": str(tmp_path)}
    (tmp_path / "clicks.yaml").write_text(
        "id: clicks\nsource: {type: kafka, bootstrapServers: '127.0.0.1:1', topic: clicks}\n"
        "dataSchema: {datasource: clicks, timestamp: {column: ts}}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["apply"], env=env).exit_code == 0
    out = runner.invoke(cli, ["status", "--no-lag"], env=env)
    assert out.exit_code == 0, out.output
    assert "lag -: not asked of the brokers (--no-lag)" in out.stdout, out.stdout


def _legend(text: str) -> dict[str, str]:
    """``status --help``'s words: each entry's text, its continuation lines joined."""
    entries: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        m = re.match(r"^ {4}(\S+(?: \S+)*?) {2,}(\S.*)$", line)
        if m:
            key = m.group(1)
            entries[key] = m.group(2)
        elif key and line.startswith(" " * 10) and line.strip():
            entries[key] += " " + line.strip()
        else:
            key = None
    return entries


def test_status_help_gives_lag_its_own_words():
    out = CliRunner().invoke(cli, ["status", "--help"], terminal_width=200)
    assert out.exit_code == 0
    legend = _legend(out.stdout)
    assert "completed backfill has lag 0 and lag age 0s" in legend["lag"], legend["lag"]
    assert "- when not asked (--no-lag)" in legend["lag"]
    assert "lag" not in legend["records"].replace("(the unparseable", ""), legend["records"]
