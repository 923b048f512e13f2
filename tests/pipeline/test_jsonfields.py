"""The bulk JSON parser (reconciler.pipeline.jsonfields): which records it leaves to the
per-record Python parser (reconciler.pipeline.jsonparse, the JSON rules' reference), and
that a record parsed either way gives exactly the same rows and dead letters."""

# ruff: noqa: UP031 - %-formatting keeps the JSON's braces readable (f-strings double them)
from __future__ import annotations

import pyarrow as pa
import pytest

from reconciler.model import Metric
from reconciler.pipeline.jsonfields import FieldParser
from reconciler.pipeline.jsonparse import parse_values
from reconciler.pipeline.transform import Transformer, json_fields
from tests.pipeline.test_transform import T0_MS, encode, records, rows, schema

FIELDS = ["ts", "d", "n"]


def parse(values, parser=None):
    """The bulk parse of ``values``; every record it read must read as the Python parser
    reads it."""
    parser = parser or FieldParser(FIELDS)
    raw = [encode(v) for v in values]
    out = parser.parse(pa.array(raw, pa.binary()))
    reference = parse_values(raw, parser.fields)
    for i, exact in enumerate(out.exact.to_pylist()):
        if exact:
            assert reference.ok[i].as_py(), values[i]
            for name, got, want in zip(parser.fields, out.texts, reference.texts, strict=True):
                if name in parser.numeric:  # a double-only field: the same double
                    assert same(float(got[i].as_py()), float(want[i].as_py())), values[i]
                else:
                    assert got[i].as_py() == want[i].as_py(), values[i]
        else:
            assert all(t[i].as_py() is None for t in out.texts)
    return out


def same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN is NaN


def nan_free(got):
    """Rows with NaN as a string, so that == compares them."""
    return [{k: "NaN" if isinstance(v, float) and v != v else v for k, v in r.items()} for r in got]


def texts(values, parser=None):
    out = parse(values, parser)
    return out.exact.to_pylist(), [c.to_pylist() for c in out.texts]


def exact(values, parser=None):
    return parse(values, parser).exact.to_pylist()


# --------------------------------------------------------------------------- the bulk parser


def test_clean_records_are_parsed_to_the_rules_text():
    fast, (ts, d, n) = texts(
        [
            '{"ts": 1795500000000, "d": "a\\u00e9\\ud83d\\ude00", "n": 5, "other": {"x": [1.5]}}',
            '{"d": null, "n": -12}',
            None,
            '{"ts": 9223372036854775807, "d": "x\\u0000y"}',
        ]
    )
    assert fast == [True, True, False, True]
    assert ts == ["1795500000000", None, None, "9223372036854775807"]
    assert d == ["aé😀", None, None, "x\x00y"]
    assert n == ["5", "-12", None, None]
    # Integers and booleans under any field come as their JSON text.
    assert texts(['{"ts": -0, "d": true, "n": false}'])[1] == [["0"], ["true"], ["false"]]


def test_a_field_of_two_types_in_one_batch_leaves_a_record_to_python():
    assert exact(['{"d": "a"}', '{"d": 1}']).count(True) == 1
    assert exact(['{"d": "a", "o": 1}', '{"d": 1, "o": "x"}']).count(True) == 1  # also when learning
    assert texts(['{"d": "a"}'])[1][1] == ["a"] and texts(['{"d": 1}'])[1][1] == ["1"]


def test_an_unread_field_of_two_types_does_not_stop_the_parse():
    # pyarrow's inference fails on "o"; the read fields' types are learnt one error at a time.
    parser = FieldParser(FIELDS)
    batch = [
        '{"ts": 1, "d": true, "n": "x", "o": 1}',
        '{"ts": 2, "d": false, "o": "one"}',
        '{"ts": 3, "o": [1, {"a": 2}]}',
    ]
    fast, (ts, d, n) = texts(batch, parser)
    assert fast == [True, True, True]
    assert (ts, d, n) == (["1", "2", "3"], ["true", "false", None], ["x", None, None])
    assert texts(['{"ts": 4, "d": true, "o": null}'], parser)[1][1] == ["true"]  # remembered


