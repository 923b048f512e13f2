"""Records (``RECORD_SCHEMA`` rows) -> segment rows and dead letters, in Spark's JVM.

No Python UDFs: per-record Python is the bottleneck of the whole pipeline, so JSON
parsing (``from_json``), timestamp handling, truncation and rollup are Spark SQL
expressions. Where the range readers already parsed a record's fields in bulk with
pyarrow (``reconciler.pipeline.jsonfields``), the parsed struct is built from their
columns instead, with exactly the text ``from_json`` would give.

* Every non-virtual dimension is read as a string: ``from_json`` hands back a JSON
  number, boolean, object or array under a string field as its JSON text.
* Metric fields are read as strings too and converted with ``try_cast`` (a value that
  does not convert is null, which sums and min/max ignore), so one odd field never
  makes a whole record unreadable.
* The timestamp column becomes ``__time`` (TIMESTAMP, UTC); a record whose value is
  not a JSON object, or whose timestamp is missing, unparseable or outside the years 1
  to 9999, is a dead letter.
* ``time_chunk`` (``SEGMENT``) is the record's time chunk (segment granularity floor
  of ``__time``) as a string ``YYYYMMDDTHHMMZ``, e.g. ``20261120T1000Z``: Spark,
  pyarrow and DuckDB all discover it as a string partition value (neither a number
  nor a date). It is the Hive partition key, so its name must not start with ``_``
  or ``.``: pyarrow's dataset discovery (and ``pq.read_table(dir)``) silently skips
  such directories (``ignore_prefixes``), reading a ``__segment=...`` layout as empty.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from reconciler.model import VIRTUAL_COLUMNS, DataSchema, Metric
from reconciler.pipeline.jsonfields import (
    AUTO_MILLIS_ABOVE,
    FAST,
    TIME_FROM_MILLIS,
    TIME_UNTIL_MILLIS,
    VALUE_BYTES,
    field_column,
)
from reconciler.streams.base import RECORD_COLUMNS

TIME = "__time"
SEGMENT = "time_chunk"
DEAD_COLUMNS = ("partition", "offset", "key", "value", "reason")

_PARSED = "__json"
_CORRUPT = "__reconciler_corrupt_record"
CORRUPT_COLUMN = _CORRUPT  # the readers' parse leaves a record with this key to from_json
_TS = "__ts_text"
_REASON = "__reason"

# Fixed-width granularities in microseconds; the others are calendar units for date_trunc.
_FIXED_MICROS = {
    "second": 1_000_000,
    "minute": 60_000_000,
    "fifteen_minute": 900_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
}
_TRUNC_UNIT = {
    "second": "second",
    "minute": "minute",
    "hour": "hour",
    "day": "day",
    "month": "month",
}
SEGMENT_GRANULARITIES = ("minute", "fifteen_minute", "hour", "day", "month")
QUERY_GRANULARITIES = ("none", "second", "minute", "fifteen_minute", "hour", "day")

CHUNK_FORMAT = "%Y%m%dT%H%MZ"  # Python strftime of the chunk string
_CHUNK_SPARK_FORMAT = "yyyyMMdd'T'HHmm'Z'"
# pyarrow's floor_temporal (unit, multiple) of each segment granularity, for the sink's
# twin of ``chunk_column`` (``sink_chunks``).
ARROW_FLOOR = {
    "minute": ("minute", 1),
    "fifteen_minute": ("minute", 15),
    "hour": ("hour", 1),
    "day": ("day", 1),
    "month": ("month", 1),
}
assert set(ARROW_FLOOR) == set(SEGMENT_GRANULARITIES)
# Times whose chunk the sink names (``sink_chunks``): years 1000 to 9999, where a chunk
# string is plain four-digit-year arithmetic in any library. Both bounds are midnights,
# so every granularity's floor of a time inside stays inside. Spark keeps naming the rest.
SINK_CHUNKS_FROM_MICROS = -30_610_224_000_000_000  # 1000-01-01T00:00Z
SINK_CHUNKS_UNTIL_MICROS = 253_402_300_800_000_000  # 10000-01-01T00:00Z

_LONG_METRICS = {"longSum", "longMin", "longMax"}
_DOUBLE_METRICS = {"doubleSum", "doubleMin", "doubleMax"}
METRIC_TYPES = {"count"} | _LONG_METRICS | _DOUBLE_METRICS

# Virtual columns: name -> expression over the raw record columns.
_VIRTUAL = {
    "__key": lambda: F.col("key").cast("string"),
    "__partition": lambda: F.col("partition"),
    "__offset": lambda: F.col("offset"),
    "__stream_time": lambda: F.col("stream_time"),
}
assert set(_VIRTUAL) == set(VIRTUAL_COLUMNS)


# --------------------------------------------------------------------------- time


def floor_time(col: Column, granularity: str) -> Column:
    """``col`` (TIMESTAMP) floored to a granularity, in UTC; ``none`` keeps it."""
    if granularity == "none":
        return col
    if granularity == "fifteen_minute":
        micros = F.unix_micros(col)
        width = F.lit(_FIXED_MICROS[granularity])
        return F.timestamp_micros(micros - F.pmod(micros, width))
    if granularity in _TRUNC_UNIT:
        return F.date_trunc(_TRUNC_UNIT[granularity], col)
    raise ValueError(f"unknown granularity: {granularity!r}")


def chunk_column(time_col: Column, segment_granularity: str) -> Column:
    """The ``time_chunk`` string of a time (``YYYYMMDDTHHMMZ`` of its chunk's start)."""
    if segment_granularity not in SEGMENT_GRANULARITIES:
        raise ValueError(f"unknown segment granularity: {segment_granularity!r}")
    return F.date_format(floor_time(time_col, segment_granularity), _CHUNK_SPARK_FORMAT)


def _segment_column(time_col: Column, segment_granularity: str, sink_chunks: bool) -> Column:
    """``chunk_column``, or with ``sink_chunks`` only for the times the sink does not name
    (null for the others): formatting a string per row was a tenth of the executor
    threads' samples of a warm batch, and the sink names a chunk once per value."""
    chunk = chunk_column(time_col, segment_granularity)
    if not sink_chunks:
        return chunk
    micros = F.unix_micros(time_col)
    outside = (micros < F.lit(SINK_CHUNKS_FROM_MICROS)) | (micros >= F.lit(SINK_CHUNKS_UNTIL_MICROS))
    return F.when(outside, chunk)


LAST_INSTANT = datetime.max.replace(tzinfo=UTC)  # the end of 9999's last chunk, which 10000 cannot be


def chunk_interval(chunk: str, segment_granularity: str) -> tuple[datetime, datetime]:
    """``[start, end)`` of a chunk string, as aware UTC datetimes (the last chunk of 9999
    ends at ``LAST_INSTANT``)."""
    start = datetime.strptime(chunk, CHUNK_FORMAT).replace(tzinfo=UTC)
    if segment_granularity == "month":
        y, m = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        return start, (start.replace(year=y, month=m) if y <= 9999 else LAST_INSTANT)
    if segment_granularity not in _FIXED_MICROS:
        raise ValueError(f"unknown segment granularity: {segment_granularity!r}")
    try:
        return start, start + timedelta(microseconds=_FIXED_MICROS[segment_granularity])
    except OverflowError:
        return start, LAST_INSTANT


def chunk_of(ts: datetime, segment_granularity: str) -> str:
    """Python twin of ``chunk_column`` (for tests and tools)."""
    ts = ts.astimezone(UTC)
    if segment_granularity == "month":
        start = ts.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        width = _FIXED_MICROS[segment_granularity]
        micros = (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros - micros % width)
    return start.strftime(CHUNK_FORMAT)


def _micros_to_ts(x: Column) -> Column:
    # try_cast: NaN, infinities and out-of-range values become null (a dead letter).
    return F.timestamp_micros(F.round(x).try_cast("long"))


def parse_timestamp(text: Column, fmt: str) -> Column:
    """A JSON timestamp (its text) -> TIMESTAMP, null when it does not parse.

    ``millis``/``seconds``: a number (fractions allowed). ``iso``: ISO-8601 (a missing
    offset means UTC). ``auto``: a number is millis when its magnitude exceeds 1e11
    (after 1973-03-03 as millis, year 5138 as seconds), else seconds; anything else ISO.
    """
    num = text.try_cast("double")
    # An integer (the usual epoch number) is converted exactly as a long: without the
    # double's text-to-double and round (a BigDecimal per row), measured ~5% of a batch's
    # JVM time. try_cast rejects "1.5" and "1e3", try_multiply overflows to null, and
    # either falls through to the double (which then gives what it always gave).
    whole = text.try_cast("long")
    millis_whole = F.timestamp_micros(F.try_multiply(whole, F.lit(1000)))
    seconds_whole = F.timestamp_micros(F.try_multiply(whole, F.lit(1_000_000)))
    millis = F.coalesce(millis_whole, _micros_to_ts(num * F.lit(1000.0)))
    seconds = F.coalesce(seconds_whole, _micros_to_ts(num * F.lit(1_000_000.0)))
    iso = F.coalesce(
        F.try_to_timestamp(text),
        F.try_to_timestamp(text, F.lit("yyyy-MM-dd'T'HH:mmXXX")),
    )
    if fmt == "millis":
        return millis
    if fmt == "seconds":
        return seconds
    if fmt == "iso":
        return iso
    if fmt == "auto":
        # No abs() of the long: ANSI mode raises on abs(-2^63); a comparison cannot fail.
        big = (whole > F.lit(AUTO_MILLIS_ABOVE)) | (whole < F.lit(-AUTO_MILLIS_ABOVE))
        return (
            F.when(whole.isNotNull(), F.when(big, millis_whole).otherwise(seconds_whole))
            .when(num.isNull(), iso)
            .when(F.abs(num) > F.lit(1e11), _micros_to_ts(num * F.lit(1000.0)))
            .otherwise(_micros_to_ts(num * F.lit(1_000_000.0)))
        )
    raise ValueError(f"unknown timestamp format: {fmt!r}")


# --------------------------------------------------------------------------- schema


def _metric_field_types(data_schema: DataSchema) -> dict[str, str]:
    """Non-virtual metric source fields -> Spark type ("bigint" or "double")."""
    out: dict[str, str] = {}
    for m in data_schema.metrics:
        if m.type not in METRIC_TYPES:
            raise ValueError(f"unknown metric type: {m.type!r}")
        if m.type == "count" or not m.field:
            continue
        kind = "double" if m.type in _DOUBLE_METRICS else "bigint"
        if out.get(m.field) != "double":
            out[m.field] = kind
    return out


def json_fields(data_schema: DataSchema) -> list[str]:
    """The top-level JSON fields the data schema reads, in ``json_schema``'s order."""
    names: list[str] = []
    for name in (
        data_schema.timestamp_column,
        *data_schema.dimensions,
        *(m.field for m in data_schema.metrics if m.field),
    ):
        if name and name not in VIRTUAL_COLUMNS and name not in names:
            names.append(name)
    return names


def json_schema(data_schema: DataSchema) -> StructType:
    """The ``from_json`` schema: every field that the data schema reads, as strings."""
    fields = [StructField(n, StringType(), True) for n in json_fields(data_schema)]
    fields.append(StructField(_CORRUPT, StringType(), True))
    return StructType(fields)


def _parsed_struct(data_schema: DataSchema, fast_columns: bool) -> Column:
    """The parsed JSON struct: ``from_json``'s, or for a record whose reader already
    parsed it (``jsonfields.FAST``) the same struct built from the reader's columns."""
    schema = json_schema(data_schema)
    from_json = F.from_json(
        F.col("value").cast("string"),
        schema,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
    )
    if not fast_columns:
        return from_json
    names = json_fields(data_schema)
    fast = F.struct(
        *(F.col(field_column(i)).alias(n) for i, n in enumerate(names)),
        F.lit(None).cast("string").alias(_CORRUPT),
    )
    # CASE evaluates only the branch it takes: from_json runs for the other records only.
    return F.when(F.col(FAST), fast).otherwise(from_json)


def _field(name: str) -> Column:
    if name in _VIRTUAL:
        return _VIRTUAL[name]()
    return F.col(_PARSED).getField(name)


# --------------------------------------------------------------------------- transform


_T = TypeVar("_T")
# Expressions built once per session: each function of a Column is a py4j call, about
# 0.07 s of a 10,000-record batch's 0.5 s. A Column is an unresolved expression that any
# frame of its session can use; a new session (or a Spark Connect one) gets its own.
_BUILT: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()
_BUILT_PER_SESSION = 1024  # the oldest go first: a daemon's specs change over months


def _built(df: DataFrame, kind: str, data_schema: DataSchema, *variant: Any,
           build: Callable[[], _T]) -> _T:
    per_session = _BUILT.setdefault(df.sparkSession, {})
    # The table's name plays no part in the expressions: supervisors alike share them.
    key = (kind, replace(data_schema, datasource=""), *variant)
    if key not in per_session:
        if len(per_session) >= _BUILT_PER_SESSION:
            per_session.pop(next(iter(per_session)), None)
        per_session[key] = build()  # two threads may both build it: the same expression
    return per_session[key]


@dataclass(frozen=True)
class _ParseColumns:
    parsed: Column  # the struct, aliased _PARSED (or its one-element inline)
    ts_text: Column
    time: Column
    reason: Column
    metrics: tuple[Column, ...]  # the observation's


def _parse_columns(data_schema: DataSchema, fast_columns: bool, observed: bool) -> _ParseColumns:
    parsed = _parsed_struct(data_schema, fast_columns)
    if observed:
        parsed = parsed.alias(_PARSED)
    else:
        parsed = F.inline(F.array(F.struct(parsed.alias(_PARSED))))
    ts_name = data_schema.timestamp_column
    if ts_name in _VIRTUAL:
        ts_text = _VIRTUAL[ts_name]().cast("string")
    else:
        ts_text = F.trim(F.col(_PARSED).getField(ts_name))
    if ts_name == "__stream_time":
        time = F.col("stream_time")
    else:
        time = parse_timestamp(F.col(_TS), data_schema.timestamp_format)
    json_bad = F.col(_PARSED).isNull() | F.col(_PARSED).getField(_CORRUPT).isNotNull()
    null_value = F.col("value").isNull()
    value_bytes = F.octet_length("value")
    if fast_columns:  # a value the reader shed (jsonfields.shed_values) left its length
        null_value = null_value & F.col(VALUE_BYTES).isNull()
        value_bytes = F.coalesce(value_bytes, F.col(VALUE_BYTES))
    reason = (
        F.when(null_value, F.lit("null value"))
        .when(json_bad, F.lit("invalid JSON: not a JSON object"))
        .when(F.col(_TS).isNull(), F.lit(f"missing timestamp column {ts_name!r}"))
        .when(
            F.col(TIME).isNull(),
            F.concat(
                F.lit(f"unparseable timestamp ({data_schema.timestamp_format}): "),
                F.substring(F.col(_TS), 1, 100),
            ),
        )
        .when(
            # Outside Spark's and Python's timestamps (years 1 to 9999) a row could be read
            # but not published: its chunk and Iceberg partition have no date.
            (F.unix_micros(F.col(TIME)) < F.lit(TIME_FROM_MILLIS * 1000))
            | (F.unix_micros(F.col(TIME)) >= F.lit(TIME_UNTIL_MILLIS * 1000)),
            F.concat(F.lit("timestamp out of range (years 1 to 9999): "), F.substring(F.col(_TS), 1, 100)),
        )
    )
    metrics = (
        F.count(F.lit(1)).alias("records"),
        F.count(F.col(_REASON)).alias("dead"),
        F.sum(F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(value_bytes, F.lit(0)))
        .alias("bytes"),
    ) if observed else ()
    return _ParseColumns(parsed, ts_text, time, reason, metrics)


def parse(
    df: DataFrame, data_schema: DataSchema, observation: Observation | None = None
) -> DataFrame:
    """Raw records + the parsed JSON struct, ``__time`` (null if bad) and ``__reason``.

    Filters on ``__reason`` sit above this frame. Spark's optimizer pushes a Filter
    through a Project by substituting aliases, which would run ``from_json`` once per
    reference (3-4x slower), so the parse sits below a node it cannot push through:
    with an ``observation`` the ``CollectMetrics`` node that fills it (``records``
    and ``dead`` counts and record ``bytes``, nearly free); without one a Generate (``inline`` of a
    one-element array), which costs about a fifth more than the plain parse.
    """
    if data_schema.format != "json":
        raise ValueError(f"unsupported format: {data_schema.format!r}")
    observed = observation is not None
    fast_columns = FAST in df.columns
    c = _built(df, "parse", data_schema, fast_columns, observed,
               build=lambda: _parse_columns(data_schema, fast_columns, observed))
    with_json = df.select(*RECORD_COLUMNS, *([VALUE_BYTES] if fast_columns else []), c.parsed)
    with_time = with_json.withColumn(_TS, c.ts_text).withColumn(TIME, c.time)
    out = with_time.withColumn(_REASON, c.reason)
    if observation is not None:
        out = out.observe(observation, *c.metrics)
    return out


def _metric_column(m: Metric) -> Column:
    if m.type == "count":
        return F.count(F.lit(1)).alias(m.name)
    src = _field(m.field or "")
    kind = "double" if m.type in _DOUBLE_METRICS else "bigint"
    value = src.try_cast(kind)
    agg = {"Sum": F.sum, "Min": F.min, "Max": F.max}[m.type[-3:]]
    return agg(value).alias(m.name)


def _good_columns(data_schema: DataSchema, sink_chunks: bool) -> tuple[Column, list[Column], list[Column], Column]:
    """(the filter, the group keys or the columns, the metrics, the chunk) of ``good_rows``."""
    ok = F.col(_REASON).isNull()
    qtime = floor_time(F.col(TIME), data_schema.query_granularity).alias(TIME)
    dims = [_field(d).alias(d) for d in data_schema.dimensions]
    sg = data_schema.segment_granularity
    if data_schema.rollup:
        metrics = [_metric_column(m) for m in data_schema.metrics] or [F.count(F.lit(1)).alias("__rows")]
        return ok, [qtime, *dims], metrics, _segment_column(F.col(TIME), sg, sink_chunks)
    cols = [qtime, *dims]
    for name, kind in _metric_field_types(data_schema).items():
        if name in data_schema.dimensions:
            continue
        cols.append(_field(name).try_cast(kind).alias(name))
    # The chunk of the (query-floored) row time in the same projection: every DataFrame
    # step is analysed in the JVM at once, so one step fewer per batch.
    chunk = _segment_column(floor_time(F.col(TIME), data_schema.query_granularity), sg, sink_chunks)
    return ok, cols, [], chunk.alias(SEGMENT)


def good_rows(parsed: DataFrame, data_schema: DataSchema, *, sink_chunks: bool = False) -> DataFrame:
    """Segment rows from a ``parse`` frame's good records (with ``time_chunk``).

    With ``sink_chunks`` the ``time_chunk`` of a row whose ``__time`` lies in years 1000 to
    9999 is null: the writer names it from ``__time`` (``segments.write_batch`` with
    ``segment_granularity``), which costs the executors no string per row."""
    output_columns(data_schema)  # fail early on a clash (e.g. a dimension "time_chunk")
    ok, cols, metrics, chunk = _built(parsed, "good", data_schema, sink_chunks,
                                      build=lambda: _good_columns(data_schema, sink_chunks))
    good = parsed.where(ok)
    if data_schema.rollup:
        out = good.groupBy(*cols).agg(*metrics)
        if not data_schema.metrics:
            out = out.drop("__rows")
        return out.withColumn(SEGMENT, chunk)
    return good.select(*cols, chunk)


def dead_rows(parsed: DataFrame) -> DataFrame:
    """Dead letters from a ``parse`` frame: partition, offset, key, value, reason."""
    return parsed.where(F.col(_REASON).isNotNull()).select(
        "partition", "offset", "key", "value", F.col(_REASON).alias("reason")
    )


def output_columns(data_schema: DataSchema) -> list[str]:
    """The segment columns, in order (``SEGMENT`` last); raises on a name clash."""
    if data_schema.rollup:
        values = [m.name for m in data_schema.metrics]
    else:
        values = [f for f in _metric_field_types(data_schema) if f not in data_schema.dimensions]
    cols = [TIME, *data_schema.dimensions, *values, SEGMENT]
    seen: set[str] = set()
    for c in cols:
        if c.lower() in seen:
            raise ValueError(f"column {c!r} appears twice in the segment columns {cols}")
        seen.add(c.lower())
    return cols


def transform(df: DataFrame, data_schema: DataSchema) -> tuple[DataFrame, DataFrame]:
    """``(good_df, dead_df)`` for a frame of records (``RECORD_SCHEMA`` columns).

    good_df: ``__time``, the dimensions, the metrics (rollup) or metric source fields
    (no rollup), and ``time_chunk``. dead_df: ``DEAD_COLUMNS``.
    """
    parsed = parse(df, data_schema)
    return good_rows(parsed, data_schema), dead_rows(parsed)


def dead_reason_column() -> str:
    return _REASON
