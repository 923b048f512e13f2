"""Rollup in pyarrow: each batch aggregated on its own, the partials held across a task's
batches and aggregated again (counts and sums add, min and max combine).

Rows group by the query-floored ``__time`` and the dimensions (null is a value like any
other). ``count`` counts the rows; ``long*``/``double*`` aggregate the field's values
read as int64/float64 (null where they do not convert: ignored; a group with none is
null). A long sum wraps around past 64 bits. With no metrics, rollup only removes
duplicate rows. While the held partials exceed ``HELD_BYTES``, ``Held.add`` hands them
out and starts over: duplicates across the files of one batch are fine (compaction rolls
up again).
"""

from __future__ import annotations

import pyarrow as pa

from reconciler.model import DataSchema

HELD_BYTES = 64 << 20
TIME = "__time"
_FIRST = {"count": "count_all", "Sum": "sum", "Min": "min", "Max": "max"}
_AGAIN = {"count": "sum", "Sum": "sum", "Min": "min", "Max": "max"}


def _kind(metric_type: str) -> str:
    return "count" if metric_type == "count" else metric_type[-3:]


class Held:
    """The aggregated rows of one task's batches so far (``TIME``, the dimensions, the
    metrics by name)."""

    def __init__(self, data_schema: DataSchema):
        self.keys = [TIME, *data_schema.dimensions]
        self.metrics = [(m.name, _kind(m.type)) for m in data_schema.metrics]
        self._parts: list[pa.Table] = []
        self._bytes = 0
        self._merged_bytes = 0  # of the last merge: merge again once the parts double it

    def add(self, keys: dict[str, pa.Array], values: list[pa.Array | None]) -> pa.Table | None:
        """Aggregate one batch's good rows (``keys`` by column, one value array per metric,
        None for a count); returns the held rows when they outgrew ``HELD_BYTES``."""
        part = self._first(keys, values)
        if part.num_rows == 0:
            return None
        self._parts.append(part)
        self._bytes += part.nbytes
        if self._bytes <= max(HELD_BYTES, 2 * self._merged_bytes) and len(self._parts) < 64:
            return None
        merged = self._merge()
        if merged.nbytes > HELD_BYTES:
            self._parts, self._bytes, self._merged_bytes = [], 0, 0
            return merged
        self._parts, self._bytes, self._merged_bytes = [merged], merged.nbytes, merged.nbytes
        return None

    def take(self) -> pa.Table | None:
        """Everything held, aggregated; the holder starts over."""
        if not self._parts:
            return None
        merged = self._merge()
        self._parts, self._bytes, self._merged_bytes = [], 0, 0
        return merged

    def _first(self, keys: dict[str, pa.Array], values: list[pa.Array | None]) -> pa.Table:
        columns = {_key(j): keys[k] for j, k in enumerate(self.keys)}
        aggs: list[tuple[str | None, str]] = []
        for i, ((_, kind), value) in enumerate(zip(self.metrics, values, strict=True)):
            if kind == "count":
                aggs.append((None, "count_all"))
            else:
                columns[_value(i)] = value
                aggs.append((_value(i), _FIRST[kind]))
        return self._group(pa.table(columns), aggs)

    def _merge(self) -> pa.Table:
        if len(self._parts) == 1:
            return self._parts[0]
        table = pa.concat_tables(self._parts)
        table = table.rename_columns([*map(_key, range(len(self.keys))), *map(_value, range(len(self.metrics)))])
        return self._group(table, [(_value(i), _AGAIN[kind]) for i, (_, kind) in enumerate(self.metrics)])

    def _group(self, table: pa.Table, aggs: list[tuple[str | None, str]]) -> pa.Table:
        """``table`` (columns named by ``_key`` and ``_value``) grouped by the keys: the
        keys then the metrics, named. aggregate names a result "<column>_<function>", a
        count "count_all": the internal names keep every result's name unique, whatever
        the dimensions and metrics are called (a dimension "count_all", two counts)."""
        spec: list[tuple] = [(col, fn) for col, fn in aggs if col is not None]
        if any(col is None for col, _ in aggs):
            spec.append(([], "count_all"))  # once, for every count metric
        out = table.group_by([_key(j) for j in range(len(self.keys))], use_threads=False).aggregate(spec)
        arrays = [out.column(_key(j)) for j in range(len(self.keys))]
        arrays += [out.column("count_all" if col is None else f"{col}_{fn}") for col, fn in aggs]
        return pa.Table.from_arrays(arrays, names=[*self.keys, *(name for name, _ in self.metrics)])


def _key(j: int) -> str:
    return f"\x00k{j}"


def _value(i: int) -> str:
    return f"\x00v{i}"
