"""The Iceberg type of each output column, and which changes a table can take.

The table follows the data (issue 42): a new column is added as optional (old rows read
null); a column widens only by Iceberg's promotions (int -> long, float -> double, a
decimal's precision up); a column that leaves the spec stays in the table, null from then
on. Anything else (a narrowing, string -> long) is refused, with the reason, before a
spec is applied (``validate``/``plan``) and never half-done at a publish.

``changes(current, wanted)`` is pure: the table's current Iceberg schema and the spec's
Arrow schema in, the changes (or refusals) out, printed by ``plan`` as
``+ column coupon string (optional)`` / ``~ column qty int -> long``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
from pyiceberg.schema import Schema, promote
from pyiceberg.types import IcebergType, ListType, MapType, StructType


@dataclass(frozen=True)
class Change:
    kind: str  # "add" | "widen" | "refuse"
    column: str
    before: str | None
    after: str
    why: str | None = None  # a refusal's reason when it is not the type change

    def __str__(self) -> str:
        if self.kind == "add":
            return f"+ column {self.column} {self.after} (optional)"
        if self.kind == "widen":
            return f"~ column {self.column} {self.before} -> {self.after}"
        if self.before is None:
            return f"! column {self.column} {self.after}: refused ({self.why})"
        return f"! column {self.column} {self.before} -> {self.after}: refused ({self.why or _why(self.before, self.after)})"


def iceberg_types(schema: pa.Schema) -> dict[str, IcebergType]:
    """Each Arrow column's Iceberg type (pyiceberg's own mapping; nested fields without ids:
    a name mapping of the top-level names alone cannot convert a struct's fields)."""
    converted = _pyarrow_to_schema_without_ids(schema)
    return {f.name: f.field_type for f in converted.fields}


def _text(t: IcebergType) -> str:
    """A type as plan shows it: nested fields by name, without ids."""
    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"{f.name}: {_text(f.field_type)}" for f in t.fields) + ">"
    if isinstance(t, ListType):
        return f"list<{_text(t.element_type)}>"
    if isinstance(t, MapType):
        return f"map<{_text(t.key_type)}, {_text(t.value_type)}>"
    return str(t)


def _same(a: IcebergType, b: IcebergType) -> bool:
    """The same type whatever the field ids and requiredness (a table's nested fields have
    ids, a batch's none)."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        fa, fb = {f.name: f.field_type for f in a.fields}, {f.name: f.field_type for f in b.fields}
        return fa.keys() == fb.keys() and all(_same(fa[k], fb[k]) for k in fa)
    if isinstance(a, ListType) and isinstance(b, ListType):
        return _same(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return _same(a.key_type, b.key_type) and _same(a.value_type, b.value_type)
    return a == b


def changes(current: Schema, wanted: pa.Schema) -> list[Change]:
    """What writing ``wanted`` into a table of ``current`` changes, in ``wanted``'s order."""
    have = {f.name: f for f in current.fields}  # Iceberg's names are case-sensitive
    spelled: dict[str, str] = {}
    for f in current.fields:
        spelled.setdefault(f.name.lower(), f.name)
    out = []
    for name, kind in iceberg_types(wanted).items():
        field = have.get(name)
        if field is None and name.lower() in spelled:
            # Trino, Glue and Hive read two such columns as one: the table would be unreadable there
            out.append(Change("refuse", name, None, _text(kind), why=(
                f"the table has a column {spelled[name.lower()]}: a column name that differs from another "
                "only in case is refused; use that spelling or another name")))
        elif field is None:
            out.append(Change("add", name, None, _text(kind)))
        elif not _same(field.field_type, kind):
            try:
                promote(field.field_type, kind)
                out.append(Change("widen", name, str(field.field_type), str(kind)))
            except Exception:  # pyiceberg's ResolveError: not a promotion
                if _narrows(field.field_type, kind):
                    continue  # a narrower value fits the wider column: written as it
                if _adds_fields(field.field_type, kind):
                    out.append(Change("widen", name, _text(field.field_type), _text(kind)))
                    continue
                out.append(Change("refuse", name, str(field.field_type), str(kind)))
    return out


def _adds_fields(have: IcebergType, want: IcebergType) -> bool:
    """Whether record ``want`` is record ``have`` plus fields (Iceberg adds them as optional
    nested columns), its other fields the same or promoted."""
    if not (isinstance(have, StructType) and isinstance(want, StructType)):
        return False
    wanted = {f.name: f.field_type for f in want.fields}
    for f in have.fields:
        w = wanted.get(f.name)
        if w is None:
            return False
        if not (_same(f.field_type, w) or _adds_fields(f.field_type, w)):
            try:
                promote(f.field_type, w)
            except Exception:  # noqa: BLE001 - pyiceberg's ResolveError: not a promotion
                return False
    return len(wanted) > len(have.fields) or not _same(have, want)


def refused(found: list[Change]) -> list[Change]:
    return [c for c in found if c.kind == "refuse"]


def _narrows(have: IcebergType, want: IcebergType) -> bool:
    """Whether ``want`` is promotable to ``have`` (the table is already wider: fine)."""
    try:
        promote(want, have)
        return True
    except Exception:
        return False


def _why(before: str | None, after: str) -> str:
    return (f"Iceberg cannot change a {before} column to {after}: only int -> long, float -> double and a "
            "decimal's precision up; use a new column name")


def table_refusal(tables, data_schema) -> str | None:
    """Why the datasource's table cannot take a data schema's columns (the refused
    changes, named), or None: no table yet, or every change is an add or a promotion."""
    from reconciler.pipeline.transform import output_schemas

    table = tables.load(data_schema.datasource)
    if table is None:
        return None
    found = refused(changes(table.schema(), output_schemas(data_schema)[0]))
    if not found:
        return None
    return f"table {data_schema.datasource!r} cannot take the spec's columns: " + "; ".join(
        str(c).removeprefix("! ") for c in found)


def table_problems(tables, path: str, spec) -> list:
    """``table_refusal`` as ``validate`` reports it: one problem per refused column, at the
    dimension or metric of the file that declares it (``dataSchema`` when none does)."""
    from reconciler.errors import SpecProblem
    from reconciler.pipeline.transform import output_schemas
    from reconciler.spec.yamlsafe import format_field, parse_yaml

    ds = spec.data_schema
    table = tables.load(ds.datasource)
    found = refused(changes(table.schema(), output_schemas(ds)[0])) if table is not None else []
    if not found:
        return []
    try:
        parsed = parse_yaml(Path(path).read_bytes(), path)
    except Exception:  # noqa: BLE001 - changed or gone since it was loaded: the refusal stands, unplaced
        parsed = None
    out = []
    for c in found:
        at = _declared_at(spec.document, c.column)
        line, column = parsed.value_position(at) if parsed is not None and at else (None, None)
        out.append(SpecProblem(path, line, column, format_field(at) if at else "dataSchema",
                               f"table {ds.datasource!r} cannot take the spec's columns: {str(c).removeprefix('! ')}"))
    return out


def _declared_at(document, name: str) -> tuple | None:
    """Where a spec document declares column ``name``: its dimension, else its metric."""
    ds = document.get("dataSchema") or {}
    for key, names in (("dimensions", ("name",)), ("metrics", ("name", "field"))):
        for i, d in enumerate(ds.get(key) or ()):
            given = [d] if isinstance(d, str) else [d.get(n) for n in names] if isinstance(d, dict) else []
            if any(isinstance(g, str) and g.lower() == name.lower() for g in given):
                return ("dataSchema", key, i)
    return None