def test_learning_starts_from_the_remembered_types():
    parser = FieldParser(FIELDS)
    assert texts(['{"ts": 1, "n": true}'], parser)[0] == [True]  # "d" absent: remembered as null
    batch = ['{"ts": 2, "d": "a", "n": false, "o": 1}', '{"ts": 3, "d": "b", "o": "one"}']
    assert texts(batch, parser)[1] == [["2", "3"], ["a", "b"], ["false", None]]


@pytest.mark.parametrize(
    "odd, rest",
    [
        ('{"ts": 2.5, "o": "x"}', False),  # a float where an integer was learnt
        ('{"ts": 2, "__reconciler_corrupt_record": "x", "o": "x"}', True),  # no longer special
        ('{"ts": 2, "d": {"k": 1}, "o": "x"}', False),
    ],
)
def test_learning_still_leaves_odd_records_to_python(odd, rest):
    assert exact(['{"ts": 1, "d": "a", "o": 1}', odd]) == [True, rest]


@pytest.mark.parametrize(
    "value",
    [
        b'{"d": "\xff"}',  # invalid UTF-8: Spark reads U+FFFD
        b'\xef\xbb\xbf{"d": "bom"}',
        ' {"d": "leading space"}',
        '{"d":\n"line break"}',
        '{"d": "cr"}\r',
        '{"d": "\\ud800"}',  # a lone surrogate: Spark gives "?"
        '{"d": "a", "d": "b"}',  # Spark keeps the last
        '{"d": "a", "\\u0064": "b"}',  # the same key, escaped
        '{"d": 1.5}',  # Jackson re-renders floats through a double
        '{"d": 1e3}',
        '{"d": 12345678901234567890}',
        '{"d": {"x": 1}}',
        '{"d": [1]}',
        '{"d": NaN}',
        "{'d': 'single quotes'}",
        '{"d": 012}',
        '{"d": "a"} trailing',
        '{"d": "tab\there"}',
        "[1, 2]",
        "42",
        "",
        "not json",
        '{"ts": 1',
        '{"d": "a"} ',
        '{"d": "x", "o": Inf}',  # pyarrow reads these, Spark's Jackson does not
        '{"d": "x", "o": [-Inf]}',
        '{"d": "x", "o": -NaN}',
        '{"d": "x", "o": ' + "[" * 1000 + "]" * 1000 + "}",  # Spark's nesting limit
        '{"d": "x", "o": ' + '{"a":' * 1000 + "1" + "}" * 1000 + "}",
        '{"d": "x", "o": ' + "1" * 1001 + "}",  # Spark's number length limit
        '{"d": "x", "' + "k" * 50_001 + '": 1}',  # Jackson's name length limit
    ],
)
@pytest.mark.parametrize("primed", [False, True])
def test_records_the_bulk_parser_cannot_read_go_to_python(value, primed):
    parser = FieldParser(FIELDS)
    if primed:  # the parser has read a batch: the next is read with an explicit schema
        assert texts(['{"ts": 1, "d": "ok"}'], parser)[0] == [True]
    assert exact(['{"ts": 1, "d": "ok"}', value], parser) == [True, False]
    assert exact([value], FieldParser(FIELDS)) == [False]


def test_a_record_of_two_objects_is_found_by_halves():
    # pyarrow reads two rows from it and no error names it: each half is read on its own.
    two = '{"d": "a"} {"d": "b"}'
    assert exact(['{"ts": 1, "d": "ok"}', two]) == [True, False]
    assert exact([two]) == [False]


def test_the_corrupt_record_key_is_an_ordinary_key_now():
    # Spark's from_json made a record with its corrupt-record column's name a dead letter.
    assert texts(['{"ts": 1, "__reconciler_corrupt_record": "x"}'])[0] == [True]


def test_a_cut_record_cannot_swallow_the_next():
    # Joined by "\n", the first would run into the second; the second holds two objects,
    # so the row count alone would come out right.
    batch = ['{"ts": 1, "d": "a", "o":', '{"x": 1}}{"ts": 2, "d": "b"}']
    assert exact(batch) == [False, False]
    primed = FieldParser(FIELDS)
    texts(['{"ts": 1, "d": "ok"}'], primed)
    assert exact(batch, primed) == [False, False]


