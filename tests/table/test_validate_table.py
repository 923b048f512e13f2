"""``validate`` checks each spec's columns against its table where the database is there
(issue 42): a change the table cannot take is a problem naming the column and both types;
without a database nothing of the kind is checked. A real SQLite store and Iceberg catalog."""

from __future__ import annotations

from click.testing import CliRunner

from reconciler.cli import cli
from reconciler.model import SupervisorSpec
from reconciler.pipeline.transform import output_schemas
from reconciler.store.store import Store
from reconciler.table.catalog import Tables

SPEC = """id: orders
source: {{type: kafka, bootstrapServers: "127.0.0.1:9", topic: o}}
dataSchema:
  datasource: orders
  timestamp: {{column: ts}}
  dimensions: [{{name: qty, type: {qty}}}]
"""


def test_validate_refuses_a_column_change_the_table_cannot_take(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir(mode=0o700)
    (specs / "orders.yaml").write_text(SPEC.format(qty="string"))
    (specs / "orders.yaml").chmod(0o600)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    base = ["--specs", str(specs), "--state-dir", str(tmp_path / "state"), "--db", db,
            "--segments", str(tmp_path / "wh")]
    runner = CliRunner()
    assert runner.invoke(cli, [*base, "validate"]).exit_code == 0  # no database: not checked

    store = Store(db)
    store.migrate()
    old = SupervisorSpec.from_document({"id": "orders", "source": {"type": "kafka", "bootstrapServers": "x:9",
                                        "topic": "o"}, "dataSchema": {"datasource": "orders", "timestamp": {
                                        "column": "ts"}, "dimensions": [{"name": "qty", "type": "long"}]}})
    Tables(store.engine, str(tmp_path / "wh")).ensure("orders", output_schemas(old.data_schema)[0], "hour")
    store.close()
    result = runner.invoke(cli, [*base, "validate"])
    assert result.exit_code == 1, result.output
    # at the dimension's line and field (it said only "dataSchema", no line)
    assert f"{specs / 'orders.yaml'}:6:16: dataSchema.dimensions[0]: table 'orders' cannot take the spec's " \
        "columns: column qty long -> string: refused" in result.stdout, result.stdout
    (specs / "orders.yaml").write_text(SPEC.format(qty="long"))
    assert runner.invoke(cli, [*base, "validate"]).exit_code == 0
