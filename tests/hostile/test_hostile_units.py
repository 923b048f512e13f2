"""Hostile input, unit level (issue 17): each case gets the product's own error, never a crash.

The live-daemon half (the same inputs dropped on a running daemon, a SIGHUP storm, a planted
secret searched for everywhere) is ``test_hostile_daemon.py``.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time
from datetime import UTC, datetime

import click
import pytest

from reconciler import logs
from reconciler.cli import parse_position
from reconciler.daemon.waker import Waker
from reconciler.spec import grants, secrets
from reconciler.spec.timeparse import TimestampError, parse_timestamp
from reconciler.spec.validate import validate_data

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def spec(**changes):
    doc = {"id": "a", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"},
           "dataSchema": {"datasource": "d", "timestamp": {"column": "ts"}}}
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value
    return doc


def problems(doc, kind="spec"):
    return [f"{p.field}: {p.message}" for p in validate_data(doc, kind, now=NOW)]


# -- 1. out-of-range times ------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("0001-01-01T00:00:00+14:00", "out of range"),
    ("9999-12-31T23:59:59-14:00", "out of range"),
    ("-99999999d", "before 1970"),
    ("-99999999999999999999999d", "before 1970"),
    ("1960-01-01T00:00:00Z", "before 1970"),
])
def test_out_of_range_times_are_timestamp_errors(text, why):
    with pytest.raises(TimestampError, match=why):
        parse_timestamp(text, NOW)


@pytest.mark.parametrize("where", ["startFrom", "backfill.resetTo"])
def test_out_of_range_times_in_a_spec_are_problems(where):
    doc = spec()
    if where == "backfill.resetTo":
        doc["backfill"] = {"request": "r1", "resetTo": {"timestamp": "-99999999d"}}
    else:
        doc["startFrom"] = {"timestamp": "-99999999d"}
    assert problems(doc) == [f"{where}.timestamp: -99999999d reaches before 1970-01-01T00:00:00Z "
                             "(the earliest time a stream position can name)"]


def test_out_of_range_time_in_a_marker_is_a_problem():
    found = problems({"resetTo": {"timestamp": "0001-01-01T00:00:00+14:00"}}, "marker")
    assert found == ["resetTo.timestamp: timestamp 0001-01-01T00:00:00+14:00 is out of range "
                     "(its UTC time is not a valid date)"]


# -- 6. trailing newlines in patterned strings ------------------------------------------------

@pytest.mark.parametrize("field", ["id", "dataSchema.datasource", "source.topic"])
def test_a_trailing_newline_never_matches_a_pattern(field):
    found = problems(spec(**{field: "nl\n"}))
    assert found == [f"{field}: 'nl\\n' contains a line break (names are one line)"]


def test_dollar_inside_a_pattern_class_or_escaped_keeps_its_meaning():
    from reconciler.spec.validate import _ecma_regex

    assert _ecma_regex(r"^a[$]b\$$").pattern == r"^a[$]b\$\Z"
    assert _ecma_regex(r"^a[$]b\$$").search("a$b$")
    assert not _ecma_regex(r"^a[$]b\$$").search("a$b$\n")


# -- 7. weak spots ----------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("taskCount", 2.0, "expected integer, got number 2.0"),
    ("maxBatchRecords", 1.0e300, "expected integer, got number 1e+300"),
    ("taskDuration", "0ms", "'0ms' is too short: at least 100ms"),
    ("taskDuration", "0.05s", "'0.05s' is too short: at least 100ms"),
])
def test_numbers_must_be_what_they_say(field, value, message):
    assert problems(spec(**{field: value})) == [f"{field}: {message}"]


@pytest.mark.parametrize("name", ["__time", "time_chunk"])
def test_reserved_output_columns_are_not_dimensions(name):
    found = problems(spec(**{"dataSchema.dimensions": ["user", name]}))
    assert len(found) == 1 and found[0].startswith(f"dataSchema.dimensions[1]: '{name}' is a column the output writes")


@pytest.mark.parametrize("text, message", [
    ('{"0": 1.7}', 'offsets["0"]: expected integer, got number 1.7'),
    ('{"0": true}', 'offsets["0"]: expected integer, got boolean true'),
    ('{"offsets": {"0": 1}, "shiftBy": 3}', "shiftBy: unknown key"),
    ('{"shiftBy": -1e400}', "shiftBy: expected integer, got number -inf"),
    ('{"0": -1}', 'offsets["0"]: must be at least 0'),
    ('{"timestamp": "0001-01-01T00:00:00+14:00"}', "out of range"),
    ("0001-01-01T00:00:00+14:00", "out of range"),
    ('{"a": ' * 5000, "not JSON"),
])
def test_reset_to_refuses_what_it_cannot_mean(text, message):
    with pytest.raises(click.BadParameter, match=None) as info:
        parse_position(text)
    assert message in info.value.format_message()


def test_reset_to_still_reads_every_documented_form():
    assert parse_position('{"0": 1200, "1": 900}').offsets == {"0": 1200, "1": 900}
    assert parse_position('{"shiftBy": -1000}').shift == -1000
    assert parse_position("latest").kind == "latest"
    assert parse_position("-2h").kind == "timestamp"


# -- 4. secrets and the fragments a library echoes ----------------------------------------------

@pytest.fixture
def planted(tmp_path, monkeypatch):
    secret = "root:x:0:0:PLANTED-7f3a:/root:/bin/bash\ndaemon:x:1:1:PLANTED-9c1d:/usr/sbin"
    path = tmp_path / "secret"
    path.write_text(secret)
    monkeypatch.setattr(grants, "_granted", grants.Grants.of(str(tmp_path), ()))
    secrets.resolve(f"${{file:{path}}}")
    return secret


def test_scrub_hides_the_whole_value_and_any_long_fragment(planted):
    truncated = planted[:40]  # librdkafka quotes a truncated copy
    for text in (f"bad value {planted!r}", f'Invalid value "{truncated}..." for "security.protocol"',
                 f"value {planted.splitlines()[1]}", f"json {planted!r}".replace("\n", "\\n")):
        scrubbed = secrets.scrub(text)
        assert "PLANTED" not in scrubbed, scrubbed
        assert secrets.REDACTED in scrubbed
    assert secrets.scrub("nothing secret here") == "nothing secret here"


def test_env_secret_echoed_by_a_library_log_line_is_hidden(monkeypatch):
    monkeypatch.setenv("HOSTILE_SASL", "sasl-PLANTED-e4b2")
    monkeypatch.setattr(grants, "_granted", grants.Grants.of(None, ["HOSTILE_SASL"]))
    secrets.resolve_mapping({"sasl.mechanism": "${env:HOSTILE_SASL}"})
    stream = io.StringIO()
    logs.setup("INFO", "text")
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)
    try:
        logging.getLogger("reconciler.streams.kafka.librdkafka").warning(
            "CONFWARN [thrd:app]: Configuration property sasl.mechanism set to '%s'", "sasl-PLANTED-e4b2")
        try:
            raise ValueError("echo sasl-PLANTED-e4b2")
        except ValueError:
            logging.getLogger("x").exception("failed")
    finally:
        logging.getLogger().handlers.clear()
    out = stream.getvalue()
    assert "PLANTED" not in out and "CONFWARN" in out and "***" in out


def test_a_literal_secret_under_a_secret_key_is_hidden_too():
    secrets.resolve_mapping({"sasl.password": "literal-PLANTED-0a9e"})
    assert "PLANTED" not in secrets.scrub("auth failed for literal-PLANTED-0a9e")


# -- 5. signals only ring a bell ----------------------------------------------------------------

def test_waker_rung_from_a_signal_storm_never_deadlocks():
    """300 SIGHUPs while the loop waits and rings itself: each handler only writes to a pipe."""
    waker = Waker()
    rung = []

    def on_hup(_signum, _frame):
        rung.append(1)
        waker.ring()

    old = signal.signal(signal.SIGHUP, on_hup)
    stop = threading.Event()

    def storm():
        for _ in range(300):
            os.kill(os.getpid(), signal.SIGHUP)
        stop.set()

    try:
        threading.Thread(target=storm, daemon=True).start()
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            waker.ring()
            waker.wait(0.001)
        assert stop.is_set(), "the signal storm did not finish: the loop is stuck"
        time.sleep(0.2)
        assert waker.wait(0.0) or rung  # still usable after the storm
        waker.ring()
        assert waker.wait(1.0) is True
        assert waker.wait(0.01) is False  # wait() cleared the bell
    finally:
        signal.signal(signal.SIGHUP, old)
        waker.close()


def test_healthz_turns_503_when_the_loop_stalls_past_the_lease():
    from reconciler.observe.metrics import Metrics

    m = Metrics()
    m.max_loop_age = 10.0
    m.loop_alive()
    assert m.health()[0] is True
    m.last_loop -= 11
    ok, body = m.health()
    assert ok is False and "loop has not run for" in body["problems"][0]