@pytest.mark.parametrize(
    "value, d",
    [
        ('{"ts": 1, "d": "%s", "o": [[[1]]]}' % ("x" * 5000), "x" * 5000),
        ('{"ts": 2, "d": "Information: Infinite -NaNs", "o": NaN}', "Information: Infinite -NaNs"),
        ('{"ts": 3, "d": "y", "o": [Infinity, -Infinity]}', "y"),
    ],
)
def test_within_the_limits_and_look_alikes_stay_fast(value, d):
    assert texts([value])[1][1] == [d]


def test_tombstones_teach_the_parser_nothing():
    parser = FieldParser(FIELDS)
    assert texts(['{"ts": 1, "d": "a"}'], parser)[0] == [True]
    learnt = parser._schema
    out = parser.parse(pa.array([None, None], pa.binary()))
    assert out.exact.to_pylist() == [False, False] and out.texts[1].null_count == 2
    assert parser._schema == learnt


def test_an_iso_timestamp_is_read_again_as_text():
    parser = FieldParser(FIELDS)
    iso = ['{"ts": "2026-11-24T10:00:00Z", "d": "a"}']
    # pyarrow's inference turned it into a timestamp: read again with ts as a string
    fast, (ts, d, _) = texts(iso, parser)
    assert fast == [True] and ts == ["2026-11-24T10:00:00Z"] and d == ["a"]
    assert texts(iso, parser)[1][0] == ["2026-11-24T10:00:00Z"]


def test_types_change_between_batches():
    parser = FieldParser(FIELDS)
    assert texts(['{"ts": 1, "d": 7}'], parser)[1][1] == ["7"]
    assert texts(['{"ts": 2, "d": "seven"}'], parser)[1][1] == ["seven"]
    assert texts(['{"ts": "3", "d": false}'], parser)[1] == [["3"], ["false"], [None]]


def test_a_parser_stops_trying_after_batches_it_read_nothing_of():
    parser = FieldParser(FIELDS)
    floats = [b'{"ts": 1, "d": 1.5}']
    clean = [b'{"ts": 1, "d": "x"}']
    for _ in range(3):
        assert exact(floats, parser) == [False]
    assert exact(clean, parser) == [False]  # given up
    assert exact(clean, FieldParser(FIELDS)) == [True]


def test_floats_are_read_in_bulk_for_number_only_fields():
    parser = FieldParser(["ts", "x"], numeric=["x"])
    fast, (_, x) = texts(['{"ts": 1, "x": 1.5}', '{"ts": 2, "x": 1000.0}', '{"ts": 3, "x": 2}'], parser)
    assert fast == [True, True, True]
    # Not the rules' text (Python writes 1000.0 as "1000.0", 2 as "2"), but the same double.
    assert x == ["1.5", "1000", "2"]
    # "n" is not numeric: a float column holds its integers as floats too, so every record
    # with a value there is Python's.
    assert exact(['{"ts": 1, "n": 1.5}', '{"ts": 3, "n": 2}']) == [False, False]


