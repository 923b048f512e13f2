"""CSV values: one record is one row, its fields named by the spec's ``csv.columns``.

* ``delimiter`` (default ``,``) separates fields; ``"`` quotes a field (a quote inside
  is doubled), as RFC 4180 and pyarrow's reader have it.
* ``skipHeader: true``: the first line of every value is a header and is dropped (a
  producer that writes each record as a small file, header first).
* Every field is text (an empty field is absent: null); typed dimensions convert it by
  the JSON rules' text conversions, as for JSON.
* A row with another number of fields than ``columns`` is a dead letter
  ("csv: 2 fields where 3 columns are declared"); so is an empty value, one of several
  rows, or one whose quote is never closed ("csv: unclosed quote").
* A byte order mark (U+FEFF) at the start of a value is dropped, whatever the value's
  place in the batch.

The batch is read by pyarrow's CSV reader (values joined by line breaks; a row of the
wrong width is named by its number and skipped). Only values whose every field is plain
or wholly quoted go there, so no value's quote can run into the next one's line. The rest
(a line break of its own: a quoted multi-line field, or the header; a stray or unclosed
quote; invalid UTF-8) is read alone by Python's ``csv`` module, which reads RFC 4180 the
same way.
"""

from __future__ import annotations

import csv as pycsv
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from reconciler.pipeline.formats import Decoded, Field, Format


class CsvFormat(Format):
    name = "csv"

    def __init__(self, data_schema: Any, base_dir: str | None = None, files: Any = None):
        super().__init__(data_schema, base_dir, files)
        options = data_schema.format_options
        self.columns = [str(c) for c in options.get("columns") or ()]
        if not self.columns:
            raise ValueError("format csv needs csv.columns")
        self.delimiter = str(options.get("delimiter", ","))
        self.skip_header = bool(options.get("skipHeader", False))
        d = re.escape(self.delimiter)
        field = f'(?:[^"\r\n{d}]*|"(?:[^"]|"")*")'
        self._plain = f"^{field}(?:{d}{field})*$"  # a row pyarrow reads alone, whatever follows

    def decode(self, values: pa.Array, fields: Sequence[Field]) -> Decoded:
        n = len(values)
        try:
            text = values.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            text = pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()],
                            pa.string())
        # pyarrow drops a BOM only at its buffer's start: drop every value's alike
        text = pc.replace_substring_regex(text, "^\ufeff", "", max_replacements=1)
        if self.skip_header:
            text = pc.replace_substring_regex(text, r"^[^\n]*\n", "", max_replacements=1)
        alone = pc.or_(pc.or_(pc.match_substring_regex(text, r"[\r\n]"), pc.equal(text, "")),
                       pc.invert(pc.match_substring_regex(text, self._plain))).fill_null(False)
        bulk = pc.and_(pc.invert(alone), text.is_valid())
        cells: list[list[str | None]] = [[None] * n for _ in self.columns]
        reasons: list[str | None] = [None] * n
        index = pc.indices_nonzero(bulk).to_numpy()
        if len(index):
            self._bulk(text.take(pa.array(index)), index, cells, reasons)
        for i in pc.indices_nonzero(alone).to_pylist():
            self._one(i, text[i].as_py(), cells, reasons)
        by_name = {c: pa.array(col, pa.string()) for c, col in zip(self.columns, cells, strict=True)}
        columns = {f.name: by_name.get(f.top, pa.nulls(n, pa.string())) for f in fields}
        dead = pa.array(reasons, pa.string()) if any(r is not None for r in reasons) else None
        return Decoded(columns, dead)

    def _bulk(self, text: pa.Array, index: np.ndarray, cells: list[list[str | None]],
              reasons: list[str | None]) -> None:
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(text)], pa.int32()), text), "\n")
        buf = joined[0].as_buffer()
        skipped: list[tuple[int, int]] = []  # (1-based row, its fields)

        def handler(row: Any) -> str:
            skipped.append((row.number, row.actual_columns))
            return "skip"

        table = pcsv.read_csv(
            pa.BufferReader(buf),
            read_options=pcsv.ReadOptions(column_names=self.columns, use_threads=False,
                                          block_size=max(buf.size + 1, 1 << 20)),
            parse_options=pcsv.ParseOptions(delimiter=self.delimiter, invalid_row_handler=handler),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in self.columns},
                                                strings_can_be_null=True, null_values=[""],
                                                quoted_strings_can_be_null=False),
        )
        bad = {number - 1: width for number, width in skipped}
        good = [i for i in range(len(index)) if i not in bad]
        for c, col in zip(self.columns, cells, strict=True):
            for at, v in zip(good, table.column(c).to_pylist(), strict=True):
                col[int(index[at])] = v
        for at, width in bad.items():
            reasons[int(index[at])] = self._width(width)

    def _one(self, i: int, value: str, cells: list[list[str | None]], reasons: list[str | None]) -> None:
        lines = value.splitlines(keepends=True)
        try:
            list(pycsv.reader(lines, delimiter=self.delimiter, strict=True))
        except pycsv.Error as e:
            if "unexpected end of data" in str(e):
                reasons[i] = "csv: unclosed quote"
                return
        rows = list(pycsv.reader(lines, delimiter=self.delimiter, strict=False))
        if len(rows) != 1:
            reasons[i] = f"csv: {len(rows)} rows in one record; a record is one row"
        elif len(rows[0]) != len(self.columns):
            reasons[i] = self._width(len(rows[0]))
        else:
            for col, v in zip(cells, rows[0], strict=True):
                col[i] = v if v != "" else None

    def _width(self, width: int) -> str:
        return f"csv: {width} fields where {len(self.columns)} columns are declared"
