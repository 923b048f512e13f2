"""What ``status`` and the pages say must be true and readable (issue 46, the second newcomer run):
no state beside a lag or an error that contradicts it, Spark as the running daemon knows it,
and no raw keys, empty paths or dict dumps. The real daemon and broker: tests/e2e/test_status_truth.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reconciler.observe import render
from reconciler.observe.status import settle, spark_state

LEADER = "ops1:4242:abcd1234"
UP = {"master": "local[2]", "appId": "local-17", "state": "up", "reason": None,
      "since": "2026-11-28T13:00:00+00:00", "pid": 4242, "host": "ops1"}


def _item(**kw) -> dict:
    base = {"id": "clicks", "kind": "main", "parent": None, "state": "IDLE", "detailedState": "IDLE", "epoch": 1,
            "specHash": "abc", "specPath": "/specs/clicks.yaml", "lastError": None, "streamError": None,
            "partitions": [], "lag": 0, "lagSeconds": 0.0, "records": 10, "unparseable": 0,
            "updatedAt": "2026-11-28T13:00:00+00:00", "createdAt": "2026-11-28T12:00:00+00:00",
            "taskDuration": 30.0}
    return base | kw


# -- Spark: the running daemon's session, never another's, never "None" -------------------------------

@pytest.mark.parametrize("seen, leader, daemons, state, daemon", [
    pytest.param(UP, LEADER, [LEADER, "ops1:5555:ffff0000"], "up", LEADER, id="the leader's record, beside a standby"),
    pytest.param(UP | {"pid": 1}, LEADER, [LEADER], "not started", LEADER, id="another process's record"),
    pytest.param(None, LEADER, [LEADER], "not started", LEADER, id="the leader has not built it yet"),
    pytest.param(UP, None, [], "stopped", None, id="its daemon was killed: not up"),
    pytest.param(UP | {"state": "down", "reason": "master gone"}, None, [], "down", None, id="how it ended"),
    pytest.param(None, None, [], "not started", None, id="no daemon, never one"),
    pytest.param(UP, "ops2:4242:abcd1234", ["ops2:4242:abcd1234"], "unknown", "ops2:4242:abcd1234",
                 id="the leader runs on another host"),
])
def test_spark_is_what_the_running_daemon_recorded(seen, leader, daemons, state, daemon):
    got = spark_state(seen, leader, daemons, "local[*]", "ops1")
    assert (got["state"], got["daemon"]) == (state, daemon)
    assert got["running"] == bool(daemons)
    text = render.spark_text(got)
    assert "None" not in text and text.startswith("spark: ")
    if state == "up":
        assert "application local-17" in text and "local[2]" in text
    elif not daemons:
        assert "no daemon is running" in text
    else:
        assert got["reason"] and got["reason"] in text


# -- the state shown: derived from what is known now ---------------------------------------------------

def test_idle_with_records_behind_is_shown_running_with_the_window():
    item = settle(_item(lag=100_000))
    assert (item["state"], item["detailedState"]) == ("RUNNING", "RUNNING")
    assert item["stored"] == {"state": "IDLE", "detailedState": "IDLE"}
    assert "100,000 record(s) arrived" in item["stateNote"] and "taskDuration (30s)" in item["stateNote"]
    text = render.status_text([item], detail=False)
    row = next(line for line in text.splitlines() if line.startswith("clicks "))
    assert "IDLE" not in row and "RUNNING" in row
    assert f"clicks: {item['stateNote']}" in text


def test_idle_with_records_behind_and_no_daemon_stays_as_last_seen_and_says_why():
    item = settle(_item(lag=5), live=False)
    assert item["state"] == "IDLE" and "stored" not in item
    assert "no daemon runs to read them" in item["stateNote"]
    assert "IDLE (as of 13:00:00Z)" in render.status_text([item], detail=False, live=False) or \
        "IDLE (as of 2026-11-28 13:00:00Z)" in render.status_text([item], detail=False, live=False)


@pytest.mark.parametrize("stored, detail, shown", [
    ("IDLE", "LOST_CONTACT_WITH_STREAM", "UNHEALTHY_SUPERVISOR"),
    ("RUNNING", "UNABLE_TO_CONNECT_TO_STREAM", "UNHEALTHY_SUPERVISOR"),
    ("RUNNING", "UNHEALTHY_TASKS", "UNHEALTHY_TASKS"),
])
def test_a_healthy_state_beside_a_failed_step_is_shown_unhealthy(stored, detail, shown):
    item = settle(_item(state=stored, detailedState=detail, lastError="cannot reach Kafka at 127.0.0.1:9", lag=None))
    assert item["state"] == shown and item["detailedState"] == detail
    assert item["stored"]["state"] == stored and detail in item["stateNote"]


@pytest.mark.parametrize("state, lag", [("IDLE", 0), ("IDLE", None), ("RUNNING", 7), ("SUSPENDED", 9),
                                        ("UNHEALTHY_SUPERVISOR", 3)])
def test_a_state_nothing_contradicts_is_shown_as_stored(state, lag):
    item = settle(_item(state=state, detailedState=state, lag=lag))
    assert item["state"] == state and "stored" not in item and "stateNote" not in item


def test_the_page_can_settle_with_the_lag_it_observed():
    """The page asks no broker: the lag observer's lag is handed in."""
    assert settle(_item(lag=None), lag=12)["state"] == "RUNNING"