def test_the_texts_fit_the_fields():
    parser = FieldParser(["a", "b"])
    out = parser.parse(pa.array([b'{"a": "x"}', b"bad"], pa.binary()))
    assert [c.type for c in out.texts] == [pa.string(), pa.string()]
    assert out.exact.to_pylist() == [True, False] and out.texts[0].to_pylist() == ["x", None]


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    "value, d",
    [
        ('{"d": 1.50}', "1.5"),
        ('{"d": 1e3}', "1000.0"),  # Jackson (Spark) wrote "1000.0" too
        ('{"d": 1e16}', "1e+16"),  # Python's repr; Jackson wrote "1.0E16"
        ('{"d": 1e-7}', "1e-07"),  # Jackson wrote "1.0E-7"
        ('{"d": 1e999}', None),  # beyond a double, Infinity and NaN are null, as in Spark
        ('{"d": -Infinity}', None),
        ('{"d": NaN}', None),
        ('{"d": [NaN, 1e999]}', "[NaN,Infinity]"),
        ('{"d": 9223372036854775808}', "9223372036854775808"),
        ('{"d": -0}', "0"),
        ('{"d": -0.0}', "-0.0"),
        ('{"d": {"k": [1, 2.0, "x", null, true], "j": {}}}', '{"k":[1,2.0,"x",null,true],"j":{}}'),
        ('{"d": {"k": 1, "k": 2}}', '{"k":2}'),  # a nested duplicate collapses
        ('{"d": ["é", "\\n"]}', '["é","\\n"]'),
        ('{"d": "\\ud800x"}', "?x"),  # a lone surrogate: "?" as Spark wrote it
        (b'{"d": "\xff\xfe"}', "\ufffd\ufffd"),  # invalid UTF-8: U+FFFD each
        ('{"d": "a", "d": "b"}', "b"),
        ('{"d": "a", "\\u0064": "b"}', "b"),
        (' \t{"d": "spaces"}\n ', "spaces"),
    ],
)
def test_the_rules_text(value, d):
    out = parse_values([encode(value)], ["d"])
    assert out.ok.to_pylist() == [True] and out.texts[0].to_pylist() == [d]
    if d is not None and not d.startswith(("{", "[")):  # a double-only field in bulk: the same
        bulk = FieldParser(["d"], numeric=["d"]).parse(pa.array([encode(value)], pa.binary()))
        if bulk.exact[0].as_py() and bulk.texts[0][0].as_py() is not None:
            assert same(float(bulk.texts[0][0].as_py()), float(d))


@pytest.mark.parametrize(
    "value",
    [
        "\ufeff{}",  # a byte order mark
        "[]", "null", "", "42", '"s"',
        "{'d': 1}", '{"d": 012}', '{"d": "tab\there"}', '{"d": 1} x', '{"d": 1}{"d": 2}',
        '{"d": -NaN}', '{"d": Inf}', '{"d": +1}',
        '{"d": %s}' % ("[" * 1000 + "]" * 1000),  # depth 1,001
        '{"d": %s}' % ("1" * 1001),
        '{"%s": 1}' % ("k" * 50_001),
    ],
)
def test_what_is_not_a_json_object(value):
    assert parse_values([encode(value)], ["d"]).ok.to_pylist() == [False]


def test_the_limits_themselves_are_fine():
    deep = '{"d": %s}' % ("[" * 999 + "]" * 999)  # depth 1,000
    assert parse_values([encode(deep)], ["d"]).ok.to_pylist() == [True]
    long_number = '{"d": %s}' % ("1" * 1000)
    assert parse_values([encode(long_number)], ["d"]).texts[0].to_pylist() == ["1" * 1000]
    long_name = '{"%s": 1, "d": 2}' % ("k" * 50_000)
    assert parse_values([encode(long_name)], ["d"]).texts[0].to_pylist() == ["2"]


# --------------------------------------------------------------------------- both paths

