"""Transformer: JSON parsing, timestamps, virtual columns, granularity, rollup, dead letters."""

from __future__ import annotations

import json
import math
import random
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from reconciler.model import DataSchema, Metric
from reconciler.pipeline import rollup
from reconciler.pipeline.transform import (
    DEAD_COLUMNS,
    Transformer,
    chunk_interval,
    chunk_of,
    output_columns,
)
from reconciler.streams.base import record_schema

# Every test here runs three ways, each must give exactly the same rows and dead letters:
# every record parsed by the per-record Python parser (the JSON rules' reference), and
# the bulk parser (reconciler.pipeline.jsonfields) over one record per batch (a fresh
# parser for each: pyarrow infers) and two per batch (one Transformer for all, as a
# Spark task has: explicit types after the first batch).
PARSE_MODES = ("python", "bulk-record", "bulk-pairs")


def run(batch: pa.RecordBatch, ds: DataSchema, mode: str) -> tuple[pa.Table, pa.Table]:
    """(rows, dead letters) of ``batch`` through a Transformer, parsed as ``mode`` says."""
    t = Transformer(ds, bulk=mode != "python")
    per_batch = {"python": max(1, batch.num_rows), "bulk-record": 1, "bulk-pairs": 2}[mode]
    rows, dead = [], []
    records = size = 0
    for start in range(0, batch.num_rows, per_batch):
        if mode == "bulk-record":  # a fresh parser: nothing learnt from the last record
            t.format._parser = None  # the JSON format builds a fresh one
        out = t(batch.slice(start, per_batch))
        rows.append(out.rows)
        dead.append(out.dead)
        records += out.records
        size += out.bytes
    end = t.finish()
    assert end.records == 0 and end.dead.num_rows == 0
    rows.append(end.rows)
    assert records == batch.num_rows
    assert size == sum(len(k or b"") + len(v or b"") for k, v in
                       zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True))
    empty_rows, empty_dead = Transformer(ds).finish().rows, Transformer(ds).finish().dead
    return pa.concat_tables([empty_rows, *rows]), pa.concat_tables([empty_dead, *dead])


@pytest.fixture(autouse=True, params=PARSE_MODES)
def parse_mode(request):
    return request.param


@pytest.fixture(autouse=True)
def _transform_by_mode(parse_mode, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "transform",
                        lambda batch, ds: run(batch, ds, parse_mode))


def transform(batch, ds):  # replaced per test by _transform_by_mode
    raise AssertionError("the parse_mode fixture did not run")


T0 = datetime(2025, 11, 20, 12, 34, 56, 789000, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def encode(v) -> bytes | None:
    if isinstance(v, dict):
        v = json.dumps(v)
    return v.encode() if isinstance(v, str) else v


def records(values, *, keys=None, partition="3", first_offset=100, stream_ms=None, unit="ms"):
    """A record batch (the readers' columns) from JSON values (dict, str, bytes or None)."""
    n = len(values)
    keys = keys if keys is not None else [f"key-{i}".encode() for i in range(n)]
    stream = stream_ms if stream_ms is not None else [T0_MS + i for i in range(n)]
    scale = 1000 if unit == "us" else 1
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * n, pa.string()),
            pa.array(range(first_offset, first_offset + n), pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array([encode(v) for v in values], pa.binary()),
            pa.array([s * scale for s in stream], pa.timestamp(unit, tz="UTC")),
        ],
        schema=record_schema(unit),
    )


def rows(table: pa.Table, order_by=None):
    if order_by:
        table = table.sort_by([(c, "ascending") for c in order_by])
    return table.to_pylist()


def schema(**kw) -> DataSchema:
    kw.setdefault("datasource", "d")
    kw.setdefault("timestamp_column", "ts")
    return DataSchema(**kw)


def ts_of(value, fmt):
    good, dead = transform(records([{"ts": value}]), schema(timestamp_format=fmt))
    got = rows(good)
    return got[0]["__time"] if got else None


