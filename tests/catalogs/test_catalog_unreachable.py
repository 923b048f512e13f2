"""A lake's catalog that does not answer: the step fails with the setting's name and is
retried with a back-off (never a crash), the supervisor's status and /healthz say why, and the leader's
recovery leaves every write alone (nothing fenced, nothing deleted)."""

from __future__ import annotations

import pytest

from devservices.service import free_port
from reconciler.model import SupervisorSpec
from reconciler.runtime.recovery import recover
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from reconciler.store.store import Store
from reconciler.table.catalogs.external import CatalogUnreachable, ExternalTables
from reconciler.table.writeids import new_write_id

SECRET = "not-a-real-secret-but-never-shown"


@pytest.fixture
def nowhere(s3_bucket):
    port = free_port()  # nothing listens there
    props = {"glue.endpoint": f"http://127.0.0.1:{port}", "glue.region": "us-east-1",
             "glue.access-key-id": "k", "glue.secret-access-key": SECRET, "glue.max-retries": "1"}
    return {"type": "glue", "namespace": "lake", "properties": props}, f"s3://{s3_bucket}/wh"


def test_the_catalog_out_of_reach_is_an_error_naming_the_setting(nowhere, tmp_path):
    setting, warehouse = nowhere
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    tables = ExternalTables(store.engine, warehouse, setting)
    with pytest.raises(CatalogUnreachable) as err:
        tables.load("clicks")
    assert "setting catalog" in str(err.value) and SECRET not in str(err.value)
    from reconciler.spec.secrets import scrub

    assert SECRET not in scrub(f"boto said: {SECRET}")  # a literal secret is learnt by the scrubber
    store.close()


def test_a_step_reports_it_and_backs_off_and_recovery_deletes_nothing(nowhere, tmp_path):
    setting, warehouse = nowhere
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:1", "topic": "t"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="test")
    from reconciler.observe.metrics import Metrics

    metrics = Metrics()
    metrics.set_role("leader")
    ctx = RuntimeContext(store=store, segments_dir=warehouse, spark=lambda: None, catalog=setting, metrics=metrics)
    runtime = SupervisorRuntime("clicks", ctx)
    outcomes = [runtime.step() for _ in range(3)]
    assert all(o.delay > 0 and not o.done for o in outcomes)
    rec = store.get("clicks")
    assert "setting catalog" in (rec.last_error or "") and str(rec.state) == "UNHEALTHY_SUPERVISOR"
    assert SECRET not in (rec.last_error or "")
    healthy, doc = metrics.health()  # what /healthz answers
    assert not healthy and any("setting catalog" in p for p in doc["problems"])
    in_flight = new_write_id()
    store.begin_write(in_flight, "batch", tables=["clicks"], supervisor_id="clicks")
    recover(store, warehouse, setting)  # logs and stops: never fences a write the table may hold
    assert [w.write_id for w in store.writes_in_flight()] == [in_flight]
    runtime.close()
    store.close()