# Values for a data schema reading "ts", "d" (a dimension), "n" (a long metric) and
# "x" (a double metric): each is a record Spark reads in its own way, or a clean one.
CORPUS = [
    {"ts": T0_MS, "d": "plain", "n": 3, "x": 2},
    {"ts": T0_MS, "d": "é😀\u0000\\\"/", "n": "4", "x": "2.5"},
    '{"ts": %d, "d": "\\ud83d\\ude00 \\u00e9 \\/"}' % T0_MS,
    '{"ts": %d, "d": -0, "n": -0}' % T0_MS,
    '{"ts": %d, "d": true, "n": false}' % T0_MS,
    '{"ts": %d, "d": 1.50, "x": 1e3}' % T0_MS,
    '{"ts": %d, "d": 9223372036854775808}' % T0_MS,
    '{"ts": %d, "d": {"k": [1, 2.0, "x"]}}' % T0_MS,
    '{"ts": %d, "d": "\\ud800"}' % T0_MS,
    '{"ts": %d, "d": "a", "d": "b"}' % T0_MS,
    '{"ts": %d, "x": NaN, "d": "nan"}' % T0_MS,
    '{"ts": %d, "x": 1e999}' % T0_MS,
    "{'ts': %d, 'd': 'quotes'}" % T0_MS,
    '{"ts": %d, "d": "bom"}' % T0_MS,
    '\ufeff{"ts": %d, "d": "bom"}' % T0_MS,
    '  {"ts": %d, "d": "spaces"}  ' % T0_MS,
    '{"ts":\n%d, "d": "newline"}' % T0_MS,
    '{"ts": %d, "d": "tab\there"}' % T0_MS,
    b'{"ts": 1795500000000, "d": "\xff\xfe"}',
    '{"ts": %d, "__reconciler_corrupt_record": "sneaky"}' % T0_MS,
    '{"ts": %d, "D": "case", "us\\u0065r": "escaped key", "d": "k"}' % T0_MS,
    '{"ts": "2025-11-20T12:34:56.789Z", "d": "iso"}',
    '{"ts": "%d", "d": "string ts"}' % T0_MS,
    '{"ts": %d.5, "d": "float ts"}' % T0_MS,
    '{"ts": -9223372036854775808, "d": "min long"}',
    '{"ts": null, "d": "null ts"}',
    '{"d": "no ts"}',
    '{"ts": %d} trailing' % T0_MS,
    '{"ts": %d, "d": 012}' % T0_MS,
    "{}",
    "[]",
    "null",
    "",
    None,
    '{"ts": %d, "\\u0064": "escaped key"}' % T0_MS,
    '{"ts": %d, "d": "a", "\\u0064": "b"}' % T0_MS,
    '{"ts": %d, "d": "cut", "o":' % T0_MS,
    '{"x": 1}}{"ts": %d, "d": "two objects"}' % T0_MS,
    '{"ts": %d, "d": "deep", "o": %s}' % (T0_MS, "[" * 1001 + "]" * 1001),
    '{"ts": %d, "d": "long number", "o": %s}' % (T0_MS, "1" * 1001),
    '{"ts": %d, "d": "long name", "%s": 1}' % (T0_MS, "k" * 50_001),
    '{"ts": %d, "d": "nan", "o": NaN}' % T0_MS,
    '{"ts": %d, "d": "infinity", "o": [Infinity, -Infinity]}' % T0_MS,
    '{"ts": %d, "d": "inf", "o": Inf}' % T0_MS,
    '{"ts": %d, "d": "-nan", "o": -NaN}' % T0_MS,
    '{"ts": %d, "d": "Information: Inf"}' % T0_MS,
    '{"ts": %d, "d": "%s"}' % (T0_MS, "long " * 400),
]


CORPUS_SCHEMA = schema(
    dimensions=("d", "__offset"),
    metrics=(Metric("n", "longSum", "n"), Metric("x", "doubleMax", "x")),
)


def transformed(values, ds, per_batch, *, bulk=True, shared=True):
    """(rows by offset, dead letters by offset, which records the bulk parser read)."""
    batch = records(values)
    t = Transformer(ds, bulk=bulk)
    good, dead, fast = [], [], []
    for start in range(0, batch.num_rows, per_batch):
        if not shared:
            t = Transformer(ds, bulk=bulk)
        part = batch.slice(start, per_batch)
        if bulk:
            parser = t.format.parser_for(t.fields)
            fast += parser.parse(part.column("value")).exact.to_pylist()
            parser._misses = 0
            parser._schema = None if not shared else parser._schema
        out = t(part)
        good.append(out.rows)
        dead.append(out.dead)
    good.append(t.finish().rows)
    order = ["__offset"] if "__offset" in ds.dimensions else ["__time", "d"]
    return nan_free(rows(pa.concat_tables(good), order)), rows(pa.concat_tables(dead), ["offset"]), fast


