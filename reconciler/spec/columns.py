"""The columns a spec's output table gets, with their types, and the rules their names obey.

Checked when a spec is validated, so a spec ``validate`` accepts is never refused by the
pipeline for its columns. The output (``pipeline.transform.output_columns``) writes
``__time``, the dimensions, then the metrics (rollup) or the metric fields that are not
dimensions (no rollup), and partitions by ``time_chunk``; Spark and Parquet readers match
column names case-insensitively, so the pipeline refuses two names that differ only in case.
Hence:

* ``__time`` and ``time_chunk`` are reserved in any case (``__TIME``, ``Time_Chunk``);
* a name that is a virtual column's in another case (``__KEY``) is refused: it would read a
  JSON field yet look like, and clash in readers with, the virtual ``__key``;
* names are unique whatever their case: ``[user, USER]``, or a ``count`` dimension beside a
  ``count`` metric with rollup. (Rollup, the tasks' and compaction's, names its results
  so that nothing clashes: dimensions ``count_all`` or ``bytes_sum`` beside a ``longSum``
  metric ``bytes`` are fine.)

``output_columns`` also gives each column's type, which ``crossfile`` compares between the
supervisors of one datasource (one table). ``tests/spec/test_columns.py`` checks that these
rules and the pipeline's agree on generated data schemas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.errors import SpecProblem
from reconciler.model import RESERVED_COLUMNS, VIRTUAL_COLUMNS
from reconciler.spec.yamlsafe import ParsedYaml, YamlPath, format_field

TIME, CHUNK = RESERVED_COLUMNS
VIRTUAL_TYPES = {"__key": "string", "__partition": "string", "__offset": "long", "__stream_time": "timestamp"}
assert set(VIRTUAL_TYPES) == set(VIRTUAL_COLUMNS)
_DOUBLE_METRICS = ("doubleSum", "doubleMin", "doubleMax")
_DS: YamlPath = ("dataSchema",)


@dataclass(frozen=True)
class Column:
    """One output column: its name, its type in the table, and the field that declares it."""

    name: str
    type: str  # string | long | double | boolean | timestamp (a json dimension is a string column)
    at: YamlPath


def output_columns(data_schema: Mapping[str, Any]) -> list[Column]:
    """The table's columns (``__time`` first, without ``time_chunk``), as the pipeline writes them."""
    typed = [_dimension(d) for d in data_schema.get("dimensions") or ()]
    dims = [d for d, _ in typed if d is not None]
    metrics = [m for m in data_schema.get("metrics") or () if isinstance(m, Mapping)]
    granularity = data_schema.get("granularity")
    rollup = bool(granularity.get("rollup", False)) if isinstance(granularity, Mapping) else False
    cols = [Column(TIME, "timestamp", (*_DS, "timestamp"))]
    cols += [Column(d, VIRTUAL_TYPES.get(d, kind), (*_DS, "dimensions", i))
             for i, (d, kind) in enumerate(typed) if d is not None]
    if rollup:
        for i, m in enumerate(metrics):
            kind = "long" if m.get("type") == "count" else _metric_type(m.get("type"))
            cols.append(Column(str(m.get("name")), kind, (*_DS, "metrics", i, "name")))
        return cols
    fields: dict[str, Column] = {}
    for i, m in enumerate(metrics):
        name = m.get("field")
        if m.get("type") == "count" or not isinstance(name, str) or not name:
            continue
        kind, seen = _metric_type(m.get("type")), fields.get(name)
        if seen is None:
            fields[name] = Column(name, kind, (*_DS, "metrics", i, "field"))
        elif seen.type != "double":  # a field summed as a double anywhere is a double column
            fields[name] = Column(name, kind, seen.at)
    cols += [c for name, c in fields.items() if name not in dims]
    return cols


def _dimension(doc: Any) -> tuple[str | None, str]:
    """(name, type) of a dimension as written: a name is a string column."""
    if isinstance(doc, str):
        return doc, "string"
    if isinstance(doc, Mapping) and isinstance(doc.get("name"), str):
        kind = doc.get("type", "string")
        return doc["name"], "string" if kind == "json" else str(kind)
    return None, ""


def _metric_type(kind: Any) -> str:
    return "double" if kind in _DOUBLE_METRICS else "long"


def problems(parsed: ParsedYaml) -> list[SpecProblem]:
    """Reserved names and names that clash, whatever their case."""
    ds = parsed.data.get("dataSchema") if isinstance(parsed.data, Mapping) else None
    if not isinstance(ds, Mapping):
        return []
    out: list[SpecProblem] = []
    seen: dict[str, Column] = {}
    for col in output_columns(ds)[1:]:
        lower = col.name.lower()
        if lower in RESERVED_COLUMNS:
            out.append(_problem(parsed, col, f"{col.name!r} is a column the output writes itself (reserved: "
                                             f"{', '.join(RESERVED_COLUMNS)}, in any case); use another name"))
        elif lower in VIRTUAL_TYPES and col.name not in VIRTUAL_TYPES:
            out.append(_problem(parsed, col, f"{col.name!r} is the virtual column {lower!r} in another case: write "
                                             f"{lower!r} for the virtual column, or choose another name"))
        elif lower in seen:
            first = seen[lower]
            what = "the same name" if first.name == col.name else f"{first.name!r} in another case"
            out.append(_problem(parsed, col, f"{col.name!r} is {what}, already a column at {format_field(first.at)}: "
                                             "column names must be unique, whatever their case"))
        else:
            seen[lower] = col
    return out


def _problem(parsed: ParsedYaml, col: Column, message: str) -> SpecProblem:
    line, column = parsed.value_position(col.at)
    return SpecProblem(parsed.path, line, column, format_field(col.at), message)
