"""Issue 42's typed replay and discovery join under adversarial input (a review of
80b479c..76962af): dead letters replayed under schemaDiscovery, and keys that differ only
in case, through the real transaction (``replaykit``'s way, with the table's types handed
to the tasks as ``batch.task_plan`` does, and the batch run again with the joined types
when ``settle`` asks, as ``run_batch`` does)."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pytest

from reconciler.model import SupervisorSpec
from reconciler.pipeline.batch import discovered_schema, plain_types
from reconciler.store.store import Store
from reconciler.table import catalog as cat
from reconciler.table.replay import replay
from tests.e2e import helpers as h
from tests.table import replaykit as kit

MS = int(kit.T0.timestamp() * 1000)
ISO = (kit.T0 + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _doc(fmt: str, discovery: bool = True) -> dict:
    doc = kit.spec_document("clicks", fmt)
    doc["dataSchema"]["schemaDiscovery"] = discovery
    return doc


@pytest.fixture
def setup(tmp_path):
    db = f"sqlite:///{tmp_path / 'reconciler.db'}"
    s = h.make_settings(tmp_path, db=db)
    store = Store(db)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document(_doc("millis")), None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    tables = cat.Tables(store.engine, s.segments_dir)
    yield store, tables
    store.close()


def _publish_typed(store, tables, start, raw):
    """kit.publish, with the table's types handed to the transform, the batch run again
    with the joined types when ``settle`` asks, and the discovered columns in the
    publish's schema, as run_batch does."""
    from reconciler.pipeline import transform
    from reconciler.pipeline.discovered import Discovered, settle

    real = transform.Transformer
    table = tables.load("clicks")
    types = plain_types(table.schema().as_arrow()) if table is not None else {}

    class Typed(real):
        def __init__(self, ds, **kw):
            super().__init__(ds, table_types=types, **kw)
            self.rows_schema_declared = self.rows_schema

        def __call__(self, batch):
            probe = real(self.ds, table_types=types)
            probe(batch)
            _, again = settle([pa.schema(probe.discovery.report())])
            if again:
                self.discovery = Discovered({**types, **again})
            out = super().__call__(batch)
            self.rows_schema = discovered_schema(self.rows_schema_declared, [pa.schema(self.discovery.schema())])
            return out

    kit.Transformer = Typed
    try:
        return kit.publish(store, tables, "clicks", start, start + len(raw), raw)
    finally:
        kit.Transformer = real


def _rows(tables, *cols):
    return sorted(tables.load("clicks").scan(selected_fields=("id", *cols)).to_arrow().to_pylist(),
                  key=lambda r: r["id"])


@pytest.mark.parametrize("second", ["x", 2.5])
def test_letters_of_two_batches_that_met_a_new_key_differently_come_back_when_discovery_is_turned_on(setup, second):
    # The spec read ts as millis without schemaDiscovery; two batches dead-lettered records
    # with an ISO ts, batch 1's holding z = 1, batch 2's z = "x" (or 2.5). The fix turns
    # the format to iso and schemaDiscovery on (the table has no z). Replay parses each
    # dead-letter file with a Transformer of its own: file 1 decides z long, file 2 string
    # (or double), and _write's pa.unify_schemas raises ArrowTypeError ("Unable to merge:
    # Field z has incompatible types: int64 vs string") on every attempt: the letters never
    # come back. One batch holding both records joins z (string; double) and keeps both.
    store, tables = setup
    store.update_spec(SupervisorSpec.from_document(_doc("millis", discovery=False)), None, actor="test")
    kit.publish(store, tables, "clicks", 0, 2, [json.dumps({"id": "good", "ts": MS}).encode(),
                                                json.dumps({"id": "a", "ts": ISO, "z": 1}).encode()])
    kit.publish(store, tables, "clicks", 2, 3, [json.dumps({"id": "b", "ts": ISO, "z": second}).encode()])
    assert kit.table_offsets(tables, "clicks_deadletter") == [1, 2]
    store.update_spec(SupervisorSpec.from_document(_doc("iso")), None, actor="test")
    replay(tables, store, "clicks", actor="test")  # ArrowTypeError on the code under review
    want = [("a", "1"), ("b", "x")] if second == "x" else [("a", 1.0), ("b", 2.5)]
    assert [(r["id"], r["z"]) for r in _rows(tables, "z")] == [*want, ("good", None)]
    assert kit.table_offsets(tables, "clicks_deadletter") == []


def _declared_table(store, tables, *extra: pa.Field):
    from reconciler.pipeline.transform import Transformer

    ds = store.get("clicks").spec.data_schema
    schema = Transformer(ds).rows_schema  # the declared columns, as the runtime creates the table
    tables.ensure("clicks", pa.schema([*schema, *extra]), ds.segment_granularity)


def test_keys_differing_only_in_case_make_one_column_and_the_other_spelling_a_dead_letter(setup):
    # Batch 1 meets {"Q": 1, "q": "x"}. Before: the table got Q long and q string (one
    # column to Trino, Glue and Hive), and batch 2's {"Q": 7} was written as the string "7"
    # into a file the table read as long (q's type shadowed Q's by lower-case name).
    store, tables = setup
    _declared_table(store, tables)
    _publish_typed(store, tables, 0, [json.dumps({"id": "a", "ts": MS, "Q": 1, "q": "x"}).encode()])
    types = {f.name: f.type for f in tables.load("clicks").schema().as_arrow()}
    assert types["Q"] == pa.int64() and "q" not in types
    _publish_typed(store, tables, 1, [json.dumps({"id": "b", "ts": MS + 1, "Q": 7}).encode(),
                                      json.dumps({"id": "c", "ts": MS + 1, "q": "y"}).encode()])
    assert [(r["id"], r["Q"]) for r in _rows(tables, "Q")] == [("b", 7)]
    assert kit.table_offsets(tables, "clicks_deadletter") == [0, 2]
    reasons = tables.load("clicks_deadletter").scan(selected_fields=("reason",)).to_arrow().column("reason")
    assert {r.split(";")[0] for r in reasons.to_pylist()} == {"field q: the table has a column Q"}


def test_a_table_from_before_the_rule_with_both_spellings_reads_back_what_was_written(setup):
    # A table that holds Q long and q string already: each spelling keeps its own type.
    store, tables = setup
    _declared_table(store, tables, pa.field("Q", pa.int64()), pa.field("q", pa.string()))
    _publish_typed(store, tables, 0, [json.dumps({"id": "a", "ts": MS, "Q": 1, "q": "x"}).encode(),
                                      json.dumps({"id": "b", "ts": MS + 1, "Q": 7}).encode()])
    assert kit.table_offsets(tables, "clicks_deadletter") == []
    assert [(r["id"], r["Q"], r["q"]) for r in _rows(tables, "Q", "q")] == [("a", 1, "x"), ("b", 7, None)]