@pytest.mark.parametrize("per_batch, shared", [(1, False), (2, True), (len(CORPUS), True)])
def test_the_bulk_parser_gives_exactly_what_python_gives(per_batch, shared):
    ds = CORPUS_SCHEMA
    assert json_fields(ds) == ["ts", "d", "n", "x"]
    good_a, dead_a, _ = transformed(CORPUS, ds, len(CORPUS), bulk=False)
    good_b, dead_b, fast = transformed(CORPUS, ds, per_batch, shared=shared)
    assert good_b == good_a
    assert dead_b == dead_a
    fast_offsets = {i for i, f in enumerate(fast) if f}
    # The records pyarrow reads as the rules do. Beside the Spark path's set: 10 (a NaN
    # under "x", read only as a double: a float column is fine there, NaN is null) and 19
    # (the corrupt-record key is an ordinary key now).
    expected = {0, 1, 2, 3, 4, 10, 13, 19, 20, 21, 22, 24, 25, 26, 29, 34, 41, 42, 45, 46}
    if per_batch == 1:
        assert fast_offsets == expected, fast_offsets
    else:
        # A batch with odd records leaves those to Python (and, past the parses a batch
        # may take, the rest too).
        assert fast_offsets <= expected


def test_a_batch_mixing_clean_and_odd_records_is_parsed_as_each_alone():
    ds = CORPUS_SCHEMA
    clean = [{"ts": T0_MS + i, "d": f"u{i % 7}", "n": i, "x": i % 3} for i in range(60)]
    odd = [v for v in CORPUS if v != '{"x": 1}}{"ts": %d, "d": "two objects"}' % T0_MS]
    values = [v for pair in zip(clean, odd, strict=False) for v in pair] + clean[len(odd):]
    alone = transformed(values, ds, 1, shared=False)
    mixed = transformed(values, ds, len(values))
    assert mixed[:2] == alone[:2]
    assert mixed[:2] == transformed(values, ds, len(values), bulk=False)[:2]
    assert sum(mixed[2]) >= len(clean)  # the clean ones all read in bulk


def test_a_clean_batch_is_read_in_bulk_whole():
    values = [
        {"ts": T0_MS + i, "d": f"u{i % 7}", "n": i, "x": i % 3} for i in range(500)
    ] + [None]
    ds = schema(dimensions=("d",), metrics=(Metric("n", "longSum", "n"), Metric("x", "doubleMax", "x")))
    good, dead, fast = transformed(values, ds, 128)
    assert sum(fast) == 500
    assert (good, dead) == transformed(values, ds, 501, bulk=False)[:2]
    assert [r["reason"] for r in dead] == ["null value"]


def test_a_batch_whose_unread_field_has_two_types_is_parsed_the_same():
    values = [
        {"ts": T0_MS + i, "d": [f"u{i}", i, True][i % 3], "o": [1, "one", [1.5], None][i % 4]}
        for i in range(40)
    ]
    ds = schema(dimensions=("d",))
    good, dead, fast = transformed(values, ds, 40, shared=False)
    assert (good, dead) == transformed(values, ds, 40, bulk=False)[:2]
    assert sum(fast) < 40  # "d" has three types: some records are Python's
    values = [{"ts": T0_MS + i, "d": f"u{i}", "o": [1, "one", [1.5], None][i % 4]} for i in range(40)]
    good, dead, fast = transformed(values, ds, 40, shared=False)
    assert sum(fast) == 40 and dead == []
    assert good == transformed(values, ds, 40, bulk=False)[0]


def test_an_integer_minus_zero_under_a_double_field_is_zero_in_bulk_too():
    # The rules read the integer -0 as 0 (its text "0", the double 0.0); a float column
    # (the field's other records are fractions, or the types learnt from the last batch
    # say double) holds it as -0.0, which Arrow writes "-0": the bulk read gave -0.0,
    # so a doubleMin/Max/Sum (or the field's column without rollup) depended on the
    # record's neighbours. -0.0 compares equal to 0.0: the sign is what differs.
    import math

    values = ['{"ts": %d, "x": -0}' % T0_MS, '{"ts": %d, "x": 1.5}' % T0_MS, '{"ts": %d, "x": -0.0}' % T0_MS]
    ds = schema(metrics=(Metric("x", "doubleMin", "x"),))
    for bulk in (False, True):
        got = Transformer(ds, bulk=bulk)(records(values)).rows.column("x").to_pylist()
        assert [math.copysign(1.0, v) for v in got] == [1.0, 1.0, -1.0], (bulk, got)


# --------------------------------------------------------------------------- property

