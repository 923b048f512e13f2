"""The readers' JSON fields (reconciler.pipeline.jsonfields): what goes to Spark's from_json
instead, and that a record parsed either way gives exactly the same rows and dead letters."""

# ruff: noqa: UP031 - %-formatting keeps the JSON's braces readable (f-strings double them)
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from reconciler.model import KafkaSource, Metric, PartitionRange
from reconciler.pipeline.jsonfields import (
    FAST,
    SAFE_TIMESTAMP_DIGITS,
    VALUE_BYTES,
    FieldParser,
    field_column,
    shed_values,
)
from reconciler.pipeline.sources import read_options
from reconciler.pipeline.transform import CORRUPT_COLUMN, json_fields, transform
from tests.pipeline.test_transform import T0_MS, records, rows, schema, with_reader_fields

FIELDS = ["ts", "d", "n"]


def parse(values, parser=None):
    parser = parser or FieldParser(FIELDS, CORRUPT_COLUMN)
    raw = [v.encode() if isinstance(v, str) else v for v in values]
    return parser.parse(pa.array(raw, pa.binary()))


def texts(values, parser=None):
    out = parse(values, parser)
    assert out is not None, values
    return out[0].to_pylist(), [c.to_pylist() for c in out[1:]]


# --------------------------------------------------------------------------- without Spark


def test_clean_records_are_parsed_to_from_json_text():
    fast, (ts, d, n) = texts(
        [
            '{"ts": 1795500000000, "d": "a\\u00e9\\ud83d\\ude00", "n": 5, "other": {"x": [1.5]}}',
            '{"d": null, "n": -12}',
            None,
            '{"ts": 9223372036854775807, "d": "x\\u0000y"}',
        ]
    )
    assert fast == [True, True, False, True]
    assert ts == ["1795500000000", None, None, "9223372036854775807"]
    assert d == ["aé😀", None, None, "x\x00y"]
    assert n == ["5", "-12", None, None]
    # Integers and booleans under any field come as Jackson writes them back.
    assert texts(['{"ts": -0, "d": true, "n": false}'])[1] == [["0"], ["true"], ["false"]]


def test_a_field_of_two_types_in_one_batch_goes_to_spark():
    assert parse(['{"d": "a"}', '{"d": 1}']) is None
    assert parse(['{"d": "a", "o": 1}', '{"d": 1, "o": "x"}']) is None  # also when learning
    assert texts(['{"d": "a"}'])[1][1] == ["a"] and texts(['{"d": 1}'])[1][1] == ["1"]


def test_an_unread_field_of_two_types_does_not_stop_the_parse():
    # pyarrow's inference fails on "o"; the read fields' types are learnt one error at a time.
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    batch = [
        '{"ts": 1, "d": true, "n": "x", "o": 1}',
        '{"ts": 2, "d": false, "o": "one"}',
        '{"ts": 3, "o": [1, {"a": 2}]}',
    ]
    fast, (ts, d, n) = texts(batch, parser)
    assert fast == [True, True, True]
    assert (ts, d, n) == (["1", "2", "3"], ["true", "false", None], ["x", None, None])
    assert texts(['{"ts": 4, "d": true, "o": null}'], parser)[1][1] == ["true"]  # remembered


def test_learning_starts_from_the_remembered_types():
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    assert texts(['{"ts": 1, "n": true}'], parser)[0] == [True]  # "d" absent: remembered as null
    batch = ['{"ts": 2, "d": "a", "n": false, "o": 1}', '{"ts": 3, "d": "b", "o": "one"}']
    assert texts(batch, parser)[1] == [["2", "3"], ["a", "b"], ["false", None]]


@pytest.mark.parametrize(
    "odd",
    [
        '{"ts": 2.5, "o": "x"}',  # a float where an integer was learnt
        '{"ts": 2, "__reconciler_corrupt_record": "x", "o": "x"}',
        '{"ts": 2, "d": {"k": 1}, "o": "x"}',
    ],
)
def test_learning_still_leaves_odd_records_to_spark(odd):
    assert parse(['{"ts": 1, "d": "a", "o": 1}', odd]) is None