# --------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize(
    "value, fmt, expected",
    [
        (T0_MS, "auto", T0),
        (T0_MS / 1000, "auto", T0),  # seconds with a fraction
        (int(T0.timestamp()), "auto", T0.replace(microsecond=0)),
        (str(T0_MS), "auto", T0),  # a number in a string
        ("2025-11-20T12:34:56.789Z", "auto", T0),
        ("2025-11-20T14:34:56.789+02:00", "auto", T0),
        ("2025-11-20 12:34:56.789", "auto", T0),  # no offset: UTC
        ("2025-11-20T12:34:56.789Z", "iso", T0),
        ("2025-11-20T12:34Z", "iso", T0.replace(second=0, microsecond=0)),
        ("2025-11-20", "iso", T0.replace(hour=0, minute=0, second=0, microsecond=0)),
        (T0_MS, "millis", T0),
        (str(T0_MS), "millis", T0),
        (T0_MS / 1000, "seconds", T0),
        (1_000, "millis", datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
        (1_000, "seconds", datetime(1970, 1, 1, 0, 16, 40, tzinfo=UTC)),
        (1_000, "auto", datetime(1970, 1, 1, 0, 16, 40, tzinfo=UTC)),  # small: seconds
        # integers take the exact long path; fractions and exponents the double path
        (-1_000, "auto", datetime(1969, 12, 31, 23, 43, 20, tzinfo=UTC)),
        (-T0_MS, "auto", datetime(1970, 1, 1, tzinfo=UTC) - (T0 - datetime(1970, 1, 1, tzinfo=UTC))),
        ("1.5", "millis", datetime(1970, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)),
        ("1.0", "seconds", datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
        ("1e3", "millis", datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
        (str(T0_MS / 1000), "auto", T0),  # seconds with a fraction, in a string
        (int(T0.timestamp()) * 1000, "millis", T0.replace(microsecond=0)),
    ],
)
def test_timestamp_formats(value, fmt, expected):
    assert ts_of(value, fmt) == expected


@pytest.mark.parametrize(
    "value, fmt",
    [
        ("yesterday", "auto"),
        (T0_MS, "iso"),
        ("2025-11-20T12:00:00Z", "millis"),
        (True, "auto"),
        ({"a": 1}, "auto"),
        ("NaN", "seconds"),
        (1e300, "seconds"),
        # out of a long's range as micros: null, never an overflow error that fails the batch
        (9_223_372_036_854_775_807, "millis"),
        (-9_223_372_036_854_775_808, "auto"),
        (9_223_372_036_854_775, "seconds"),
    ],
)
def test_unparseable_timestamps_are_dead(value, fmt):
    good, dead = transform(records([{"ts": value}]), schema(timestamp_format=fmt))
    assert rows(good) == []
    (d,) = rows(dead)
    assert d["reason"].startswith(f"unparseable timestamp ({fmt})")


def test_time_is_utc_timestamp_column():
    good, _ = transform(records([{"ts": T0_MS}]), schema())
    arrow = good
    assert arrow.schema.field("__time").type == pa.timestamp("us", tz="UTC")
    assert arrow.schema.field("time_chunk").type == pa.string()


# --------------------------------------------------------------------------- dead letters


def test_dead_letters_with_reasons():
    values = [
        {"ts": T0_MS, "user": "ok"},
        "not json",
        "[1, 2]",
        "42",
        '{"ts": 1',
        {"user": "no ts"},
        {"ts": None, "user": "null ts"},
        {"ts": "soon"},
        None,
        b"\xff\xfe",
        "",
        {"ts": 253_402_300_800_000},  # 10000-01-01 in millis: no chunk, no Iceberg partition
        {"ts": -62_135_596_801},  # a second before the year 1 (auto reads this as seconds)
    ]
    good, dead = transform(records(values), schema(dimensions=("user",)))
    assert [r["user"] for r in rows(good)] == ["ok"]
    got = rows(dead, ["offset"])
    assert list(got[0]) == list(DEAD_COLUMNS)
    reasons = {r["offset"] - 100: r["reason"] for r in got}
    assert reasons == {
        1: "invalid JSON: not a JSON object",
        2: "invalid JSON: not a JSON object",
        3: "invalid JSON: not a JSON object",
        4: "invalid JSON: not a JSON object",
        5: "missing timestamp column 'ts'",
        6: "missing timestamp column 'ts'",
        7: "unparseable timestamp (auto): soon",
        8: "null value",
        9: "invalid JSON: not a JSON object",
        10: "invalid JSON: not a JSON object",
        11: "timestamp out of range (years 1 to 9999): 253402300800000",
        12: "timestamp out of range (years 1 to 9999): -62135596801",
    }
    # dead letters keep the raw record
    by_offset = {r["offset"]: r for r in got}
    assert by_offset[101]["value"] == b"not json"
    assert by_offset[101]["key"] == b"key-1"
    assert by_offset[101]["partition"] == "3"
    assert by_offset[108]["value"] is None


# --------------------------------------------------------------------------- columns


def test_virtual_columns_and_string_dimensions():
    values = [
        {"ts": T0_MS, "user": "alice", "n": 5, "obj": {"x": [1, 2]}, "flag": True, "f": 1.5},
        {"ts": T0_MS + 1, "user": None},
    ]
    df = records(values, keys=[b"k\xc3\xa9", None], partition="7", first_offset=42)
    ds = schema(
        dimensions=(
            "user",
            "n",
            "obj",
            "flag",
            "f",
            "missing",
            "__key",
            "__partition",
            "__offset",
            "__stream_time",
        )
    )
    good, dead = transform(df, ds)
    assert rows(dead) == []
    arrow = good
    assert arrow.column_names == [
        "__time",
        "user",
        "n",
        "obj",
        "flag",
        "f",
        "missing",
        "__key",
        "__partition",
        "__offset",
        "__stream_time",
        "time_chunk",
    ]
    types = {f.name: f.type for f in arrow.schema}
    assert types["n"] == pa.string() and types["__offset"] == pa.int64()
    assert types["__stream_time"] == pa.timestamp("us", tz="UTC")
    r0, r1 = sorted(arrow.to_pylist(), key=lambda r: r["__offset"])
    assert r0["user"] == "alice" and r0["n"] == "5" and r0["flag"] == "true" and r0["f"] == "1.5"
    assert json.loads(r0["obj"]) == {"x": [1, 2]}
    assert r0["missing"] is None
    assert r0["__key"] == "ké" and r1["__key"] is None
    assert r0["__partition"] == "7" and r0["__offset"] == 42 and r1["__offset"] == 43
    assert r0["__stream_time"] == T0
    assert r1["user"] is None


def test_no_rollup_keeps_metric_fields_typed():
    values = [
        {"ts": T0_MS, "user": "a", "bytes": 10, "lat": 1.25, "junk": "x"},
        {"ts": T0_MS, "user": "b", "bytes": "oops", "lat": "2"},
    ]
    ds = schema(
        dimensions=("user",),
        metrics=(
            Metric("count", "count"),
            Metric("b", "longSum", "bytes"),
            Metric("l", "doubleMax", "lat"),
        ),
    )
    good, _ = transform(records(values), ds)
    arrow = good
    assert arrow.column_names == ["__time", "user", "bytes", "lat", "time_chunk"]
    assert arrow.schema.field("bytes").type == pa.int64()
    assert arrow.schema.field("lat").type == pa.float64()
    got = sorted(arrow.to_pylist(), key=lambda r: r["user"])
    assert [(r["bytes"], r["lat"]) for r in got] == [(10, 1.25), (None, 2.0)]


def test_timestamp_from_virtual_stream_time():
    df = records(["{}", "not json either"], stream_ms=[T0_MS, T0_MS + 5])
    good, dead = transform(df, schema(timestamp_column="__stream_time"))
    assert [r["__time"] for r in rows(good)] == [T0]
    assert [r["reason"] for r in rows(dead)] == ["invalid JSON: not a JSON object"]


# --------------------------------------------------------------------------- granularity


@pytest.mark.parametrize(
    "gran, expected",
    [
        ("none", T0),
        ("second", T0.replace(microsecond=0)),
        ("minute", T0.replace(second=0, microsecond=0)),
        ("fifteen_minute", T0.replace(minute=30, second=0, microsecond=0)),
        ("hour", T0.replace(minute=0, second=0, microsecond=0)),
        ("day", T0.replace(hour=0, minute=0, second=0, microsecond=0)),
    ],
)
def test_query_granularity(gran, expected):
    good, _ = transform(records([{"ts": T0_MS}]), schema(query_granularity=gran))
    assert rows(good)[0]["__time"] == expected


@pytest.mark.parametrize(
    "gran, chunk, start, end",
    [
        ("minute", "20251120T1234Z", "2025-11-20T12:34", "2025-11-20T12:35"),
        ("fifteen_minute", "20251120T1230Z", "2025-11-20T12:30", "2025-11-20T12:45"),
        ("hour", "20251120T1200Z", "2025-11-20T12:00", "2025-11-20T13:00"),
        ("day", "20251120T0000Z", "2025-11-20T00:00", "2025-11-21T00:00"),
        ("month", "20251101T0000Z", "2025-11-01T00:00", "2025-12-01T00:00"),
    ],
)
def test_segment_chunks(gran, chunk, start, end):
    good, _ = transform(records([{"ts": T0_MS}]), schema(segment_granularity=gran))
    assert rows(good)[0]["time_chunk"] == chunk
    assert chunk_of(T0, gran) == chunk
    s, e = chunk_interval(chunk, gran)
    assert s == datetime.fromisoformat(start).replace(tzinfo=UTC)
    assert e == datetime.fromisoformat(end).replace(tzinfo=UTC)


def test_chunks_before_1970_and_december():
    t = datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert chunk_of(t, "fifteen_minute") == "19691231T2345Z"
    assert chunk_interval("20251201T0000Z", "month")[1] == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("chunk, gran", [("99991231T2300Z", "hour"), ("99991231T0000Z", "day"),
                                         ("99991201T0000Z", "month"), ("99991231T2345Z", "fifteen_minute")])
def test_the_last_chunk_of_9999_ends_at_the_last_instant(chunk, gran):
    start, end = chunk_interval(chunk, gran)
    assert start.year == 9999 and end == datetime.max.replace(tzinfo=UTC)


def test_fifteen_minute_before_1970():
    ms = int(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() * 1000)
    good, _ = transform(
        records([{"ts": ms}]),
        schema(
            timestamp_format="millis",
            query_granularity="fifteen_minute",
            segment_granularity="fifteen_minute",
        ),
    )
    (r,) = rows(good)
    assert r["__time"] == datetime(1969, 12, 31, 23, 45, tzinfo=UTC)
    assert r["time_chunk"] == "19691231T2345Z"


# --------------------------------------------------------------------------- rollup

METRICS = (
    Metric("count", "count"),
    Metric("bytes_sum", "longSum", "bytes"),
    Metric("lat_sum", "doubleSum", "lat"),
    Metric("bytes_min", "longMin", "bytes"),
    Metric("bytes_max", "longMax", "bytes"),
    Metric("lat_min", "doubleMin", "lat"),
    Metric("lat_max", "doubleMax", "lat"),
    Metric("offset_sum", "longSum", "__offset"),
)


def _python_rollup(values, first_offset):
    """The same rollup in plain Python: minute buckets, (user, page) dimensions."""
    groups: dict[tuple, list] = defaultdict(list)
    for i, v in enumerate(values):
        if not isinstance(v, dict) or "ts" not in v:
            continue
        t = datetime.fromtimestamp(v["ts"] / 1000, UTC).replace(second=0, microsecond=0)
        groups[(t, v.get("user"), v.get("page"))].append((v, first_offset + i))

    def agg(fn, xs):
        xs = [x for x in xs if x is not None]
        return fn(xs) if xs else None

    out = {}
    for key, members in groups.items():
        b = [m.get("bytes") for m, _ in members]
        lat = [m.get("lat") for m, _ in members]
        out[key] = {
            "count": len(members),
            "bytes_sum": agg(sum, b),
            "lat_sum": agg(math.fsum, lat),
            "bytes_min": agg(min, b),
            "bytes_max": agg(max, b),
            "lat_min": agg(min, lat),
            "lat_max": agg(max, lat),
            "offset_sum": sum(o for _, o in members),
        }
    return out


def test_rollup_matches_python():
    rnd = random.Random(7)
    values: list = []
    for _ in range(3000):
        v = {
            "ts": T0_MS + rnd.randrange(0, 3 * 3600_000),
            "user": rnd.choice(["u1", "u2", "u3"]),
            "page": rnd.choice(["/a", "/b"]),
            "bytes": rnd.randrange(-50, 10_000),
            "lat": round(rnd.uniform(0, 100), 3),
        }
        if rnd.random() < 0.05:
            del v["bytes"]
        if rnd.random() < 0.05:
            v["page"] = None
        values.append(v)
    values += ["garbage", {"user": "u1"}]  # dead letters must not count
    ds = schema(
        dimensions=("user", "page"),
        metrics=METRICS,
        rollup=True,
        query_granularity="minute",
        segment_granularity="hour",
    )
    good, dead = transform(records(values, first_offset=1000), ds)
    assert len(rows(dead)) == 2
    arrow = good
    assert arrow.column_names == [
        "__time",
        "user",
        "page",
        *[m.name for m in METRICS],
        "time_chunk",
    ]
    assert arrow.schema.field("count").type == pa.int64()
    assert arrow.schema.field("bytes_sum").type == pa.int64()
    assert arrow.schema.field("lat_max").type == pa.float64()
    expected = _python_rollup(values, 1000)
    got = {(r["__time"], r["user"], r["page"]): r for r in arrow.to_pylist()}
    assert set(got) == set(expected)
    for key, exp in expected.items():
        row = got[key]
        assert row["time_chunk"] == chunk_of(key[0], "hour")
        for name, value in exp.items():
            if name == "lat_sum":
                assert row[name] == pytest.approx(value, rel=1e-12)
            else:
                assert row[name] == value, (key, name)
    assert sum(r["count"] for r in got.values()) == 3000


def test_rollup_without_metrics_dedups():
    values = [
        {"ts": T0_MS, "user": "a"},
        {"ts": T0_MS + 10, "user": "a"},
        {"ts": T0_MS, "user": "b"},
    ]
    ds = schema(dimensions=("user",), rollup=True, query_granularity="second")
    good, _ = transform(records(values), ds)
    got = rows(good, ["user"])
    assert [r["user"] for r in got] == ["a", "b"]
    assert list(got[0]) == ["__time", "user", "time_chunk"]


def test_day_boundaries_across_segments():
    base = datetime(2025, 11, 20, 23, 59, 59, 999000, tzinfo=UTC)
    ms = int(base.timestamp() * 1000)
    good, _ = transform(
        records([{"ts": ms}, {"ts": ms + 1}]), schema(segment_granularity="day")
    )
    got = [r["time_chunk"] for r in rows(good, ["__time"])]
    assert got == ["20251120T0000Z", "20251121T0000Z"]
    assert chunk_of(base + timedelta(milliseconds=1), "day") == "20251121T0000Z"


@pytest.mark.parametrize(
    "kw",
    [
        {"dimensions": ("time_chunk",)},
        {"dimensions": ("__time",)},
        {"dimensions": ("user", "USER")},
        {"dimensions": ("count",), "metrics": (Metric("count", "count"),), "rollup": True},
        {"dimensions": ("time_chunk",), "rollup": True},
    ],
)
def test_column_clashes_are_errors(kw):
    with pytest.raises(ValueError, match="appears twice"):
        transform(records([{"ts": T0_MS}]), schema(**kw))


# --------------------------------------------------------------------------- the interface


def test_stream_time_in_milliseconds_or_microseconds(parse_mode):
    ds = schema(timestamp_column="__stream_time", dimensions=("__stream_time", "__offset"))
    got = [rows(transform(records(["{}", "{}"], unit=unit), ds)[0], ["__offset"]) for unit in ("ms", "us")]
    assert got[0] == got[1]
    assert [r["__time"] for r in got[0]] == [T0, T0 + timedelta(milliseconds=1)]


@pytest.mark.parametrize(
    "when, gran, chunk",
    [
        (datetime(1, 1, 1, 0, 7, tzinfo=UTC), "fifteen_minute", "00010101T0000Z"),
        (datetime(1, 3, 5, 6, 7, tzinfo=UTC), "month", "00010301T0000Z"),
        (datetime(999, 12, 31, 23, 59, tzinfo=UTC), "day", "09991231T0000Z"),
        (datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), "hour", "19691231T2300Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC), "fifteen_minute", "99991231T2345Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC), "month", "99991201T0000Z"),
    ],
)
def test_chunks_in_every_year(when, gran, chunk):
    ms = (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    good, dead = transform(records([{"ts": ms}]), schema(timestamp_format="millis", segment_granularity=gran))
    assert rows(dead) == []
    (r,) = rows(good)
    assert r["__time"] == when and r["time_chunk"] == chunk == chunk_of(when, gran)
    assert chunk_interval(chunk, gran)[0] <= when < chunk_interval(chunk, gran)[1]


ROLLUP = schema(dimensions=("user",), metrics=METRICS, rollup=True, query_granularity="minute")


def _rollup_values(n, seed=3):
    rnd = random.Random(seed)
    return [
        {"ts": T0_MS + rnd.randrange(0, 600_000), "user": f"u{rnd.randrange(40)}",
         "bytes": rnd.choice([rnd.randrange(1000), "x", None]), "lat": rnd.choice([rnd.random(), "2.5"])}
        for _ in range(n)
    ]


def _by_key(table):
    out = {}
    for r in table.to_pylist():
        key = (r["__time"], r["user"])
        assert key not in out
        r["lat_sum"] = round(r["lat_sum"], 9)
        out[key] = r
    return out


def test_rollup_across_calls_equals_one_aggregation(parse_mode):
    batch = records(_rollup_values(2000), first_offset=0)
    whole = Transformer(ROLLUP, bulk=parse_mode != "python")
    one = whole(batch)
    assert one.rows.num_rows == 0  # held until finish()
    expected = _by_key(whole.finish().rows)
    t = Transformer(ROLLUP, bulk=parse_mode != "python")
    for start in range(0, 2000, 300):
        assert t(batch.slice(start, 300)).rows.num_rows == 0
    assert _by_key(t.finish().rows) == expected
    assert t.finish().rows.num_rows == 0  # handed out once


def test_rollup_names_never_clash_with_pyarrows_result_names(parse_mode):
    # pyarrow names a count "count_all" and a sum "<column>_sum": a dimension of such a
    # name, or two counts, failed every task ("Field "count_all" exists 2 times").
    ds = schema(dimensions=("count_all", "bytes_sum"), rollup=True, query_granularity="minute",
                metrics=(Metric("c", "count"), Metric("c2", "count"), Metric("bytes", "longSum", "bytes")))
    values = [{"ts": T0_MS + i, "count_all": f"k{i % 2}", "bytes_sum": "s", "bytes": i} for i in range(6)]
    t = Transformer(ds, bulk=parse_mode != "python")
    for start in range(0, 6, 2):  # held parts merged again at finish()
        t(records(values).slice(start, 2))
    got = rows(t.finish().rows, ["count_all"])
    assert [(r["count_all"], r["bytes_sum"], r["c"], r["c2"], r["bytes"]) for r in got] == [
        ("k0", "s", 3, 3, 0 + 2 + 4), ("k1", "s", 3, 3, 1 + 3 + 5)]


def test_held_rollup_rows_are_handed_out_past_the_threshold(monkeypatch, parse_mode):
    monkeypatch.setattr(rollup, "HELD_BYTES", 4096)
    batch = records(_rollup_values(2000), first_offset=0)
    t = Transformer(ROLLUP, bulk=parse_mode != "python")
    parts = [t(batch.slice(start, 100)).rows for start in range(0, 2000, 100)]
    assert sum(p.num_rows for p in parts) > 0  # some calls flushed
    parts.append(t.finish().rows)
    # The flushed parts together hold every record once: their rollup is the whole one.
    total = pa.concat_tables(parts)
    assert sum(total.column("count").to_pylist()) == 2000
    assert total.column_names == output_columns(ROLLUP)
    monkeypatch.setattr(rollup, "HELD_BYTES", 64 << 20)
    merged = Transformer(ROLLUP)
    assert merged(batch).rows.num_rows == 0
    expected = _by_key(merged.finish().rows)
    got: dict = {}  # the parts merged here: counts and sums add, min and max combine
    for r in total.to_pylist():
        key = (r["__time"], r["user"])
        if key in got:
            prev = got[key]
            for name in ("count", "bytes_sum", "lat_sum", "offset_sum"):
                if r[name] is not None:
                    prev[name] = (prev[name] or 0) + r[name]
            for name, fn in (("bytes_min", min), ("lat_min", min), ("bytes_max", max), ("lat_max", max)):
                vals = [v for v in (prev[name], r[name]) if v is not None]
                prev[name] = fn(vals) if vals else None
        else:
            got[key] = dict(r)
    for r in got.values():
        r["lat_sum"] = round(r["lat_sum"], 9)
    assert got == expected


def test_output_schemas_are_the_spark_paths():
    """Existing tables were created from the Spark path's schemas: output_schemas.json holds what
    it gave for 86 data schemas, recorded at commit 1fa4804 (``batch.output_schemas`` there, with
    a local session), the last before the transform became pyarrow's."""
    from pathlib import Path

    from reconciler.pipeline.transform import output_schemas

    cases = json.loads((Path(__file__).parent / "output_schemas.json").read_text())
    assert len(cases) > 80
    for case in cases:
        doc = dict(case["data_schema"])
        doc["metrics"] = tuple(Metric(**m) for m in doc["metrics"])
        doc["dimensions"] = tuple(doc["dimensions"])
        ds = DataSchema(**doc)
        got_rows, got_dead = output_schemas(ds)
        for got, want in ((got_rows, case["rows"]), (got_dead, case["dead"])):
            assert [[f.name, str(f.type), f.nullable] for f in got] == want, ds
            assert not got.metadata
        # and the Transformer's tables are typed so (time_chunk last, a string)
        values = [{"ts": T0_MS, "u": "a", "user": "b", "n": 1, "x": 2.5}, "bad"]
        out = Transformer(ds)(records(values))
        assert out.rows.schema.remove(out.rows.schema.get_field_index("time_chunk")) == got_rows
        assert out.rows.schema.field("time_chunk").type == pa.string()
        assert out.dead.schema == got_dead
