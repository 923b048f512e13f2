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

from collections.abc import Sequence

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
        aggs = [(name, value, _FIRST[kind]) for (name, kind), value in zip(self.metrics, values, strict=True)]
        return aggregate({k: keys[k] for k in self.keys}, aggs)

    def _merge(self) -> pa.Table:
        if len(self._parts) == 1:
            return self._parts[0]
        table = pa.concat_tables(self._parts)
        n = len(self.keys)
        keys = {k: table.column(j) for j, k in enumerate(self.keys)}
        return aggregate(keys, [(name, table.column(n + i), _AGAIN[kind])
                                for i, (name, kind) in enumerate(self.metrics)])


Values = pa.Array | pa.ChunkedArray


def aggregate(keys: dict[str, Values], aggs: Sequence[tuple[str, Values | None, str]]) -> pa.Table:
    """The rows grouped by the ``keys`` columns (null is a value like any other): the keys,
    then one column per ``(name, values, function)`` of ``aggs``, pyarrow's hash aggregate
    ``function`` of ``values`` (``count_all`` with None: the rows of the group).

    aggregate names a result "<column>_<function>", a count "count_all": the columns go in
    under internal names, so every result's name is unique whatever the keys and results
    are called (a dimension "count_all" or "bytes_sum" beside a sum of "bytes", two counts).
    Also compaction's (``table.compact.rollup_rows``)."""
    columns = {_key(j): col for j, col in enumerate(keys.values())}
    spec: list[tuple] = []
    results = []
    for i, (_, values, fn) in enumerate(aggs):
        if values is None:
            if ([], "count_all") not in spec:
                spec.append(([], "count_all"))  # once, for every count
            results.append("count_all")
        else:
            columns[_value(i)] = values
            spec.append((_value(i), fn))
            results.append(f"{_value(i)}_{fn}")
    out = pa.table(columns).group_by(list(map(_key, range(len(keys)))), use_threads=False).aggregate(spec)
    arrays = [out.column(_key(j)) for j in range(len(keys))]
    arrays += [out.column(r) for r in results]
    return pa.Table.from_arrays(arrays, names=[*keys, *(name for name, _, _ in aggs)])


def _key(j: int) -> str:
    return f"\x00k{j}"


def _value(i: int) -> str:
    return f"\x00v{i}"
