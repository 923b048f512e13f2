"""Issue 42's CSV format, cases a review proved: a record's row or dead letter depends on
the record alone, whatever its neighbours in the batch; one bad record never fails the batch."""

from __future__ import annotations

import pyarrow as pa

from reconciler.model import DataSchema
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_typed_tables import T0, records

DS = DataSchema("orders", "ts", timestamp_format="millis", format="csv", dimensions=("a", "b"),
                format_options={"columns": ["ts", "a", "b"]})


def _fates(values):
    out = Transformer(DS)(records(values))
    dead = dict(zip(out.dead.column("offset").to_pylist(), out.dead.column("reason").to_pylist(), strict=True))
    return out, dead


def test_an_unclosed_quote_is_a_dead_letter_not_a_failed_batch():
    # Alone, '1,"x,y' is a dead letter (csv: 2 fields ...). Followed by any record in the
    # batch, the values joined by line breaks let pyarrow's reader carry the open quote into
    # the next line: fewer rows than records, and zip(..., strict=True) raises ValueError
    # out of the transform. The task, hence the batch, fails on every retry: stuck.
    bad = f'{T0},"x,y'.encode()
    _, dead = _fates([bad])
    assert 0 in dead
    out, dead = _fates([bad, f"{T0},p,q".encode()])  # ValueError: zip() argument 2 is shorter
    assert 0 in dead and out.rows.column("a").to_pylist() == ["p"]
    assert dead[0] == "csv: unclosed quote"
    # of the right width, or opened after a stray quote mid-field: the same, never a row
    for bad in (f'{T0},x,"y', f'{T0},x"y,"z'):
        out, dead = _fates([bad.encode(), f"{T0},p,q".encode(), bad.encode(), f"{T0},r,s".encode()])
        assert dead == {0: "csv: unclosed quote", 2: "csv: unclosed quote"}
        assert out.rows.column("a").to_pylist() == ["p", "r"]
    # a stray quote inside a plain field reads as itself, alone or not
    out, dead = _fates([f'{T0},x"y,z'.encode(), f"{T0},p,q".encode()])
    assert not dead and out.rows.column("a").to_pylist() == ['x"y', "p"]


def test_a_byte_order_mark_reads_the_same_first_in_the_batch_or_not():
    # pyarrow drops a BOM at the start of its buffer only: the batch's first value loses it
    # (a row), the same value after another keeps "\ufeff<ts>" (an unparseable timestamp).
    bom = f"\ufeff{T0},a,b".encode()
    first, dead_first = _fates([bom, f"{T0},p,q".encode()])
    second, dead_second = _fates([f"{T0},p,q".encode(), bom])
    assert (0 in dead_first) == (1 in dead_second), (dead_first, dead_second)
    # the rule: a leading BOM is dropped from every value (docs/spec.md, CSV)
    assert not dead_first and not dead_second
    assert first.rows.column("a").to_pylist() == ["a", "p"] and second.rows.column("a").to_pylist() == ["p", "a"]
    out, dead = _fates([f'\ufeff"{T0}",a,b'.encode(), f"{T0},p,\ufeffq".encode()])  # only a leading one
    assert not dead and out.rows.column("b").to_pylist() == ["b", "\ufeffq"]
