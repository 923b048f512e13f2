"""The runtime manager's step time limit: a supervisor stuck in I/O is reported UNHEALTHY and
the others keep their share of the runtime threads (issue 29).

The steps here are stand-ins (a step that blocks on a FIFO like a client reading a secret
swapped for a pipe, and steps that return at once); the store is a real SQLite database.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from reconciler.control.actual import DetailedState, State
from reconciler.model import SupervisorSpec
from reconciler.observe.metrics import Metrics
from reconciler.runtime import manager as manager_mod
from reconciler.runtime.manager import RuntimeManager
from reconciler.runtime.supervisor import RuntimeContext, StepOutcome, SupervisorRuntime
from reconciler.store.store import Store

STUCK = ("stuck-a", "stuck-b")


def _spec(sid: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid},
        "dataSchema": {"datasource": sid.replace("-", "_"), "timestamp": {"column": "ts"}}})


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    for sid in (*STUCK, "good"):
        s.create_supervisor(_spec(sid), None, actor="test")
    yield s
    s.close()


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail(f"no {what} within {timeout}s")


def test_a_step_stuck_in_io_is_reported_and_the_others_keep_their_threads(store, tmp_path, monkeypatch):
    fifo = tmp_path / "secret"
    os.mkfifo(fifo)  # open() of a FIFO with no writer blocks: I/O no client timeout bounds
    steps: Counter[str] = Counter()
    concurrent: dict[str, int] = Counter()
    overlap: list[str] = []
    lock = threading.Lock()

    def step(self: SupervisorRuntime) -> StepOutcome:
        sid = self.supervisor_id
        with lock:
            concurrent[sid] += 1
            steps[sid] += 1
            if concurrent[sid] > 1:
                overlap.append(sid)
        try:
            if sid in STUCK and steps[sid] == 1:
                Path(fifo).read_bytes()  # blocks until the test writes
            return StepOutcome(0.01, records=1 if sid == "good" else 0)
        finally:
            with lock:
                concurrent[sid] -= 1

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    metrics = Metrics()
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None, metrics=metrics)
    manager = RuntimeManager(ctx, workers=2, refresh=0.05, step_timeout=0.5)
    base = threading.active_count()
    manager.start()
    try:
        _wait(lambda: steps["stuck-a"] and steps["stuck-b"], 10, "first steps")
        _wait(lambda: manager.stuck() == list(STUCK), 10, "both stuck steps abandoned")
        before = steps["good"]
        _wait(lambda: steps["good"] >= before + 20, 10, "the good supervisor stepping on")
        for sid in STUCK:
            rec = store.get(sid)
            assert (rec.state, rec.detailed_state) == (State.UNHEALTHY_SUPERVISOR, DetailedState.UNHEALTHY_SUPERVISOR)
            assert "over the 0.5s limit (stepTimeout)" in rec.runtime_error
            assert "stuck in read_bytes" in rec.runtime_error or "stuck in open" in rec.runtime_error
            assert sid in metrics.failing
        assert steps["stuck-a"] == steps["stuck-b"] == 1, "a stuck supervisor is not stepped again"
        # the manager, two abandoned steps and at most two working ones
        assert threading.active_count() - base <= 1 + len(STUCK) + 2

        with open(fifo, "wb") as w1, open(fifo, "wb") as w2:  # release both readers
            w1.write(b"x")
            w2.write(b"y")
        _wait(lambda: not manager.stuck(), 10, "the stuck steps coming back")
        _wait(lambda: steps["stuck-a"] > 1 and steps["stuck-b"] > 1, 10, "the stuck supervisors stepping again")
    finally:
        manager.stop(wait=True)
    assert overlap == [], f"a runtime was stepped twice at once: {overlap}"


def test_the_limit_is_the_step_timeout_setting(monkeypatch, tmp_path):
    from reconciler import settings as settings_mod

    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    assert settings_mod.load({}, None, env={}).step_timeout == manager_mod.STEP_TIMEOUT
    assert settings_mod.load({}, None, env={"RECONCILER_STEP_TIMEOUT": "90s"}).step_timeout == 90.0


@pytest.mark.integration  # measures real time between steps
@pytest.mark.parametrize("cadence", [True, False])
def test_batches_are_cut_on_a_fixed_cadence(store, tmp_path, monkeypatch, cadence):
    """A step that took 0.3 s of a 0.5 s taskDuration is stepped again 0.5 s after it
    started (a fixed cadence: records wait for the next cut, not for the cut plus the last
    batch's work); a back-off (a failure's delay) still counts from when the step ended."""
    starts: list[float] = []

    def step(self: SupervisorRuntime) -> StepOutcome:
        if self.supervisor_id != "good":
            return StepOutcome(60.0)
        starts.append(time.monotonic())
        time.sleep(0.3)
        return StepOutcome(0.5, records=1, cadence=cadence)

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = RuntimeManager(ctx, workers=2, refresh=0.01)
    manager.start()
    try:
        _wait(lambda: len(starts) >= 6, 10, "six steps")
    finally:
        manager.stop(wait=True)
    gaps = sorted(b - a for a, b in zip(starts[1:], starts[2:], strict=False))  # the first step starts at once
    median = gaps[len(gaps) // 2]
    if cadence:
        assert 0.45 <= median < 0.7, gaps
    else:
        assert median >= 0.78, gaps


def test_a_step_in_flight_rings_once_when_it_ends_if_the_loop_waits_for_idle(store, tmp_path, monkeypatch):
    """``--until-caught-up`` ends when the targets are reached and no step is in flight. A
    step that reads nothing (the next cut, due at once after a batch longer than
    ``taskDuration``; a warm run's first step) rings nothing by itself: once the loop asked
    ``idle_or_notify`` while it ran, its end rings the bell once; later idle steps do not."""
    release = threading.Event()
    started = threading.Event()
    steps: list[int] = []
    rings: list[float] = []

    def step(self: SupervisorRuntime) -> StepOutcome:
        if self.supervisor_id != "good":
            return StepOutcome(60.0)
        steps.append(0)
        started.set()
        if len(steps) == 1:
            release.wait(10)
        return StepOutcome(0.01, cadence=True)

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = RuntimeManager(ctx, workers=2, refresh=0.01, on_progress=lambda: rings.append(time.monotonic()))
    manager.start()
    try:
        assert started.wait(10)
        assert manager.idle_or_notify() is False  # the first step is in flight
        assert manager.idle_or_notify() is False  # asked twice: still one ring
        released = time.monotonic()
        release.set()
        _wait(lambda: rings, 10, "the ring when the step ended")
        _wait(lambda: len(steps) >= 8, 10, "more idle steps")
    finally:
        manager.stop(wait=True)
    assert len(rings) == 1 and rings[0] >= released, rings


def test_the_last_step_to_end_rings_while_another_supervisor_settles(tmp_path, monkeypatch):
    """From the review: ``busy`` publishes a batch (a ring) and then reads nothing, while
    ``quiet``, already caught up, has a slow idle step in flight at every ring. The loop, as
    ``CatchUp`` does, asks ``idle_or_notify`` at each ring: the step that ends last must ring,
    or the loop learns "nothing in flight" only at its next check."""
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    for sid in ("busy", "quiet"):
        s.create_supervisor(_spec(sid), None, actor="test")
    answers = {"busy": [(0.02, 1000), (0.0, 0)], "quiet": [(1.0, 0)]}
    ended: Counter[str] = Counter()
    seen: list[bool] = []
    holder: dict[str, RuntimeManager] = {}

    def step(self: SupervisorRuntime) -> StepOutcome:
        queue = answers[self.supervisor_id]
        if not queue:
            return StepOutcome(60.0)
        seconds, records = queue.pop(0)
        time.sleep(seconds)
        ended[self.supervisor_id] += 1
        return StepOutcome(0.0 if queue else 60.0, records=records, cadence=True)

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    ctx = RuntimeContext(store=s, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = holder["m"] = RuntimeManager(ctx, workers=2, refresh=0.01,
                                           on_progress=lambda: seen.append(holder["m"].idle_or_notify()))
    manager.start()
    try:
        _wait(lambda: ended["busy"] == 2 and ended["quiet"] == 1 and manager.idle(), 20, "every step")
        time.sleep(0.3)  # any ring still to come
    finally:
        manager.stop(wait=True)
        s.close()
    assert seen and seen[0] is False and seen[-1] is True, f"what each ring found (idle?): {seen}"


def test_the_loop_sleeps_until_the_next_cut_not_a_fixed_poll(store, tmp_path):
    """At taskDuration 0.25s a fixed 50 ms poll cut a batch up to 50 ms late (issue 45's
    freshness); a due already waiting for a worker must not make the loop spin."""
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = RuntimeManager(ctx, workers=1)
    manager.runtimes = {sid: SupervisorRuntime(sid, ctx) for sid in (*STUCK, "good")}
    now = 100.0
    manager.due = {"stuck-a": now + 0.012, "stuck-b": now + 0.030, "good": now + 5.0}
    assert manager._until_due(now) == pytest.approx(0.012)
    manager.running["stuck-a"] = object()  # in flight: its due is not the loop's
    assert manager._until_due(now) == pytest.approx(0.030)
    manager.due["stuck-b"] = now - 1.0  # due, no free worker: the step's end wakes the loop
    assert manager._until_due(now) == pytest.approx(manager_mod.LOOP_WAIT)
    manager.due = {"stuck-b": now + 5.0, "good": now + 9.0}
    assert manager._until_due(now) == pytest.approx(manager_mod.LOOP_WAIT)


def test_a_batch_that_ran_late_is_cut_again_without_waiting_for_the_refresh(store, tmp_path, monkeypatch):
    """A batch longer than its cadence is due again at once; its end pokes the loop, which
    re-reads every supervisor. The next cut starts before that read, not after it (every
    late batch's successor waited for a read of the supervisor table)."""
    active: list[int] = []
    seen_running: list[bool] = []  # at each read after a batch: was the next one already cut

    def step(self: SupervisorRuntime) -> StepOutcome:
        if self.supervisor_id != "good":
            return StepOutcome(60.0)
        active.append(1)
        time.sleep(0.3)
        active.pop()
        return StepOutcome(0.0, records=1, cadence=True)  # ran late: due again now

    monkeypatch.setattr(SupervisorRuntime, "step", step)
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = RuntimeManager(ctx, workers=2, refresh=3600)  # only a batch's poke reads again
    read_actual = store.read_actual

    def read():
        if manager.runtimes:  # the first read creates the runtimes
            deadline = time.monotonic() + 1.0
            while not active and time.monotonic() < deadline:
                time.sleep(0.01)
            seen_running.append(bool(active))
        return read_actual()

    monkeypatch.setattr(store, "read_actual", read)
    manager.start()
    try:
        _wait(lambda: len(seen_running) >= 3, 20, "three reads after batches")
    finally:
        manager.stop(wait=True)
    assert all(seen_running[:3]), seen_running


@pytest.mark.parametrize("opened", [True, False])
def test_a_new_terms_steps_wait_for_its_first_pass_within_a_bound(store, tmp_path, monkeypatch, opened):
    """A leader's first reconcile pass applies the markers left while none led: its runtimes
    step only after that pass (``open``), or after ``held_for`` if the pass never comes."""
    stepped: list[float] = []
    monkeypatch.setattr(SupervisorRuntime, "step", lambda self: stepped.append(time.monotonic())
                        or StepOutcome(0.05))
    ctx = RuntimeContext(store=store, segments_dir=tmp_path / "segments", spark=lambda: None)
    manager = RuntimeManager(ctx, refresh=0.05, held_for=0.6 if not opened else 30.0)
    started = time.monotonic()
    manager.start()
    try:
        time.sleep(0.3)
        assert stepped == [] and manager.held(), "a step ran before the term's first pass"
        if opened:
            opened_at = time.monotonic()
            manager.open()
            _wait(lambda: stepped, 5, "a step after the first pass")
            assert stepped[0] - opened_at < 0.5  # poked: no wait for the bound
        else:
            _wait(lambda: stepped, 5, "a step once the bound ran out")
            assert stepped[0] - started >= 0.6
        assert not manager.held()
    finally:
        manager.stop(wait=True)