@pytest.mark.parametrize(
    "value",
    [
        b'{"d": "\xff"}',  # invalid UTF-8: Spark reads U+FFFD
        b'\xef\xbb\xbf{"d": "bom"}',
        ' {"d": "leading space"}',
        '{"d":\n"line break"}',
        '{"d": "cr"}\r',
        '{"d": "\\ud800"}',  # a lone surrogate: Spark gives "?"
        '{"d": "a", "d": "b"}',  # Spark keeps the last
        '{"d": "a", "\\u0064": "b"}',  # the same key, escaped
        '{"d": 1.5}',  # Jackson re-renders floats through a double
        '{"d": 1e3}',
        '{"d": 12345678901234567890}',
        '{"d": {"x": 1}}',
        '{"d": [1]}',
        '{"d": NaN}',
        "{'d': 'single quotes'}",
        '{"d": 012}',
        '{"d": "a"} trailing',
        '{"d": "a"} {"d": "b"}',
        '{"d": "tab\there"}',
        "[1, 2]",
        "42",
        "",
        "not json",
        '{"ts": 1',
        '{"__reconciler_corrupt_record": "x"}',
        '{"d": "a"} ',
        '{"d": "x", "o": Inf}',  # pyarrow reads these, Spark's Jackson does not
        '{"d": "x", "o": [-Inf]}',
        '{"d": "x", "o": -NaN}',
        '{"d": "x", "o": ' + "[" * 1000 + "]" * 1000 + "}",  # Spark's nesting limit
        '{"d": "x", "o": ' + '{"a":' * 1000 + "1" + "}" * 1000 + "}",
        '{"d": "x", "o": ' + "1" * 1001 + "}",  # Spark's number length limit
        '{"d": "x", "' + "k" * 50_001 + '": 1}',  # Jackson's name length limit
    ],
)
@pytest.mark.parametrize("primed", [False, True])
def test_records_spark_must_read_go_to_spark(value, primed):
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    if primed:  # the reader has read a batch: the next is read with an explicit schema
        assert texts(['{"ts": 1, "d": "ok"}'], parser)[0] == [True]
    assert parse(['{"ts": 1, "d": "ok"}', value], parser) is None
    raw = value.encode() if isinstance(value, str) else value
    assert parser.columns(pa.array([raw], pa.binary()))[0].to_pylist() == [False]


def test_a_cut_record_cannot_swallow_the_next():
    # Joined by "\n", the first would run into the second; the second holds two objects,
    # so the row count alone would come out right.
    batch = ['{"ts": 1, "d": "a", "o":', '{"x": 1}}{"ts": 2, "d": "b"}']
    assert parse(batch) is None
    primed = FieldParser(FIELDS, CORRUPT_COLUMN)
    texts(['{"ts": 1, "d": "ok"}'], primed)
    assert parse(batch, primed) is None


@pytest.mark.parametrize(
    "value, d",
    [
        ('{"ts": 1, "d": "%s", "o": [[[1]]]}' % ("x" * 5000), "x" * 5000),
        ('{"ts": 2, "d": "Information: Infinite -NaNs", "o": NaN}', "Information: Infinite -NaNs"),
        ('{"ts": 3, "d": "y", "o": [Infinity, -Infinity]}', "y"),
    ],
)
def test_within_the_limits_and_look_alikes_stay_fast(value, d):
    assert texts([value])[1][1] == [d]


def test_tombstones_teach_the_reader_nothing():
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    assert texts(['{"ts": 1, "d": "a"}'], parser)[0] == [True]
    schema = parser._schema
    cols = parser.columns(pa.array([None, None], pa.binary()))
    assert cols[0].to_pylist() == [False, False] and cols[1].null_count == 2
    assert parser._schema == schema


def test_an_iso_timestamp_goes_to_spark_once_then_is_read_as_text():
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    iso = ['{"ts": "2026-11-24T10:00:00Z", "d": "a"}']
    assert parse(iso, parser) is None  # pyarrow's inference turned it into a timestamp
    fast, (ts, d, _) = texts(iso, parser)  # now read with ts as a string
    assert fast == [True] and ts == ["2026-11-24T10:00:00Z"] and d == ["a"]


