"""A new leader's runtimes wait for its first reconcile pass, which applies the markers left
while no daemon led (``RuntimeManager.start``), and the kept fsync pool shared by threads;
against the real broker and SQLite. The steps are recorders: the scheduling is under test."""

from __future__ import annotations

import threading
import time

import pytest

import devservices
from reconciler.daemon import leadership as leadership_mod
from reconciler.runtime.manager import RuntimeManager
from reconciler.runtime.supervisor import StepOutcome, SupervisorRuntime
from reconciler.store.store import Store
from reconciler.table import durable
from tests.daemon.test_notify import wait_until
from tests.daemon.test_watch import daemon_thread
from tests.e2e import helpers


@pytest.mark.kafka
@pytest.mark.integration
def test_a_marker_left_while_none_led_applies_before_the_next_leaders_first_step(
        kafka_broker, topic, tmp_path, monkeypatch):
    """Daemon 1 leads and steps; it stops; records arrive and a ``resetTo: latest`` marker is
    dropped while no daemon leads. Daemon 2's runtimes must not step before its first pass
    applied the marker (every step of term 2 sees the reset's epoch), and must not wait for
    the 10 s bound either (tickInterval far: the pass is due at once)."""
    name, s, steps = _first_term(kafka_broker, topic, tmp_path, monkeypatch)
    store = Store(s.db_url)
    try:
        before = store.get("clicks").epoch
        devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(100, start=100))
        (tmp_path / "specs" / "clicks.reset.yaml").write_text("resetTo: latest\nreason: review\n")
        steps.clear()
        started = time.monotonic()
        with daemon_thread(s):
            wait_until(lambda: steps, 20, "a step of the second term")
            time.sleep(0.3)
        assert store.get("clicks").epoch > before, "the marker was not applied"
        assert all(epoch > before for _, sid, epoch in steps if sid == "clicks"), f"a step ran before the marker applied: {steps}"
        assert steps[0][0] - started < leadership_mod.FIRST_PASS_WAIT - 2, "the runtimes waited for the bound"
    finally:
        store.close()


@pytest.mark.kafka
@pytest.mark.integration
def test_an_aborted_first_pass_keeps_the_runtimes_waiting_and_is_tried_again(
        kafka_broker, topic, tmp_path, monkeypatch):
    """The first pass of a term aborts (a database error): the runtimes stay held, the pass is
    tried again at once rather than at the next tick, and no step runs before the pass that
    applied the marker."""
    from reconciler.daemon import tick as tick_mod
    from reconciler.errors import ReconcilerError

    _name, s, steps = _first_term(kafka_broker, topic, tmp_path, monkeypatch)
    passes: list[float] = []
    store = Store(s.db_url)
    real = tick_mod.reconcile_once

    def flaky(*args, **kwargs):
        passes.append(time.monotonic())
        if len(passes) == 1:
            raise ReconcilerError("the database is away (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(tick_mod, "reconcile_once", flaky)
    try:
        before = store.get("clicks").epoch
        (tmp_path / "specs" / "clicks.reset.yaml").write_text("resetTo: latest\nreason: review\n")
        steps.clear()
        with daemon_thread(s):
            wait_until(lambda: steps, 20, "a step of the second term")
            time.sleep(0.3)
        assert len(passes) >= 2 and passes[1] - passes[0] < 5, passes  # again at once, not at the tick
        assert store.get("clicks").epoch > before, "the marker was not applied"
        assert steps[0][0] > passes[1], "a step ran before the pass that applied the marker"
        assert all(epoch > before for _, sid, epoch in steps if sid == "clicks"), steps
    finally:
        store.close()


def test_concurrent_syncs_from_many_threads_share_the_kept_pool(tmp_path):
    """Runtime threads and the compactor fsync at once through the one kept pool: each call
    returns after its own files, none is lost or deadlocks, and a failure stays its caller's."""
    files = []
    for i in range(64):
        f = tmp_path / f"d{i % 4}" / f"f{i}.parquet"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(b"x" * 10)
        files.append(f)
    errors: list[BaseException] = []
    done: list[int] = []

    def worker(k: int) -> None:
        try:
            for _ in range(20):
                if k == 0:
                    with pytest.raises(FileNotFoundError):
                        durable.sync([tmp_path / "gone.parquet", *files[:8]], [tmp_path])
                else:
                    durable.sync(files[k * 4:(k + 1) * 4], [tmp_path])
            done.append(k)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a sync hung on the shared pool"
    assert errors == [] and sorted(done) == list(range(12))


def _first_term(kafka_broker, topic, tmp_path, monkeypatch):
    """A topic of 100 records and a daemon that led one term and stepped ``clicks``; its steps
    are recorders (the scheduling under test; no Spark). (topic name, settings, the steps
    recorded as (time, supervisor, epoch), by this daemon and the next)."""
    name = topic(partitions=1)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(100))
    steps: list[tuple[float, str, int]] = []

    def step(self):
        rec = self.ctx.store.get(self.supervisor_id)
        steps.append((time.monotonic(), self.supervisor_id, rec.epoch))
        return StepOutcome(0.1)

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    monkeypatch.setattr(RuntimeManager, "_start_spark", lambda self: None)
    s = helpers.make_settings(tmp_path, tick_interval=60.0)
    helpers.write_spec(s.specs, helpers.spec_doc("clicks", helpers.kafka_source(kafka_broker.bootstrap, name)))
    with daemon_thread(s):
        wait_until(lambda: steps, 20, "a step of the first term")
    return name, s, steps
