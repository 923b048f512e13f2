"""Records (``RECORD_COLUMNS`` batches) -> segment rows and dead letters, in pyarrow.

Each Spark task runs one ``Transformer`` in its Python worker over the record batches it
reads. No per-record Python on the clean path: the JSON fields come from pyarrow's bulk
reader (``reconciler.pipeline.jsonfields``) where it reads a record exactly, from the
per-record parser (``reconciler.pipeline.jsonparse``, the JSON rules) elsewhere; the rest
is pyarrow.compute.

* Every non-virtual dimension is a string: a field's text (``jsonparse.render``).
* Metric fields are read from that text (``reconciler.pipeline.times``): a value that does
  not convert is null, which sums and min/max ignore, so one odd field never makes a whole
  record unreadable.
* The timestamp column becomes ``__time`` (timestamp, UTC); a record whose value is not a
  JSON object, or whose timestamp is missing, unparseable or outside the years 1 to 9999,
  is a dead letter.
* ``time_chunk`` (``SEGMENT``) is the row's time chunk (segment granularity floor of the
  query-floored ``__time``) as a string ``YYYYMMDDTHHMMZ``, e.g. ``20261120T1000Z``:
  pyarrow, Spark and DuckDB all discover it as a string partition value. It is the Hive
  partition key, so its name must not start with ``_`` or ``.``: pyarrow's dataset
  discovery silently skips such directories (``ignore_prefixes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.model import SEGMENT, VIRTUAL_COLUMNS, DataSchema
from reconciler.pipeline import rollup
from reconciler.pipeline.discovered import Discovered
from reconciler.pipeline.formats import ARROW_TYPES, Decoded, Field, format_for
from reconciler.pipeline.times import (
    TIME_FROM_MICROS,
    TIME_UNTIL_MICROS,
    parse_times,
    to_double,
    to_long,
)
from reconciler.pipeline.typed import as_text, typed_values

TIME = "__time"
DEAD_COLUMNS = ("partition", "offset", "key", "value", "reason")

# Fixed-width granularities in microseconds; "month" is a calendar unit.
_FIXED_MICROS = {
    "second": 1_000_000,
    "minute": 60_000_000,
    "fifteen_minute": 900_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
}
SEGMENT_GRANULARITIES = ("minute", "fifteen_minute", "hour", "day", "month")
QUERY_GRANULARITIES = ("none", "second", "minute", "fifteen_minute", "hour", "day")

CHUNK_FORMAT = "%Y%m%dT%H%MZ"  # strftime of the chunk string (pyarrow's pads the year)
# pyarrow's floor_temporal (unit, multiple) of each granularity (relative to the epoch,
# so fifteen minutes before 1970 floor like after it).
ARROW_FLOOR = {
    "second": ("second", 1),
    "minute": ("minute", 1),
    "fifteen_minute": ("minute", 15),
    "hour": ("hour", 1),
    "day": ("day", 1),
    "month": ("month", 1),
}
assert set(SEGMENT_GRANULARITIES) <= set(ARROW_FLOOR)

_LONG_METRICS = {"longSum", "longMin", "longMax"}
_DOUBLE_METRICS = {"doubleSum", "doubleMin", "doubleMax"}
METRIC_TYPES = {"count"} | _LONG_METRICS | _DOUBLE_METRICS
_TS_TYPE = pa.timestamp("us", tz="UTC")
_VIRTUAL_TYPES = {
    "__key": pa.string(),
    "__partition": pa.string(),
    "__offset": pa.int64(),
    "__stream_time": _TS_TYPE,
}
assert set(_VIRTUAL_TYPES) == set(VIRTUAL_COLUMNS)
DEAD_SCHEMA = pa.schema(
    [("partition", pa.string()), ("offset", pa.int64()), ("key", pa.binary()),
     ("value", pa.binary()), ("reason", pa.string())]
)
assert tuple(DEAD_SCHEMA.names) == DEAD_COLUMNS


# --------------------------------------------------------------------------- chunks

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
    """Python twin of ``chunk_strings`` (for tests and tools)."""
    ts = ts.astimezone(UTC)
    if segment_granularity == "month":
        start = ts.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        width = _FIXED_MICROS[segment_granularity]
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        micros = (ts - epoch) // timedelta(microseconds=1)
        start = epoch + timedelta(microseconds=micros - micros % width)
    # Not strftime: glibc's %Y does not pad years before 1000.
    return f"{start.year:04d}{start.month:02d}{start.day:02d}T{start.hour:02d}{start.minute:02d}Z"


def floor_times(times: pa.Array, granularity: str) -> pa.Array:
    """Timestamps floored to a granularity, in UTC; ``none`` keeps them."""
    if granularity == "none":
        return times
    if granularity not in ARROW_FLOOR:
        raise ValueError(f"unknown granularity: {granularity!r}")
    unit, multiple = ARROW_FLOOR[granularity]
    kind = times.type
    if pa.types.is_timestamp(kind) and kind.tz == "UTC":
        # UTC's wall clock is the stored count: floored without a zone (a metadata cast
        # each way), Arrow skips the zone lookups that made this 15x slower
        naive = times.cast(pa.timestamp(kind.unit))
        return pc.floor_temporal(naive, multiple=multiple, unit=unit).cast(kind)
    return pc.floor_temporal(times, multiple=multiple, unit=unit)


def chunk_strings(times: pa.Array, segment_granularity: str) -> pa.Array:
    """The ``time_chunk`` string of each time, formatted once per distinct chunk."""
    if segment_granularity not in SEGMENT_GRANULARITIES:
        raise ValueError(f"unknown segment granularity: {segment_granularity!r}")
    if isinstance(times, pa.ChunkedArray):
        times = times.combine_chunks()
    encoded = pc.dictionary_encode(floor_times(times, segment_granularity))
    names = pc.strftime(encoded.dictionary, format=CHUNK_FORMAT)
    return names.take(encoded.indices)


# --------------------------------------------------------------------------- schema


def _metric_field_types(data_schema: DataSchema) -> dict[str, str]:
    """Metric source fields -> "long" or "double" (a field read both ways: double)."""
    out: dict[str, str] = {}
    for m in data_schema.metrics:
        if m.type not in METRIC_TYPES:
            raise ValueError(f"unknown metric type: {m.type!r}")
        if m.type == "count" or not m.field:
            continue
        kind = "double" if m.type in _DOUBLE_METRICS else "long"
        if out.get(m.field) != "double":
            out[m.field] = kind
    return out


def json_fields(data_schema: DataSchema) -> list[str]:
    """The top-level fields the data schema reads."""
    return list(dict.fromkeys(f.top for f in read_fields(data_schema)))


def read_fields(data_schema: DataSchema) -> list[Field]:
    """What the format reads from each record: the timestamp (its own type), the typed
    dimensions (by path) and the metric fields that are not dimensions."""
    out = [Field(name, (name,)) for name in (data_schema.timestamp_column,) if name not in VIRTUAL_COLUMNS]
    for name in data_schema.dimensions:
        d = data_schema.dimension(name)
        if name not in VIRTUAL_COLUMNS and name != data_schema.timestamp_column:
            out.append(Field(name, d.path or (name,), d.type))
    names = {f.name for f in out}
    # A field read only as a double is a double (the JSON bulk parser may hand it over as
    # a float); one also read as a long keeps its own type (text), read by each metric's rule.
    not_only_double = {m.field for m in data_schema.metrics if m.type not in _DOUBLE_METRICS}
    for name in _metric_field_types(data_schema):
        if name not in VIRTUAL_COLUMNS and name not in names:
            out.append(Field(name, (name,), None if name in not_only_double else "double"))
    return out


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


def _kind_type(kind: str) -> pa.DataType:
    return pa.float64() if kind == "double" else pa.int64()


def output_schemas(data_schema: DataSchema) -> tuple[pa.Schema, pa.Schema]:
    """The Arrow schemas of a datasource's rows (without ``time_chunk``) and of its dead
    letters: what the Spark path gave (tests/pipeline/output_schemas.json), which the
    existing Iceberg tables were created from."""
    output_columns(data_schema)
    fields = [pa.field(TIME, _TS_TYPE)]
    fields += [pa.field(d, _VIRTUAL_TYPES.get(d) or ARROW_TYPES[data_schema.dimension(d).type])
               for d in data_schema.dimensions]
    if data_schema.rollup:
        for m in data_schema.metrics:
            kind = "double" if m.type in _DOUBLE_METRICS else "long"
            fields.append(pa.field(m.name, _kind_type(kind), nullable=m.type != "count"))
    else:
        for name, kind in _metric_field_types(data_schema).items():
            if name not in data_schema.dimensions:
                fields.append(pa.field(name, _kind_type(kind)))
    return pa.schema(fields), DEAD_SCHEMA


# --------------------------------------------------------------------------- transform


@dataclass(frozen=True)
class Transformed:
    """What one call gives: ``rows`` (``output_columns``, ``time_chunk`` last),
    ``dead`` (``DEAD_COLUMNS``), and the records it consumed and their key + value bytes."""

    rows: pa.Table
    dead: pa.Table
    records: int
    bytes: int


class Transformer:
    """One per Spark task: ``t(batch)`` per record batch, ``t.finish()`` at the end.

    Its format (``formats.format_for``, chosen once) keeps what it learns across the task's
    batches (the JSON bulk parser's types) and, with rollup, the aggregated rows
    (``rollup.Held``). ``bulk=False`` parses every JSON record in Python (the reference the
    tests compare with)."""

    def __init__(self, data_schema: DataSchema, *, bulk: bool = True, base_dir: str | None = None,
                 files: dict[str, bytes] | None = None, table_types: dict[str, pa.DataType] | None = None):
        if data_schema.timestamp_format not in ("auto", "iso", "millis", "seconds"):
            raise ValueError(f"unknown timestamp format: {data_schema.timestamp_format!r}")
        floor_times(pa.array([], _TS_TYPE), data_schema.query_granularity)
        if data_schema.segment_granularity not in SEGMENT_GRANULARITIES:
            raise ValueError(f"unknown segment granularity: {data_schema.segment_granularity!r}")
        self.ds = data_schema
        self.rows_schema, _ = output_schemas(data_schema)
        self.fields = read_fields(data_schema)
        self.format = format_for(data_schema, base_dir, files)
        self.format.bulk = bulk  # the JSON format's reference path; others have none
        self._held = rollup.Held(data_schema) if data_schema.rollup else None
        # schemaDiscovery: the record's other top-level fields as columns (not with rollup:
        # they would be grouping keys no spec declared); ``table_types``: the table's columns
        self.discovery = Discovered(table_types) if data_schema.schema_discovery and not data_schema.rollup else None
        # A key named as a declared or virtual column, in any case, is no column of its own:
        # names are unique whatever their case (``__Partition`` is ``__partition``).
        self._declared = {c.lower() for c in [*output_columns(data_schema), data_schema.timestamp_column,
                                              *VIRTUAL_COLUMNS]}

    def __call__(self, batch: pa.RecordBatch) -> Transformed:
        cols = _records(batch)
        n = len(cols["value"])
        size = pc.sum(pc.add(pc.binary_length(cols["key"]).fill_null(0),
                             pc.binary_length(cols["value"]).fill_null(0))).as_py() or 0
        decoded = self.format.decode(cols["value"], self.fields)
        field = decoded.columns
        found: dict[str, pa.Array] = {}
        if self.discovery is not None and decoded.discovered:
            names = [k for k in decoded.discovered if k.lower() not in self._declared and k not in VIRTUAL_COLUMNS]
            found, misfit = self.discovery.conform(field, names)
            decoded = Decoded(field, _merge(decoded.dead, misfit), decoded.discovered)
        ts_text, micros = self._time(cols, field)
        typed = {d: typed_values(field[d], self.ds.dimension(d).type) for d in self._typed_names()}
        reasons = _reasons(self.ds, cols, decoded.dead, ts_text, micros,
                           [(d, self.ds.dimension(d).type, field[d], bad) for d, (_, bad) in typed.items()])
        if reasons is None:
            dead = DEAD_SCHEMA.empty_table()
            good = None
        else:
            dead = pa.Table.from_arrays(
                [cols[c].filter(reasons.is_valid()) for c in DEAD_COLUMNS[:-1]]
                + [reasons.drop_null()], schema=DEAD_SCHEMA)
            good = reasons.is_null()
        dims = {d: values for d, (values, _) in typed.items()}
        rows = self._rows(cols, field, {**dims, **found}, micros, good)
        return Transformed(rows, dead, n, int(size))

    def finish(self) -> Transformed:
        """What is still held (rollup), with no records of its own."""
        held = self._held.take() if self._held is not None else None
        return Transformed(self._emit(held), DEAD_SCHEMA.empty_table(), 0, 0)

    # ----------------------------------------------------------------- steps

    def _typed_names(self) -> list[str]:
        return [d for d in self.ds.dimensions if d not in VIRTUAL_COLUMNS]

    def _value_text(self, name: str, cols: dict[str, pa.Array], field: dict[str, pa.Array]) -> pa.Array:
        if name == "__key":
            return _key_text(cols["key"])
        if name in ("__partition", "__offset"):
            return cols[name[2:]].cast(pa.string())
        if name == "__stream_time":
            return _spark_time_text(cols["stream_time"])
        return as_text(field[name])

    def _time(self, cols: dict[str, pa.Array], field: dict[str, pa.Array]) -> tuple[pa.Array, pa.Array]:
        """(the timestamp's text, its microseconds or null)."""
        name = self.ds.timestamp_column
        if name == "__stream_time":
            st = cols["stream_time"]
            return pc.if_else(st.is_valid(), "", pa.scalar(None, pa.string())), st.cast(pa.int64())
        if name in VIRTUAL_COLUMNS:
            text = self._value_text(name, cols, field)
        elif pa.types.is_timestamp(field[name].type):  # a format's own instant, whatever `format` says
            micros = field[name].cast(_TS_TYPE).cast(pa.int64())
            return as_text(field[name]), micros
        else:
            text = pc.utf8_trim(as_text(field[name]), " ")  # as Spark's trim: spaces only
        return text, parse_times(text, self._timestamp_rule())

    def _timestamp_rule(self) -> str:
        """``timestamp.format``, unless the column is a dimension typed ``timestamp``: then
        that type's rule (ISO, or a number of seconds or millis), as the dimension reads it."""
        name = self.ds.timestamp_column
        if name in self.ds.dimensions and self.ds.dimension(name).type == "timestamp":
            return "auto"
        return self.ds.timestamp_format

    def _metric_values(self, name: str, kind: str, cols: dict[str, pa.Array],
                       field: dict[str, pa.Array]) -> pa.Array:
        if name == "__offset":
            return cols["offset"].cast(_kind_type(kind))
        if name == "__stream_time":
            micros = cols["stream_time"].cast(pa.int64())
            if kind == "double":
                return pc.divide(micros.cast(pa.float64()), 1e6)
            return _floor_div(micros, 1_000_000)
        text = self._value_text(name, cols, field)
        return to_double(text) if kind == "double" else to_long(text)

    def _rows(self, cols: dict[str, pa.Array], field: dict[str, pa.Array], dims: dict[str, pa.Array],
              micros: pa.Array, good: pa.Array | None) -> pa.Table:
        ds = self.ds

        def keep(a: pa.Array) -> pa.Array:
            return a if good is None else a.filter(good)

        arrays: dict[str, pa.Array] = {TIME: floor_times(keep(micros).cast(_TS_TYPE), ds.query_granularity)}
        for d in ds.dimensions:
            if d in ("__offset", "__stream_time"):
                arrays[d] = keep(cols[d[2:]])
            elif d in VIRTUAL_COLUMNS:
                arrays[d] = keep(self._value_text(d, cols, field))
            else:
                arrays[d] = keep(dims[d])
        if ds.rollup:
            assert self._held is not None
            values = [
                None if m.type == "count" else keep(self._metric_values(
                    m.field or "", "double" if m.type in _DOUBLE_METRICS else "long", cols, field))
                for m in ds.metrics
            ]
            return self._emit(self._held.add(arrays, values))
        for name, kind in _metric_field_types(ds).items():
            if name not in ds.dimensions:
                arrays[name] = keep(self._metric_values(name, kind, cols, field))
        for name in dims.keys() - arrays.keys():  # discovered columns
            arrays[name] = keep(dims[name])
        return self._emit(pa.table(arrays))

    def _emit(self, table: pa.Table | None) -> pa.Table:
        """``table`` typed as the output schema, with ``time_chunk``."""
        rows_schema = self.rows_schema
        if self.discovery is not None:
            rows_schema = pa.schema([*rows_schema, *self.discovery.schema()])
        schema = rows_schema.append(pa.field(SEGMENT, pa.string()))
        if table is None or table.num_rows == 0:
            return schema.empty_table()
        arrays = [table.column(f.name).combine_chunks().cast(f.type) if f.name in table.column_names
                  else pa.nulls(table.num_rows, f.type) for f in rows_schema]
        arrays.append(chunk_strings(arrays[0], self.ds.segment_granularity))
        return pa.Table.from_arrays(arrays, schema=schema)


# --------------------------------------------------------------------------- helpers


def _records(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The record columns, ``stream_time`` as UTC microseconds whatever its unit."""
    cols = {name: batch.column(name) for name in DEAD_COLUMNS[:-1]}
    cols["stream_time"] = batch.column("stream_time").cast(_TS_TYPE)
    return cols


def _reasons(ds: DataSchema, cols: dict[str, pa.Array], undecoded: pa.Array | None, ts_text: pa.Array,
             micros: pa.Array, typed: list[tuple[str, str, pa.Array, pa.Array | None]]) -> pa.Array | None:
    """Each record's dead-letter reason (null for a good one), or None when all are good.
    The checks in order: null value, the format's own (not a JSON object), missing,
    unparseable, out of range timestamp, then each typed dimension's value that does not fit."""
    null_value = cols["value"].is_null()
    bad_format = undecoded.is_valid() if undecoded is not None else pa.repeat(pa.scalar(False), len(null_value))
    missing = ts_text.is_null()
    unparseable = micros.is_null()
    out_of_range = pc.or_(pc.less(micros, TIME_FROM_MICROS), pc.greater_equal(micros, TIME_UNTIL_MICROS))
    misfits = [bad for _, _, _, bad in typed if bad is not None]
    masks = [null_value, bad_format, missing, unparseable, out_of_range.fill_null(False), *misfits]
    dead = masks[0]
    for m in masks[1:]:
        dead = pc.or_(dead, m)
    if not pc.any(dead).as_py():
        return None
    index = pc.indices_nonzero(dead)
    which = [m.take(index).to_pylist() for m in masks[:5]]
    if ds.timestamp_column == "__stream_time":
        text = _spark_time_text(cols["stream_time"].take(index)).to_pylist()
    else:
        text = ts_text.take(index).to_pylist()
    format_reason = undecoded.take(index).to_pylist() if undecoded is not None else None
    fits = [(name, kind, as_text(values).take(index).to_pylist(), bad.take(index).to_pylist())
            for name, kind, values, bad in typed if bad is not None]
    typed_ts = ds.timestamp_column in ds.dimensions and ds.dimension(ds.timestamp_column).type == "timestamp"
    fmt = "auto" if typed_ts else ds.timestamp_format
    reasons = []
    for i, (nv, bf, ms, up, late) in enumerate(zip(*which, strict=True)):
        if nv:
            reasons.append("null value")
        elif bf:
            reasons.append(format_reason[i])  # type: ignore[index]
        elif ms:
            reasons.append(f"missing timestamp column {ds.timestamp_column!r}")
        elif up:
            reasons.append(f"unparseable timestamp ({fmt}): {text[i][:100]}")
        elif late:
            reasons.append(f"timestamp out of range (years 1 to 9999): {text[i][:100]}")
        else:
            reasons.append(next(f"{name}: {json.dumps(values[i][:100], ensure_ascii=False)} is not a {kind}"
                                for name, kind, values, bad in fits if bad[i]))
    return pa.array(reasons, pa.string()).take(_positions(dead))


def _merge(dead: pa.Array | None, more: list[str | None]) -> pa.Array | None:
    """The format's reasons, and where it had none, discovery's."""
    if not any(r is not None for r in more):
        return dead
    if dead is None:
        return pa.array(more, pa.string())
    return pc.coalesce(dead, pa.array(more, pa.string()))


def _positions(mask: pa.Array) -> pa.Array:
    """For each record, its index among the records ``mask`` selects (null for the others):
    what ``take`` needs to spread values computed for the selected records over all of them."""
    return pc.if_else(mask, pc.subtract(pc.cumulative_sum(mask.cast(pa.int64())), 1),
                      pa.scalar(None, pa.int64()))


def _key_text(key: pa.Array) -> pa.Array:
    """Keys as text; invalid UTF-8 as U+FFFD (rare: Python)."""
    try:
        return key.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if k is None else k.decode("utf-8", "replace")
                         for k in key.to_pylist()], pa.string())


def _spark_time_text(times: pa.Array) -> pa.Array:
    """A timestamp's text as Spark's cast to string wrote it (``2025-11-20 12:34:56.789``):
    the text of a virtual ``__stream_time`` read as a number or in a dead letter."""
    whole = pc.floor_temporal(times, unit="second")
    # In seconds: Arrow's %S writes a finer unit's fraction too ("56.789000").
    seconds = pc.strftime(whole.cast(pa.timestamp("s", tz="UTC")), format="%Y-%m-%d %H:%M:%S")
    micros = pc.subtract(times.cast(pa.int64()), whole.cast(pa.int64()))
    frac = pc.utf8_rtrim(pc.utf8_lpad(micros.cast(pa.string()), 6, "0"), "0")
    with_frac = pc.binary_join_element_wise(seconds, ".", frac, "")
    return pc.if_else(pc.equal(micros, 0), seconds, with_frac)


def _floor_div(x: pa.Array, d: int) -> pa.Array:
    """Integer floor division (Spark's cast of a timestamp to a long: whole seconds)."""
    q = pc.divide(x, d)  # truncates toward zero
    adjust = pc.and_(pc.less(x, 0), pc.not_equal(pc.multiply(q, d), x))
    return pc.if_else(adjust, pc.subtract(q, 1), q)