_SCALARS = {
    "int": ["0", "-0", "7", "-12", "9223372036854775807", "9223372036854775808", "-9223372036854775809"],
    "float": ["1.5", "-0.0", "0.0", "1e2", "1E400", "2.5e-3", "5e-324", "1.7976931348623157e308", "9007199254740993.0"],
    "str": ['"a"', '""', '"1"', '"-0"', '"1.5"', '"2025-11-20T12:34:56Z"', '"2025-11-20 12:34:56"', '"\\u00e9"',
            '"\\ud800"', '"x\\"y"', '" 7 "', '"0x10"', '"nan(1)"', '"1e400"'],
    # a float column; an integer beyond a double is null under a double metric, whichever
    # parser reads it (issue 41.5)
    "number": ["-0", "0", "3", "-0.0", "1.25", "18446744073709551616", "-1e-2", "1" + "0" * 400],
    "bool": ["true", "false"],
    "null": ["null"],
    "nested": ['{"a":1}', "[1,2.0]", "{}", "[]", '{"a":1.0e1,"a":2}', "[NaN]"],
    "odd": ["NaN", "-Infinity", "01", "+1", "-NaN", "Inf", "'a'"],
}
_TIMES = [str(T0_MS), str(T0_MS / 1000), '"2025-11-20T12:34:56.789Z"', '"%d"' % T0_MS, "1e12", "-0", "null",
          '"0001-01-01T00:00:00Z"', '"9999-12-31T23:59:59Z"', "253402300800", '"x"', "%d.0" % T0_MS]


def _batches_strategy():
    from hypothesis import strategies as st

    kinds = st.sampled_from(sorted(_SCALARS))

    @st.composite
    def batch(draw):
        types = {k: draw(kinds) for k in ("d", "n", "x", "o")}  # mostly one type per field in a batch
        ts = draw(st.sampled_from(_TIMES))
        out = []
        for _ in range(draw(st.integers(1, 12))):
            items = ['"ts":' + (ts if draw(st.integers(0, 9)) else draw(st.sampled_from(_TIMES)))]
            for k, kind in types.items():
                if draw(st.integers(0, 6)):
                    kind = kind if draw(st.integers(0, 9)) else draw(kinds)
                    items.append('"%s":%s' % (k, draw(st.sampled_from(_SCALARS[kind]))))
            out.append("{%s}" % ",".join(draw(st.permutations(items))))
        return out

    return st.lists(batch(), min_size=1, max_size=4)


def _exactly(table):
    import math

    def one(v):
        return ("float", v, math.copysign(1.0, v)) if isinstance(v, float) and v == v else \
            ("nan",) if isinstance(v, float) else v
    return [{k: one(v) for k, v in r.items()} for r in table.to_pylist()]


def test_bulk_and_python_give_the_same_rows_bit_for_bit_over_random_batches(request):
    """The same batches (one Transformer, as a task has: the types learnt carry over) parsed
    in bulk and in Python give the same rows and dead letters, a double's sign included."""
    from hypothesis import HealthCheck, given, settings

    examples = 150 if request.config.getoption("--soak") else 50  # the unit run's share: a few seconds

    ds_plain = CORPUS_SCHEMA
    ds_rollup = schema(dimensions=("d",), rollup=True,
                       metrics=(Metric("c", "count"), Metric("n", "longSum", "n"), Metric("xs", "doubleSum", "x"),
                                Metric("xmin", "doubleMin", "x"), Metric("xmax", "doubleMax", "x")))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_batches_strategy())
    def check(batches):
        values = [v for b in batches for v in b]
        whole = records(values)
        parts, start = [], 0
        for b in batches:
            parts.append(whole.slice(start, len(b)))
            start += len(b)
        for ds in (ds_plain, ds_rollup):
            got = {}
            for bulk in (True, False):
                t = Transformer(ds, bulk=bulk)
                outs = [t(p) for p in parts]
                good = pa.concat_tables([o.rows for o in outs] + [t.finish().rows])
                dead = pa.concat_tables([o.dead for o in outs])
                got[bulk] = (sorted(_exactly(good), key=repr), _exactly(dead.sort_by("offset")))
            assert got[True] == got[False], values

    check()
