"""A spec whose columns its table cannot take (issue 42) is refused by apply (the CLI's and
the daemon's pass alike): recorded as that supervisor's spec error, which keeps running on
its last valid spec; the next pass says so again without another audit entry. A real
SQLite store and a real Iceberg catalog over a local warehouse."""

from __future__ import annotations

import sqlalchemy as sa

from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind
from reconciler.model import SupervisorSpec
from reconciler.pipeline.transform import output_schemas
from reconciler.store.store import Store
from reconciler.table.catalog import Tables


def _spec(qty_type: str, extra: tuple = ()) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": "orders", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "o"},
        "dataSchema": {"datasource": "orders", "timestamp": {"column": "ts"},
                       "dimensions": [{"name": "qty", "type": qty_type}, *extra]}})


def _audits(store: Store) -> int:
    with store.engine.connect() as c:
        return c.execute(sa.text("select count(*) from audit_log where action = 'mark-invalid'")).scalar()


def test_a_column_change_the_table_refuses_keeps_the_last_good_spec(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    warehouse = str(tmp_path / "wh")
    good = _spec("long")
    store.create_supervisor(good, "specs/orders.yaml", actor="test")
    Tables(store.engine, warehouse).ensure("orders", output_schemas(good.data_schema)[0], "hour")
    applier = Applier(store, actor="test", warehouse=warehouse)

    bad = _spec("string")
    [result] = applier.apply([Action(ActionKind.UPDATE, "orders", "spec changed", spec=bad, path="specs/orders.yaml")])
    assert not result.ok
    assert "qty long -> string: refused" in result.message and "keeps running on its last valid spec" in result.message
    rec = store.get("orders")
    assert rec.spec_hash == good.spec_hash  # still the old spec
    assert rec.spec_error.startswith("specs/orders.yaml: table 'orders' cannot take the spec's columns")
    audits = _audits(store)
    [again] = applier.apply([Action(ActionKind.UPDATE, "orders", "spec changed", spec=bad, path="specs/orders.yaml")])
    assert not again.ok and _audits(store) == audits

    widened = _spec("long", ({"name": "coupon", "type": "string"},))  # a new column: added at publish
    [ok] = applier.apply([Action(ActionKind.UPDATE, "orders", "spec changed", spec=widened, path="specs/orders.yaml")])
    assert ok.ok and store.get("orders").spec_hash == widened.spec_hash and store.get("orders").spec_error is None
    store.close()