def test_types_change_between_batches():
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    assert texts(['{"ts": 1, "d": 7}'], parser)[1][1] == ["7"]
    assert texts(['{"ts": 2, "d": "seven"}'], parser)[1][1] == ["seven"]
    assert texts(['{"ts": "3", "d": false}'], parser)[1] == [["3"], ["false"], [None]]


def test_a_reader_stops_trying_after_batches_that_went_to_spark():
    parser = FieldParser(FIELDS, CORRUPT_COLUMN)
    floats = pa.array([b'{"ts": 1, "d": 1.5}'], pa.binary())
    clean = pa.array([b'{"ts": 1, "d": "x"}'], pa.binary())
    for _ in range(3):
        assert parser.columns(floats)[0].to_pylist() == [False]
    assert parser.columns(clean)[0].to_pylist() == [False]  # given up
    assert FieldParser(FIELDS, CORRUPT_COLUMN).columns(clean)[0].to_pylist() == [True]


def test_the_columns_fit_the_fields():
    parser = FieldParser(["a", "b"], CORRUPT_COLUMN)
    cols = parser.columns(pa.array([b'{"a": "x"}', b"bad"], pa.binary()))
    assert [c.type for c in cols] == [pa.bool_(), pa.string(), pa.string()]
    assert cols[0].to_pylist() == [False, False] and cols[1].null_count == 2


def shed(timestamps, fmt, fast=None, values=None):
    """``shed_values`` on one record per timestamp text: (kept values, shed lengths)."""
    n = len(timestamps)
    values = values or [b'{"ts": %d}' % i for i in range(n)]
    fast = [True] * n if fast is None else fast
    kept, lengths = shed_values(
        pa.array(values, pa.binary()), pa.array(fast, pa.bool_()), pa.array(timestamps, pa.string()), fmt
    )
    assert lengths.type == pa.int32() and len(kept) == len(lengths) == n
    return kept.to_pylist(), lengths.to_pylist()


@pytest.mark.parametrize("fmt", ["millis", "auto"])
def test_a_value_is_shed_only_when_its_timestamp_is_a_safe_integer(fmt):
    safe = ["1795500000000", "0", "-0", "-5", "253402300799999", "-62135596800000", "007"]
    unsafe = [
        "9" * 16, "-" + "9" * 16,  # could overflow the micros
        "9" * 15, "253402300800000", "-62135596800001",  # outside years 1 to 9999: dead letters
        "1.5", "1e3", " 1", "1 ", "+1", "-", "--5", "", "0x10",
        "\u0663", "\uff11", "1\u0663",  # non-ASCII digits: Spark's cast takes ASCII only
        "2026-11-24T10:00:00Z", "abc", None,
    ]
    unsafe = [json.loads('"%s"' % t) if t is not None else None for t in unsafe]
    values = [b"v%d" % i for i in range(len(safe) + len(unsafe))]
    kept, lengths = shed(safe + unsafe, fmt, values=values)
    assert kept == [None] * len(safe) + values[len(safe):]
    assert lengths == [len(v) for v in values[: len(safe)]] + [None] * len(unsafe)


def test_the_seconds_limit_is_lower_and_iso_never_sheds():
    texts = ["253402300799", "-62135596800", "253402300800", "-62135596801", "9" * 13]
    kept, lengths = shed(texts, "seconds", values=[b"a", b"bb", b"c", b"d", b"e"])
    assert kept == [None, None, b"c", b"d", b"e"] and lengths == [1, 2, None, None, None]


def test_auto_sheds_by_the_unit_it_reads_the_number_in():
    # Up to 1e11 in magnitude auto reads seconds, so -1e11 is before the year 1; one more is millis.
    texts = ["-62135596800", "-62135596801", "-100000000000", "-100000000001", "99999999999", "253402300800000"]
    kept, _ = shed(texts, "auto", values=[b"%d" % i for i in range(6)])
    assert kept == [None, b"1", b"2", None, None, b"5"]
    for fmt in ("iso", None, "unknown"):
        kept, lengths = shed(["1", "2"], fmt)
        assert kept == [b'{"ts": 0}', b'{"ts": 1}'] and lengths == [None, None]


