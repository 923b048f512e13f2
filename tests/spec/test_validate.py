"""JSON Schema validation: each kind of mistake gives file:line:col, field and an actionable message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.spec.timeparse import TimestampError, parse_timestamp
from reconciler.spec.validate import describe_value, validate_data, validate_document
from reconciler.spec.yamlsafe import parse_yaml

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)

KAFKA = """\
id: clicks
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: clicks
dataSchema:
  datasource: clicks
  timestamp: {column: ts}
"""

RABBIT = """\
id: orders
source:
  type: rabbitmq
  uri: rabbitmq-stream://guest:${env:RMQ_PASSWORD}@127.0.0.1:5552/%2f
  streams: [orders-0, orders-1]
dataSchema:
  datasource: orders
  timestamp: {column: ts}
"""

FULL = """\
id: clicks
suspended: false
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: clicks
  consumerProperties: {sasl.password: "${env:KAFKA_PASSWORD}", fetch.queue.backoff.ms: 10}
startFrom: {timestamp: "-2h"}
taskCount: 2
taskDuration: 500ms
maxBatchRecords: 1000000
maxBatchBytes: 512MiB
dataSchema:
  datasource: clicks
  format: json
  timestamp: {column: ts, format: millis}
  dimensions: [user, page, __partition, __offset]
  metrics:
    - {name: count, type: count}
    - {name: bytes, type: longSum, field: bytes}
  granularity: {segment: hour, query: minute, rollup: true}
backfill:
  request: inc-2026-11-20-lag
  resetTo: {offsets: {"0": 1200, "1": 900}}
  taskCount: 4
  allowRewind: false
  reason: lag alarm