# -- raw labels -----------------------------------------------------------------------------------------

def test_detail_view_names_its_errors_in_words_not_keys():
    item = _item(state="UNHEALTHY_SUPERVISOR", detailedState="LOST_CONTACT_WITH_STREAM", lastError="boom",
                 streamError="cannot reach Kafka")
    text = render.status_text([item], detail=True)
    assert "streamError" not in text and "lastError" not in text
    assert "[1] clicks: boom" in text and "last error (the daemon's last step): see [1] above" in text
    assert "the broker, asked now by this command: cannot reach Kafka" in text


def test_a_backfill_without_a_file_says_where_its_spec_comes_from():
    item = _item(id="clicks-backfill-1", kind="backfill", parent="clicks", specPath=None)
    text = render.status_text([item], detail=True)
    head = next(line for line in text.splitlines() if line.startswith("clicks-backfill-1 (backfill"))
    assert head.endswith("(no file: generated by a reset of clicks at 12:00:00Z; `reconciler history clicks` has it)") \
        or "generated by a reset of clicks at 2026-11-28 12:00:00Z" in head


RESET = {"supervisor": "clicks", "token": "t1", "backfill": "clicks-backfill-1", "position": "latest",
         "backfillRecords": 6900, "appliedBefore": False, "warnings": [],
         "partitions": [{"partition": "0", "checkpoint": 1200, "earliest": 0, "latest": 5000, "new": 5000,
                         "backfill": 3800, "skipped": 0, "reread": 0, "lost": 0, "renewed": 0},
                        {"partition": "1", "checkpoint": 900, "earliest": 1000, "latest": 4000, "new": 4000,
                         "backfill": 3000, "skipped": 0, "reread": 0, "lost": 100, "renewed": 0},
                        {"partition": "2", "checkpoint": 7, "earliest": 0, "latest": 7, "new": 7,
                         "backfill": 0, "skipped": 0, "reread": 0, "lost": 0, "renewed": 0}],
         "lostRecords": 100, "lostRanges": {"1": [900, 1000]}}


def test_a_reset_audit_entry_reads_as_a_sentence():
    text = render.reset_sentence(RESET)
    assert text == ("reset to latest: partition 0 1,200 → 5,000, 1 900 → 4,000; backfill clicks-backfill-1 "
                    "ingests 6,900 records (0 [1,200, 5,000), 1 [1,000, 4,000)); 100 records LOST to the "
                    "broker's retention (1 [900, 1,000))")
    assert render.reset_sentence({"action": "create", "path": "x"}) is None
    assert "nothing changed" in render.reset_sentence({"token": "t", "partitions": [], "appliedBefore": True})
    entry = {"at": datetime(2026, 11, 28, 13, 1, 2, tzinfo=UTC), "action": "reset-and-backfill",
             "actor": "cli:alice", "reason": "lag alarm INC-42", "details": RESET}
    line = render.last_reset_text(entry)
    assert line.startswith("last reset, ") and "by cli:alice: reset to latest" in line
    assert line.endswith("; reason: lag alarm INC-42") and "{" not in line


def test_the_supervisor_pages_audit_log_shows_a_reset_as_its_sentence():
    from reconciler.observe import supervisorpage

    entry = {"at": datetime(2026, 11, 28, 13, 1, 2, tzinfo=UTC), "action": "reset-and-backfill",
             "actor": "cli:alice", "reason": "INC-42", "details": RESET}
    html = supervisorpage._audit([entry])
    assert "backfill clicks-backfill-1 ingests 6,900 records" in html
    assert "token:" not in html  # not the key: value dump, cut off at its limit


def test_json_keeps_the_recorded_state_and_gives_the_shown_one_beside_it():
    """``status -o json``: scripts compare ``state`` with Druid's meaning (UNHEALTHY only after
    the failures in a row the runtime allows); the text's and the pages' state is beside it."""
    from reconciler.observe.status import as_recorded

    item = as_recorded(settle(_item(lag=100_000)))
    assert (item["state"], item["detailedState"]) == ("IDLE", "IDLE")
    assert (item["shownState"], item["shownDetailedState"]) == ("RUNNING", "RUNNING")
    assert "stored" not in item and "arrived" in item["stateNote"]
    calm = as_recorded(settle(_item(lag=0)))
    assert calm["state"] == "IDLE" and "shownState" not in calm
