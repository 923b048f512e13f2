"""Which schema changes a table takes (issue 42): add optional columns, widen by Iceberg's
promotions, refuse the rest; what ``plan`` prints for them."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

from reconciler.model import DataSchema, Dimension
from reconciler.pipeline.transform import output_schemas
from reconciler.table.types import changes, refused

CURRENT = Schema(NestedField(1, "qty", IntegerType(), required=False),
                 NestedField(2, "user", StringType(), required=False),
                 NestedField(3, "price", DoubleType(), required=False),
                 NestedField(4, "n", LongType(), required=False))


def test_a_new_column_is_added_optional_and_a_promotion_widens():
    found = changes(CURRENT, pa.schema([("qty", pa.int64()), ("coupon", pa.string()), ("user", pa.string())]))
    assert [str(c) for c in found] == ["~ column qty int -> long", "+ column coupon string (optional)"]
    assert not refused(found)


def test_an_incompatible_change_is_refused_with_the_reason_and_a_narrower_value_is_fine():
    found = changes(CURRENT, pa.schema([("user", pa.int64()), ("price", pa.float32()), ("n", pa.int32())]))
    assert [c.column for c in refused(found)] == ["user"]
    assert str(found[0]).startswith("! column user string -> long: refused (Iceberg cannot change a string column")


def test_a_spec_typing_a_string_dimension_is_refused_against_its_table():
    ds = DataSchema("d", "ts", dimensions=("user",), typed=(Dimension("user", "long", ("user",)),))
    assert [c.column for c in refused(changes(CURRENT, output_schemas(ds)[0]))] == ["user"]


def test_nested_columns_are_typed_and_compared_whatever_their_ids():
    """A discovered record, list or map column (no ids in a batch, ids in the table): the
    name mapping of top-level names alone failed on ``geo.city``; an unchanged nested
    column is no change, a new one an optional column."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import assign_fresh_schema_ids

    nested = pa.schema([("geo", pa.struct([("city", pa.string())])), ("tags", pa.list_(pa.string())),
                        ("m", pa.map_(pa.string(), pa.int64()))])
    table = assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(nested))
    assert changes(table, nested) == []
    more = nested.append(pa.field("line", pa.struct([("sku", pa.string())])))
    assert [str(c) for c in changes(table, more)] == ["+ column line struct<sku: string> (optional)"]


def test_a_record_column_that_gains_a_field_widens_and_one_that_changes_a_field_is_refused():
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import assign_fresh_schema_ids

    table = assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(pa.schema([("geo", pa.struct([("city", pa.string())]))])))
    grown = pa.schema([("geo", pa.struct([("city", pa.string()), ("zip", pa.string())]))])
    assert [str(c) for c in changes(table, grown)] == [
        "~ column geo struct<city: string> -> struct<city: string, zip: string>"]
    changed = pa.schema([("geo", pa.struct([("city", pa.int64())]))])
    assert [c.column for c in refused(changes(table, changed))] == ["geo"]


def test_a_column_differing_from_the_tables_only_in_case_is_refused_and_both_spellings_of_an_old_table_kept():
    # Before: names were compared lower-cased, so "User" was taken as the table's "user"
    # and the file's column read as null; Trino, Glue and Hive read two such names as one.
    found = changes(CURRENT, pa.schema([("User", pa.string()), ("user", pa.string())]))
    assert [str(c) for c in found] == [
        "! column User string: refused (the table has a column user: a column name that differs from another only "
        "in case is refused; use that spelling or another name)"]
    both = Schema(NestedField(1, "Q", LongType(), required=False), NestedField(2, "q", StringType(), required=False))
    assert changes(both, pa.schema([("Q", pa.int64()), ("q", pa.string())])) == []