"""


def check(text: str, kind: str = "spec") -> list[str]:
    parsed = parse_yaml(text.encode(), "specs/clicks.yaml", allow_empty=kind == "marker")
    return [str(p) for p in validate_document(parsed, kind, now=NOW)]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(KAFKA, id="kafka-minimal"),
        pytest.param(RABBIT, id="rabbitmq-minimal"),
        pytest.param(FULL, id="kafka-everything"),
        pytest.param(
            KAFKA + "startFrom: latest\nbackfill: {request: r1, resetTo: {shiftBy: -100}}\n",
            id="shift-by",
        ),
        pytest.param(
            KAFKA + "startFrom: {timestamp: 2026-11-01T00:00:00Z}\n", id="unquoted-iso-timestamp"
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: {timestamp: 2026-11-19}}\n", id="date-reset"
        ),
    ],
)
def test_valid_specs(text):
    assert check(text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            KAFKA.replace("  topic:", "  topc:"),
            ["specs/clicks.yaml:5:3: source.topc: unknown key (did you mean 'topic'?)"],
            id="misspelled-key-no-missing-noise",
        ),
        pytest.param(
            KAFKA + "suspend: true\n",
            ["specs/clicks.yaml:9:1: suspend: unknown key (did you mean 'suspended'?)"],
            id="misspelled-top-level",
        ),
        pytest.param(
            KAFKA + "colour: blue\n",
            [
                "specs/clicks.yaml:9:1: colour: unknown key (allowed: backfill, dataSchema, freshStart, id, lagPolicy, "
                "maxBatchBytes, maxBatchRecords, onRetentionLoss, source, startFrom, suspended, taskCount, taskDuration)"
            ],
            id="unknown-key-lists-allowed",
        ),
        pytest.param(
            RABBIT.replace("  streams:", "  streamz:"),
            ["specs/clicks.yaml:5:3: source.streamz: unknown key (did you mean 'streams'?)"],
            id="rabbitmq-misspelled-streams",
        ),
        pytest.param(
            RABBIT.replace("  uri:", "  url:"),
            ["specs/clicks.yaml:4:3: source.url: unknown key (did you mean 'uri'?)"],
            id="rabbitmq-misspelled-uri",
        ),
        pytest.param(
            RABBIT + "x: 1\n",
            ["specs/clicks.yaml:9:1: x: unknown key (allowed: "],
            id="root-unknown-after-rabbit",
        ),
        pytest.param(
            KAFKA.replace("topic: clicks", "topic: no"),
            [
                "specs/clicks.yaml:5:10: source.topic: expected string, got boolean false (YAML read it "
                "as a non-string; put it in quotes)"
            ],
            id="norway-problem",
        ),
        pytest.param(
            KAFKA + "maxBatchBytes: lots\n",
            ["specs/clicks.yaml:9:16: maxBatchBytes: 'lots' does not match the pattern "
             "^[0-9]+(\\.[0-9]+)?\\s*(B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)?$"],
            id="batch-bytes-not-a-size",
        ),
        pytest.param(
            KAFKA + "maxBatchBytes: 100\n",
            ["specs/clicks.yaml:9:16: maxBatchBytes: must be at least 1024, got 100"],
            id="batch-bytes-too-small",
        ),
        pytest.param(
            KAFKA + "taskCount: 2x\n",
            ["specs/clicks.yaml:9:12: taskCount: expected integer, got string '2x'"],
            id="wrong-type",
        ),
        pytest.param(
            KAFKA + "suspended: 'no'\n",
            ["specs/clicks.yaml:9:12: suspended: expected boolean, got string 'no'"],
            id="quoted-bool",
        ),
        pytest.param(
            KAFKA + "taskCount:\n",
            ["specs/clicks.yaml:9:11: taskCount: expected integer, got nothing (an empty value)"],
            id="empty-value",
        ),
        pytest.param(
            KAFKA + "taskCount: 0\n",
            ["specs/clicks.yaml:9:12: taskCount: must be at least 1, got 0"],
            id="below-minimum",
        ),
        pytest.param(
            KAFKA.replace("  topic: clicks\n", ""),
            ["specs/clicks.yaml:2:1: source: missing required key 'topic'"],
            id="missing-required",
        ),
        pytest.param(
            KAFKA.replace("id: clicks\n", ""),
            ["specs/clicks.yaml:1:1: missing required key 'id'"],
            id="missing-id",
        ),
        pytest.param(
            KAFKA.replace("id: clicks", "id: Clicks"),
            [
                "specs/clicks.yaml:1:5: id: 'Clicks' is not a valid id (did you mean 'clicks'?): ids are "
                "lowercase letters, digits, '_' and '-', at most 63 characters, no slashes "
                "(pattern ^[a-z0-9][a-z0-9_-]{0,62}$)"
            ],
            id="uppercase-id",
        ),
        pytest.param(
            KAFKA.replace("id: clicks", "id: ../x"),
            ["specs/clicks.yaml:1:5: id: '../x' is not a valid id: ids are lowercase"],
            id="path-id",
        ),
        pytest.param(
            KAFKA.replace("id: clicks", "id: 42"),
            [
                "specs/clicks.yaml:1:5: id: expected string, got integer 42 (YAML read it as a non-string; "
                "put it in quotes)"
            ],
            id="numeric-id",
        ),
        pytest.param(
            KAFKA + "taskDuration: 5 s\n",
            ["specs/clicks.yaml:9:15: taskDuration: '5 s' is not a duration (use e.g. 500ms, 30s"],
            id="bad-duration",
        ),
        pytest.param(
            KAFKA.replace("type: kafka", "type: kafak"),
            [
                "specs/clicks.yaml:3:9: source.type: must be one of: kafka, rabbitmq; got string 'kafak' "
                "(did you mean 'kafka'?)"
            ],
            id="source-type-typo",
        ),
        pytest.param(
            KAFKA.replace("  type: kafka\n", ""),
            [
                "specs/clicks.yaml:2:1: source: missing required key 'type' (one of: kafka, rabbitmq)"
            ],
            id="source-without-type",
        ),
        pytest.param(
            KAFKA.replace("type: kafka", "type: rabbitmq"),
            [
                "specs/clicks.yaml:2:1: source: missing required key 'streams'",
                "specs/clicks.yaml:2:1: source: missing required key 'uri'",
                "specs/clicks.yaml:4:3: source.bootstrapServers: unknown key (allowed: streams, type, uri)",
                "specs/clicks.yaml:5:3: source.topic: unknown key (allowed: streams, type, uri)",
            ],
            id="kafka-keys-under-rabbitmq",
        ),
        pytest.param(
            RABBIT.replace("[orders-0, orders-1]", "[]"),
            ["specs/clicks.yaml:5:12: source.streams: must list at least 1 item"],
            id="no-streams",
        ),
        pytest.param(
            RABBIT.replace("[orders-0, orders-1]", "[a, a]"),
            ["specs/clicks.yaml:5:12: source.streams: items must be unique (string 'a' appears"],
            id="repeated-stream",
        ),
        pytest.param(
            RABBIT.replace("rabbitmq-stream://", "amqp://"),
            [
                "specs/clicks.yaml:4:8: source.uri: 'amqp://guest:${env:RMQ_PASSWORD}@127.0.0.1:5552/%2f' "
                "does not match the pattern ^rabbitmq-stream(\\+tls)?://"
            ],
            id="rabbitmq-uri-scheme",
        ),
        pytest.param(
            KAFKA
            + "  metrics:\n    - {name: count, type: count}\n    - {name: bytes, type: longSum}\n",
            [
                "specs/clicks.yaml:11:7: dataSchema.metrics[1]: missing required key 'field' "
                "(required for type 'longSum')"
            ],
            id="metric-without-field",
        ),
        pytest.param(
            KAFKA + "  metrics: [{name: b, type: longsum, field: b}]\n",
            [
                "specs/clicks.yaml:9:29: dataSchema.metrics[0].type: must be one of: count, longSum, "
                "doubleSum, longMin, longMax, doubleMin, doubleMax; got string 'longsum' "
                "(did you mean 'longSum'?)"
            ],
            id="metric-type-case",
        ),
        pytest.param(
            KAFKA + "startFrom: lastest\n",
            [
                "specs/clicks.yaml:9:12: startFrom: must be one of: earliest, latest, {timestamp: ...}; "
                "got string 'lastest' (did you mean 'latest'?)"
            ],
            id="start-from-typo",
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: 5}\n",
            [
                "specs/clicks.yaml:9:34: backfill.resetTo: must be one of: earliest, latest, "
                "{timestamp: ...}, {offsets: {...}}, {shiftBy: N}; got integer 5"
            ],
            id="position-forms",
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: {timestamps: '-1h'}}\n",
            [
                "specs/clicks.yaml:9:35: backfill.resetTo.timestamps: unknown key "
                "(did you mean 'timestamp'?)"
            ],
            id="position-key-typo",
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: {offsets: {'0': -5}}}\n",
            ['specs/clicks.yaml:9:50: backfill.resetTo.offsets["0"]: must be at least 0, got -5'],
            id="negative-offset",
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: {shiftBy: 1.5}}\n",
            ["specs/clicks.yaml:9:44: backfill.resetTo.shiftBy: expected integer, got number 1.5"],
            id="fractional-shift",
        ),
        pytest.param(
            KAFKA + "backfill: {resetTo: latest}\n",
            ["specs/clicks.yaml:9:1: backfill: missing required key 'request'"],
            id="backfill-no-request",
        ),
        pytest.param(
            KAFKA + "startFrom: {timestamp: '2999-01-01T00:00:00Z'}\n",
            [
                "specs/clicks.yaml:9:24: startFrom.timestamp: timestamp 2999-01-01T00:00:00Z is in the future"
            ],
            id="start-from-future",
        ),
        pytest.param(
            KAFKA + "startFrom: {timestamp: yesterday}\n",
            ["specs/clicks.yaml:9:24: startFrom.timestamp: not a timestamp: 'yesterday'"],
            id="start-from-unparseable",
        ),
        pytest.param(
            KAFKA + "backfill: {request: r1, resetTo: {timestamp: '2h'}}\n",
            [
                "specs/clicks.yaml:9:46: backfill.resetTo.timestamp: relative times count back from now "
                "and start with '-' (e.g. -2h)"
            ],
            id="reset-relative-forward",
        ),
        pytest.param(
            KAFKA + "  granularity: {segment: week}\n  dimensions: [a, a]\n  x: 1\n",
            [
                "specs/clicks.yaml:9:26: dataSchema.granularity.segment: must be one of: minute, "
                "fifteen_minute, hour, day, month; got string 'week'",
                "specs/clicks.yaml:10:15: dataSchema.dimensions: items must be unique",
                "specs/clicks.yaml:11:3: dataSchema.x: unknown key",
            ],
            id="several-sorted-by-line",
        ),
        pytest.param(
            KAFKA.replace(
                "  topic: clicks\n", "  topic: clicks\n  consumerProperties: {sasl: [x]}\n"
            ),
            [
                "specs/clicks.yaml:6:30: source.consumerProperties.sasl: expected string, integer, number or "
                "boolean, got a list"
            ],
            id="consumer-property-list",
        ),
    ],
)
def test_problems(text, expected):
    found = check(text)
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert got.startswith(want), (got, want)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", [], id="empty-is-defaults"),
        pytest.param("resetTo: earliest\nbackfill: false\nreason: INC-42\n", [], id="earliest"),
        pytest.param(
            "resetTo: {offsets: {'0': 1200, '1': 900}}\nbackfillTaskCount: 4\n", [], id="offsets"
        ),
        pytest.param("resetTo: {timestamp: '-30m'}\n", [], id="relative-timestamp"),
        pytest.param(
            "resetTo: {timestamp: '2999-01-01'}\n",
            ["specs/clicks.yaml:1:22: resetTo.timestamp: timestamp 2999-01-01 is in the future"],
            id="future-timestamp",
        ),
        pytest.param(
            "resetTo: lates\n",
            [
                "specs/clicks.yaml:1:10: resetTo: must be one of: earliest, latest, {timestamp: ...}, "
                "{offsets: {...}}, {shiftBy: N}; got string 'lates' (did you mean 'latest'?)"
            ],
            id="reset-typo",
        ),
        pytest.param(
            "backfil: true\n",
            ["specs/clicks.yaml:1:1: backfil: unknown key (did you mean 'backfill'?)"],
            id="marker-key-typo",
        ),
        pytest.param(
            "backfill: maybe\n",
            ["specs/clicks.yaml:1:11: backfill: expected boolean, got string 'maybe'"],
            id="marker-backfill-type",
        ),
    ],
)
def test_marker_documents(text, expected):
    found = check(text, "marker")
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert got.startswith(want), (got, want)


def test_validate_data_without_positions():
    problems = validate_data({"resetTo": "sideways"}, "marker", path="<cli>", now=NOW)
    assert [str(p) for p in problems] == [
        "<cli>: resetTo: must be one of: earliest, latest, {timestamp: ...}, {offsets: {...}}, {shiftBy: N}; "
        "got string 'sideways'"
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param("2x", "string '2x'", id="str"),
        pytest.param(True, "boolean true", id="bool"),
        pytest.param(3, "integer 3", id="int"),
        pytest.param(None, "nothing (an empty value)", id="none"),
        pytest.param({}, "a mapping", id="mapping"),
        pytest.param([], "a list", id="list"),
    ],
)
def test_describe_value(value, text):
    assert describe_value(value) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("-2h", NOW - timedelta(hours=2), id="hours"),
        pytest.param("-30m", NOW - timedelta(minutes=30), id="minutes"),
        pytest.param("-1d", NOW - timedelta(days=1), id="days"),
        pytest.param("-1h30m", NOW - timedelta(minutes=90), id="combined"),
        pytest.param("-90s", NOW - timedelta(seconds=90), id="seconds"),
        pytest.param("2026-11-20T10:00:00Z", datetime(2026, 11, 20, 10, tzinfo=UTC), id="iso-z"),
        pytest.param(
            "2026-11-20T11:00:00+01:00", datetime(2026, 11, 20, 10, tzinfo=UTC), id="iso-offset"
        ),
        pytest.param(
            "2026-11-20 10:00:00", datetime(2026, 11, 20, 10, tzinfo=UTC), id="naive-is-utc"
        ),
        pytest.param("2026-11-19", datetime(2026, 11, 19, tzinfo=UTC), id="date"),
    ],
)
def test_parse_timestamp(text, expected):
    assert parse_timestamp(text, NOW) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("soon", "not a timestamp: 'soon'", id="word"),
        pytest.param("", "not a timestamp", id="empty"),
        pytest.param("2h", "start with '-' (e.g. -2h)", id="forward-relative"),
        pytest.param("+2h", "start with '-' (e.g. -2h)", id="plus-relative"),
        pytest.param("2026-11-20T13:00:00Z", "is in the future", id="future"),
        pytest.param("2026-13-01", "not a timestamp", id="bad-month"),
    ],
)
def test_parse_timestamp_rejects(text, message):
    with pytest.raises(
        TimestampError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")
    ):
        parse_timestamp(text, NOW)


def test_parse_timestamp_future_allowed_on_request():
    assert parse_timestamp("2999-01-01", NOW, allow_future=True).year == 2999


LAG_POLICY = """\
lagPolicy:
  maxRecords: 5000000
  maxLag: 1h
  for: 2m
  action: resetToLatestAndBackfill
  cooldown: 1h
  backfillTaskCount: 4
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(KAFKA + LAG_POLICY, [], id="the-issue-example"),
        pytest.param(KAFKA + "lagPolicy: {maxLag: 30m}\n", [], id="time-only-alert-by-default"),
        pytest.param(KAFKA + "lagPolicy: {for: 2m, action: alert}\n",
                     ["specs/clicks.yaml:9:1: lagPolicy: needs at least one of: maxRecords, maxLag"], id="no-threshold"),
        pytest.param(KAFKA + LAG_POLICY.replace("resetToLatestAndBackfill", "resetToLatest"),
                     ["specs/clicks.yaml:13:11: lagPolicy.action: must be one of: resetToLatestAndBackfill, alert; "
                      "got string 'resetToLatest' (did you mean 'resetToLatestAndBackfill'?)"], id="unknown-action"),
        pytest.param(KAFKA + LAG_POLICY.replace("maxLag: 1h", "maxLag: 1 hour"),
                     ["specs/clicks.yaml:11:11: lagPolicy.maxLag: '1 hour' is not a duration (use e.g. 500ms, 30s, "
                      "5m, 1h)"], id="bad-duration"),
        pytest.param(KAFKA + LAG_POLICY.replace("cooldown:", "coolDown:"),
                     ["specs/clicks.yaml:14:3: lagPolicy.coolDown: unknown key (did you mean 'cooldown'?)"],
                     id="misspelled-key"),
    ],
)
def test_lag_policy(text, expected):
    assert check(text) == expected


