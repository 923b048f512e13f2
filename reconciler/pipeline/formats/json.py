"""JSON values: the fields' texts by the JSON rules, in bulk where pyarrow reads a record
exactly (``reconciler.pipeline.jsonfields``), per record elsewhere (``jsonparse``, the
rules' reference). The path the transform had, moved here unchanged.

A nested field (``path: geo.country``) is read from its top-level field's text (an
object's compact JSON by the rules), walked in Python and rendered by the same rules:
only records that hold the object pay for it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.pipeline.formats import Decoded, Field, Format
from reconciler.pipeline.jsonfields import FieldParser
from reconciler.pipeline.jsonparse import parse_values, render

NOT_AN_OBJECT = "invalid JSON: not a JSON object"


class JsonFormat(Format):
    name = "json"
    bulk = True  # False: every record by the per-record parser (the reference the tests compare with)

    def __init__(self, data_schema: Any, base_dir: str | None = None, files: Any = None):
        super().__init__(data_schema, base_dir, files)
        self._parser: FieldParser | None = None
        self._heads: list[str] = []

    def parser_for(self, fields: Sequence[Field]) -> FieldParser:
        """The bulk parser of these fields, kept across batches (what it learnt stays)."""
        heads = list(dict.fromkeys(f.top for f in fields))
        if heads != self._heads or self._parser is None:
            self._heads = heads
            self._parser = FieldParser(heads, _numeric(fields))
        return self._parser

    def decode(self, values: pa.Array, fields: Sequence[Field]) -> Decoded:
        self.parser_for(fields)
        heads = self._heads
        ok, texts = self._parse(values)
        by_head = dict(zip(heads, texts, strict=True))
        columns: dict[str, pa.Array] = {}
        nested: dict[str, list[Field]] = {}
        for f in fields:
            if len(f.path) == 1:
                columns[f.name] = by_head[f.top]
            else:
                nested.setdefault(f.top, []).append(f)
        for head, group in nested.items():
            columns.update(_walk(by_head[head], group))
        bad = pc.and_(pc.invert(ok), values.is_valid())
        dead = None
        if pc.any(bad).as_py():
            dead = pc.if_else(bad, NOT_AN_OBJECT, pa.scalar(None, pa.string()))
        if not self.data_schema.schema_discovery:
            return Decoded(columns, dead)
        from reconciler.pipeline.discovered import infer

        found, misfit = infer(values, ok, {f.top for f in fields})
        if any(r is not None for r in misfit):
            more = pa.array(misfit, pa.string())
            dead = more if dead is None else pc.coalesce(dead, more)
        return Decoded({**found, **columns}, dead, {k: c.type for k, c in found.items()})

    def _parse(self, values: pa.Array) -> tuple[pa.Array, list[pa.Array]]:
        """(``ok``: the value is a JSON object, the fields' texts) for every record."""
        assert self._parser is not None
        n = len(values)
        bulk = self._parser.parse(values) if self.bulk else self._parser.none(n)
        rest = pc.and_(pc.invert(bulk.exact), values.is_valid())
        if not pc.any(rest).as_py():
            return bulk.exact, list(bulk.texts)
        index = pc.indices_nonzero(rest)
        parsed = parse_values(values.take(index).to_pylist(), self._heads)
        positions = positions_of(rest)  # the Python results spread over the records
        ok = pc.or_(bulk.exact, pc.fill_null(parsed.ok.take(positions), False))
        texts = [pc.if_else(bulk.exact, b, p.take(positions))
                 for b, p in zip(bulk.texts, parsed.texts, strict=True)]
        return ok, texts


def _numeric(fields: Sequence[Field]) -> list[str]:
    """Top-level fields read only as doubles: the bulk parser may hand them over as floats."""
    doubles = {f.top for f in fields if f.type == "double" and len(f.path) == 1}
    others = {f.top for f in fields if f.type != "double" or len(f.path) > 1}
    return sorted(doubles - others)


def _walk(text: pa.Array, fields: Sequence[Field]) -> dict[str, pa.Array]:
    """The nested fields under one top-level field, from its text (compact JSON)."""
    out: list[list[str | None]] = [[] for _ in fields]
    for t in text.to_pylist():
        obj = json.loads(t) if t is not None and t.startswith("{") else None
        for f, column in zip(fields, out, strict=True):
            value = obj
            for key in f.path[1:]:
                value = value.get(key) if isinstance(value, dict) else None
            column.append(render(value))
    return {f.name: pa.array(c, pa.string()) for f, c in zip(fields, out, strict=True)}


def positions_of(mask: pa.Array) -> pa.Array:
    """For each record, its index among the records ``mask`` selects (null for the others):
    what ``take`` needs to spread values computed for the selected records over all of them."""
    return pc.if_else(mask, pc.subtract(pc.cumulative_sum(mask.cast(pa.int64())), 1),
                      pa.scalar(None, pa.int64()))