def test_records_spark_parses_keep_their_values():
    kept, lengths = shed(["1", "2", "3"], "millis", fast=[True, False, None])
    assert kept == [None, b'{"ts": 1}', b'{"ts": 2}'] and lengths == [9, None, None]
    # Without a timestamp column nothing is shed.
    values = pa.array([b"{}"], pa.binary())
    kept, lengths = shed_values(values, pa.array([True]), None, "millis")
    assert kept is values and lengths.to_pylist() == [None]


def test_a_whole_batch_shed_becomes_a_null_array():
    kept, lengths = shed(["1", "22", "333"], "millis", values=[b"a", b"bb", b"ccc"])
    assert kept == [None] * 3 and lengths == [1, 2, 3]


# --------------------------------------------------------------------------- through Spark

# Values for a data schema reading "ts", "d" (a dimension), "n" (a long metric) and
# "x" (a double metric): each is a record Spark reads in its own way, or a clean one.
CORPUS = [
    {"ts": T0_MS, "d": "plain", "n": 3, "x": 2},
    {"ts": T0_MS, "d": "é😀\u0000\\\"/", "n": "4", "x": "2.5"},
    '{"ts": %d, "d": "\\ud83d\\ude00 \\u00e9 \\/"}' % T0_MS,
    '{"ts": %d, "d": -0, "n": -0}' % T0_MS,
    '{"ts": %d, "d": true, "n": false}' % T0_MS,
    '{"ts": %d, "d": 1.50, "x": 1e3}' % T0_MS,
    '{"ts": %d, "d": 9223372036854775808}' % T0_MS,
    '{"ts": %d, "d": {"k": [1, 2.0, "x"]}}' % T0_MS,
    '{"ts": %d, "d": "\\ud800"}' % T0_MS,
    '{"ts": %d, "d": "a", "d": "b"}' % T0_MS,
    '{"ts": %d, "x": NaN, "d": "nan"}' % T0_MS,
    '{"ts": %d, "x": 1e999}' % T0_MS,
    "{'ts': %d, 'd': 'quotes'}" % T0_MS,
    '{"ts": %d, "d": "bom"}' % T0_MS,
    '\ufeff{"ts": %d, "d": "bom"}' % T0_MS,
    '  {"ts": %d, "d": "spaces"}  ' % T0_MS,
    '{"ts":\n%d, "d": "newline"}' % T0_MS,
    '{"ts": %d, "d": "tab\there"}' % T0_MS,
    b'{"ts": 1795500000000, "d": "\xff\xfe"}',
    '{"ts": %d, "__reconciler_corrupt_record": "sneaky"}' % T0_MS,
    '{"ts": %d, "D": "case", "us\\u0065r": "escaped key", "d": "k"}' % T0_MS,
    '{"ts": "2025-11-20T12:34:56.789Z", "d": "iso"}',
    '{"ts": "%d", "d": "string ts"}' % T0_MS,
    '{"ts": %d.5, "d": "float ts"}' % T0_MS,
    '{"ts": -9223372036854775808, "d": "min long"}',
    '{"ts": null, "d": "null ts"}',
    '{"d": "no ts"}',
    '{"ts": %d} trailing' % T0_MS,
    '{"ts": %d, "d": 012}' % T0_MS,
    "{}",
    "[]",
    "null",
    "",
    None,
    '{"ts": %d, "\\u0064": "escaped key"}' % T0_MS,
    '{"ts": %d, "d": "a", "\\u0064": "b"}' % T0_MS,
    '{"ts": %d, "d": "cut", "o":' % T0_MS,
    '{"x": 1}}{"ts": %d, "d": "two objects"}' % T0_MS,
    '{"ts": %d, "d": "deep", "o": %s}' % (T0_MS, "[" * 1001 + "]" * 1001),
    '{"ts": %d, "d": "long number", "o": %s}' % (T0_MS, "1" * 1001),
    '{"ts": %d, "d": "long name", "%s": 1}' % (T0_MS, "k" * 50_001),
    '{"ts": %d, "d": "nan", "o": NaN}' % T0_MS,
    '{"ts": %d, "d": "infinity", "o": [Infinity, -Infinity]}' % T0_MS,
    '{"ts": %d, "d": "inf", "o": Inf}' % T0_MS,
    '{"ts": %d, "d": "-nan", "o": -NaN}' % T0_MS,
    '{"ts": %d, "d": "Information: Inf"}' % T0_MS,
    '{"ts": %d, "d": "%s"}' % (T0_MS, "long " * 400),
]