# Issue 41.1: `for: 100000000h` passed, then overflowed the date it was added to and stopped every pass.
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(KAFKA + LAG_POLICY.replace("for: 2m", "for: 100000000h"),
                     ["specs/clicks.yaml:12:8: lagPolicy.for: '100000000h' is too long: at most 87600h (10 years)"],
                     id="for"),
        pytest.param(KAFKA + LAG_POLICY.replace("cooldown: 1h", "cooldown: 87601h"),
                     ["specs/clicks.yaml:14:13: lagPolicy.cooldown: '87601h' is too long: at most 87600h (10 years)"],
                     id="cooldown"),
        pytest.param(KAFKA + LAG_POLICY.replace("maxLag: 1h", "maxLag: " + "9" * 400 + "h"),
                     ["specs/clicks.yaml:11:11: lagPolicy.maxLag: '" + "9" * 400 + "h' is too long: at most 87600h "
                      "(10 years)"], id="maxLag-beyond-a-float"),
        pytest.param(KAFKA + "taskDuration: 315360001s\n",
                     ["specs/clicks.yaml:9:15: taskDuration: '315360001s' is too long: at most 87600h (10 years)"],
                     id="taskDuration"),
        pytest.param(KAFKA + LAG_POLICY.replace("for: 2m", "for: 87600h").replace("cooldown: 1h", "cooldown: 5256000m"),
                     [], id="at-the-bound"),
    ],
)
def test_every_duration_has_an_upper_bound(text, expected):
    assert check(text) == expected


_DIMS = "dimensions: [user, page, __partition, __offset]"


@pytest.mark.parametrize("dims", [
    # Rollup (the tasks' and compaction's) names its results itself: a dimension named as
    # pyarrow would name a metric's result ingests and compacts
    # (tests/spec/test_rollup_names.py).
    pytest.param("[user, bytes_sum]", id="longSum-result"),
    pytest.param("[count_sum]", id="count-result"),
    pytest.param("[count_all, bytes_min, Bytes_Sum]", id="others"),
])
def test_rollup_result_names_never_clash_with_a_dimension(dims):
    assert check(FULL.replace(_DIMS, f"dimensions: {dims}")) == []
    assert check(FULL.replace(_DIMS, f"dimensions: {dims}").replace("rollup: true", "rollup: false")) == []
