"""Value formats behind one interface (``pipeline/formats``), typed and nested dimensions
in the transform, CSV, and the same records cut anywhere giving the same typed rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from reconciler.model import DataSchema, Dimension, SupervisorSpec
from reconciler.pipeline.formats import Field, format_for
from reconciler.pipeline.formats.csv import CsvFormat
from reconciler.pipeline.formats.json import JsonFormat
from reconciler.pipeline.transform import Transformer, output_schemas
from tests.pipeline.test_batch_cuts import cut_points, run
from tests.pipeline.test_transform import T0_MS, records


def typed_schema(**kw) -> DataSchema:
    dims = kw.pop("typed", (Dimension("user", "string", ("user",)), Dimension("price", "double", ("price",)),
                            Dimension("qty", "long", ("qty",)), Dimension("ok", "boolean", ("ok",)),
                            Dimension("country", "string", ("geo", "country")),
                            Dimension("tags", "json", ("tags",)), Dimension("__offset")))
    return DataSchema(datasource="orders", timestamp_column="ts", timestamp_format="millis",
                      dimensions=tuple(d.name for d in dims), typed=tuple(dims), **kw)


def test_the_registry_picks_the_format_once_by_name():
    assert isinstance(format_for(DataSchema("d", "ts")), JsonFormat)
    csv = DataSchema("d", "ts", format="csv", format_options={"columns": ["ts", "a"]})
    assert isinstance(format_for(csv), CsvFormat)
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        format_for(DataSchema("d", "ts", format="xml"))


def test_a_spec_document_gives_typed_dimensions_by_name_type_and_path():
    doc = {"id": "o", "source": {"type": "kafka", "bootstrapServers": "h:1", "topic": "t"},
           "dataSchema": {"datasource": "orders", "timestamp": {"column": "ts"}, "schemaDiscovery": True,
                          "format": "csv", "csv": {"columns": ["ts", "user", "price"], "delimiter": ";"},
                          "dimensions": ["user", {"name": "price", "type": "double"},
                                         {"name": "country", "path": "geo.country"}]}}
    ds = SupervisorSpec.from_document(doc).data_schema
    assert ds.dimensions == ("user", "price", "country")
    assert ds.typed == (Dimension("user", "string", ("user",)), Dimension("price", "double", ("price",)),
                        Dimension("country", "string", ("geo", "country")))
    assert ds.format_options == {"columns": ["ts", "user", "price"], "delimiter": ";"}
    assert ds.schema_discovery is True


def test_typed_dimensions_are_typed_columns():
    rows, _ = output_schemas(typed_schema())
    assert [(f.name, str(f.type)) for f in rows] == [
        ("__time", "timestamp[us, tz=UTC]"), ("user", "string"), ("price", "double"), ("qty", "int64"),
        ("ok", "bool"), ("country", "string"), ("tags", "string"), ("__offset", "int64")]


@pytest.mark.parametrize("bulk", [True, False])
def test_typed_and_nested_json_values(bulk):
    values = [
        {"ts": T0_MS, "user": "u", "price": 1.5, "qty": 3, "ok": True, "geo": {"country": "fr"}, "tags": ["a", 1]},
        {"ts": T0_MS, "user": 7, "price": 2, "qty": "4", "ok": False, "geo": {"city": "x"}, "tags": {"k": None}},
        {"ts": T0_MS},
    ]
    out = Transformer(typed_schema(), bulk=bulk)(records(values))
    assert out.dead.num_rows == 0
    got = out.rows.drop_columns(["__time", "time_chunk"]).to_pylist()
    assert got == [
        {"user": "u", "price": 1.5, "qty": 3, "ok": True, "country": "fr", "tags": '["a",1]', "__offset": 100},
        {"user": "7", "price": 2.0, "qty": 4, "ok": False, "country": None, "tags": '{"k":null}', "__offset": 101},
        {"user": None, "price": None, "qty": None, "ok": None, "country": None, "tags": None, "__offset": 102},
    ]


@pytest.mark.parametrize("bulk", [True, False])
@pytest.mark.parametrize("field, value, reason", [
    ("qty", "abc", 'qty: "abc" is not a long'),
    ("qty", 1.5, 'qty: "1.5" is not a long'),
    ("price", "cheap", 'price: "cheap" is not a double'),
    ("ok", "yes", 'ok: "yes" is not a boolean'),
])
def test_a_value_that_does_not_fit_its_type_is_a_dead_letter_naming_the_field(bulk, field, value, reason):
    values = [{"ts": T0_MS, "qty": 1}, {"ts": T0_MS, field: value}]
    out = Transformer(typed_schema(), bulk=bulk)(records(values))
    assert out.rows.column("__offset").to_pylist() == [100]
    assert out.dead.to_pylist()[0]["offset"] == 101
    assert out.dead.to_pylist()[0]["reason"] == reason


def test_a_bad_timestamp_is_named_before_a_misfit():
    out = Transformer(typed_schema())(records([{"ts": "x", "qty": "abc"}]))
    assert out.dead.column("reason").to_pylist() == ["unparseable timestamp (millis): x"]


def test_typed_rows_do_not_depend_on_where_the_batch_is_cut():
    rng = random.Random(42)
    choices = [1, 2.5, "7", "abc", True, None, {"country": "de"}, [1, {"a": 2}], 1e400, -0.0, "true"]
    values = []
    for _ in range(60):
        rec = {k: rng.choice(choices) for k in ("user", "price", "qty", "ok", "geo", "tags")}
        rec["ts"] = T0_MS
        values.append({k: v for k, v in rec.items() if v is not None or rng.random() < 0.5})
    batch = records(values)
    ds = typed_schema()
    reference = run(batch, ds, [], shared=True, bulk=False)
    assert reference[0] and reference[1]  # both rows and dead letters
    for _ in range(20):
        for shared in (True, False):
            cuts = cut_points(rng, len(values))
            assert run(batch, ds, cuts, shared=shared) == reference, (shared, cuts)


def csv_schema(**options) -> DataSchema:
    options.setdefault("columns", ["id", "ts", "user", "price"])
    dims = (Dimension("id", "long", ("id",)), Dimension("user"), Dimension("price", "double", ("price",)),
            Dimension("__offset"))
    return DataSchema("orders", "ts", "millis", format="csv", dimensions=tuple(d.name for d in dims),
                      typed=dims, format_options=options)


def test_csv_rows_become_typed_columns_and_odd_rows_dead_letters():
    values = [f"1,{T0_MS},ann,2.5", f'2,{T0_MS},"b,o""b",', f"3,{T0_MS},x", f"4,{T0_MS},a,b,c", "",
              f'5,{T0_MS},"multi\nline",1', f"x,{T0_MS},y,1", None]
    out = Transformer(csv_schema())(records(values))
    assert out.rows.drop_columns(["__time", "time_chunk", "__offset"]).to_pylist() == [
        {"id": 1, "user": "ann", "price": 2.5}, {"id": 2, "user": 'b,o"b', "price": None},
        {"id": 5, "user": "multi\nline", "price": 1.0}]
    assert [(d["offset"], d["reason"]) for d in out.dead.to_pylist()] == [
        (102, "csv: 3 fields where 4 columns are declared"), (103, "csv: 5 fields where 4 columns are declared"),
        (104, "csv: 0 rows in one record; a record is one row"), (106, 'id: "x" is not a long'),
        (107, "null value")]


def test_csv_delimiter_and_header():
    ds = csv_schema(delimiter=";", skipHeader=True)
    out = Transformer(ds)(records([f"id;ts;user;price\n1;{T0_MS};ann;2", f"id;ts;user;price\n2;{T0_MS};bo;3"]))
    assert out.rows.column("user").to_pylist() == ["ann", "bo"]
    assert out.dead.num_rows == 0


def test_csv_rows_do_not_depend_on_where_the_batch_is_cut():
    rng = random.Random(7)
    cells = ["1", "2.5", "", '"q,x"', "abc", str(T0_MS)]
    values = [",".join([rng.choice(cells[:2]), str(T0_MS)] + [rng.choice(cells) for _ in range(rng.choice([1, 2, 3]))])
              for _ in range(50)]
    batch = records(values)
    ds = csv_schema()
    reference = run(batch, ds, [], shared=True)
    assert reference[0] and reference[1]
    for _ in range(20):
        cuts = cut_points(rng, len(values))
        assert run(batch, ds, cuts, shared=False) == reference, cuts


def test_a_format_decodes_nested_paths_only_where_the_object_is():
    decoded = JsonFormat(DataSchema("d", "ts")).decode(
        pa.array([b'{"a":{"b":{"c":1.0}}}', b'{"a":"text"}', b'{"a":{"b":[1]}}'], pa.binary()),
        [Field("c", ("a", "b", "c"), "double"), Field("b", ("a", "b"), "json")])
    assert decoded.columns["c"].to_pylist() == ["1.0", None, None]
    assert decoded.columns["b"].to_pylist() == ['{"c":1.0}', None, "[1]"]
    assert decoded.dead is None