@pytest.mark.spark
@pytest.mark.parametrize("per_batch, shared", [(1, False), (2, True), (len(CORPUS), True)])
def test_reader_fields_give_exactly_what_from_json_gives(spark, per_batch, shared):
    ds = schema(
        dimensions=("d", "__offset"),
        metrics=(Metric("n", "longSum", "n"), Metric("x", "doubleMax", "x")),
    )
    assert json_fields(ds) == ["ts", "d", "n", "x"]
    plain = records(spark, CORPUS)
    with_fields = with_reader_fields(plain, ds, per_batch, shared_parser=shared)
    good_a, dead_a = transform(plain, ds)
    good_b, dead_b = transform(with_fields, ds)
    assert FAST in with_fields.columns and FAST not in plain.columns
    assert rows(good_b, ["__offset"]) == rows(good_a, ["__offset"])
    assert rows(dead_b, ["offset"]) == rows(dead_a, ["offset"])
    fast = [r[FAST] for r in with_fields.orderBy("offset").select(FAST).collect()]
    if per_batch == 1:
        # Exactly the records pyarrow reads as Spark does took the fast path.
        fast_offsets = {i for i, f in enumerate(fast) if f}
        assert fast_offsets == {0, 1, 2, 3, 4, 13, 20, 21, 22, 24, 25, 26, 29, 34, 41, 42, 45, 46}, fast_offsets
    else:
        # A batch with an odd record goes to Spark whole (and a reader gives up after three).
        assert not any(fast)


def assert_same_rows(plain, with_fields, ds):
    """Both frames give the same good rows and dead letters; returns the dead letters."""
    good_a, dead_a = transform(plain, ds)
    good_b, dead_b = transform(with_fields, ds)
    assert rows(good_b, ["__time"]) == rows(good_a, ["__time"])
    dead = rows(dead_b, ["offset"])
    assert dead == rows(dead_a, ["offset"])
    return dead


@pytest.mark.spark
def test_a_clean_batch_takes_the_fast_path_whole(spark):
    values = [
        {"ts": T0_MS + i, "d": f"u{i % 7}", "n": i, "x": i % 3} for i in range(500)
    ] + [None]
    ds = schema(dimensions=("d",), metrics=(Metric("n", "longSum", "n"), Metric("x", "doubleMax", "x")))
    plain = records(spark, values)
    with_fields = with_reader_fields(plain, ds, 128, shared_parser=True)
    assert with_fields.where(FAST).count() == 500
    dead = assert_same_rows(plain, with_fields, ds)
    assert [r["reason"] for r in dead] == ["null value"]


@pytest.mark.spark
def test_a_batch_whose_unread_field_has_two_types_is_parsed_the_same(spark):
    values = [
        {"ts": T0_MS + i, "d": [f"u{i}", i, True][i % 3], "o": [1, "one", [1.5], None][i % 4]}
        for i in range(40)
    ]
    ds = schema(dimensions=("d",))
    plain = records(spark, values)
    with_fields = with_reader_fields(plain, ds, 40, shared_parser=False)
    assert with_fields.where(FAST).count() == 0  # "d" has three types: left to Spark
    values = [{"ts": T0_MS + i, "d": f"u{i}", "o": [1, "one", [1.5], None][i % 4]} for i in range(40)]
    plain = records(spark, values)
    with_fields = with_reader_fields(plain, ds, 40, shared_parser=False)
    assert with_fields.where(FAST).count() == 40
    assert assert_same_rows(plain, with_fields, ds) == []


@pytest.mark.spark
@pytest.mark.parametrize(
    "timestamp, shed",
    [
        (None, False),
        (("ts", "millis"), True),
        (("ts", "iso"), False),  # an ISO timestamp is Spark's to judge
        (("__key", "millis"), False),  # a virtual timestamp is not a parsed field
        (("user", "millis"), False),  # a field, but its text is not an integer
    ],
)
def test_the_range_data_source_adds_the_fields(spark, fakes, timestamp, shed):
    fakes.register(spark)
    opts = read_options(
        KafkaSource("unused:1", "t"),
        [PartitionRange("0", 0, 300), PartitionRange("1", 0, 200)],
        2,
        json_fields=["ts", "user", "bytes", "absent"],
        json_corrupt_column=CORRUPT_COLUMN,
        json_timestamp=timestamp,
        maxBatchRows=64,
    )
    df = spark.read.format("fake_range").options(**opts).load()
    assert df.columns[-6:] == [FAST, *(field_column(i) for i in range(4)), VALUE_BYTES]
    got = df.toArrow().to_pylist()
    assert len(got) == 500 and all(r[FAST] for r in got)
    if shed:
        # Every value is shed (its millis timestamp is safe); the reader kept their lengths.
        assert all(r["value"] is None and r[VALUE_BYTES] > 0 for r in got)
        return
    assert all(r[VALUE_BYTES] is None for r in got)
    for r in got:
        value = json.loads(r["value"])
        assert r[field_column(0)] == str(value["ts"])
        assert r[field_column(1)] == value["user"]
        assert r[field_column(2)] == str(value["bytes"])
        assert r[field_column(3)] is None


@pytest.mark.spark
@pytest.mark.parametrize("fmt", sorted(SAFE_TIMESTAMP_DIGITS))
def test_shed_values_are_good_rows_and_still_counted(spark, fmt):
    from pyspark.sql import Observation

    from reconciler.pipeline.transform import dead_rows, parse

    # The extreme integers shed_values lets through: the first and the last instant of
    # years 1 to 9999 in the format's unit ("auto" reads these millis and seconds).
    last, first = {"millis": (253402300799999, -62135596800000), "seconds": (253402300799, -62135596800),
                   "auto": (253402300799999, -62135596800)}[fmt]
    values = [{"ts": t, "d": "x"} for t in (last, first, 0, T0_MS // 1000)]
    values += ["not json", {"ts": "soon", "d": "y"}, {"ts": 1.5, "d": "z"}, None, {"ts": last + 1, "d": "w"}]
    ds = schema(dimensions=("d",), timestamp_format=fmt)
    plain = records(spark, values)
    with_fields = with_reader_fields(plain, ds, 1, shared_parser=False)
    got = with_fields.orderBy("offset").toArrow()
    assert got.column(VALUE_BYTES).is_valid().to_pylist() == [True] * 4 + [False] * 5
    assert got.column("value").null_count == 4 + 1  # the shed ones and the tombstone
    (good_a, dead_a), (good_b, dead_b) = transform(plain, ds), transform(with_fields, ds)
    assert good_b.toArrow().sort_by("__time").equals(good_a.toArrow().sort_by("__time"))
    assert good_a.count() == 5  # 1.5 is a time too, left to Spark
    dead = rows(dead_b, ["offset"])
    assert dead == rows(dead_a, ["offset"])
    assert [r["value"] is not None for r in dead] == [True, True, False, True]  # dead letters keep theirs
    assert dead[-1]["reason"] == f"timestamp out of range (years 1 to 9999): {last + 1}"
    counts = []
    for df in (plain, with_fields):
        obs = Observation()
        dead_rows(parse(df, ds, observation=obs)).count()
        counts.append(obs.get)
    raw = plain.toArrow().to_pylist()
    assert counts[0] == counts[1] == {
        "records": 9,
        "dead": 4,
        "bytes": sum(len(r["key"] or b"") + len(r["value"] or b"") for r in raw),
    }
