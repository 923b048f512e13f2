"""The daemon's heap settles once, only in a process that is the daemon or a reused Spark worker."""

from __future__ import annotations

import gc

import pytest

from reconciler.pipeline import heap


@pytest.fixture
def fresh(monkeypatch):
    """heap's state as in a new process; what a test froze is thawed after it."""
    monkeypatch.setattr(heap, "_enabled", False)
    monkeypatch.setattr(heap, "_settled", False)
    monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    yield
    gc.unfreeze()


def test_a_process_that_is_not_the_daemon_keeps_its_heap_collectable(fresh):
    assert heap.settle() is False
    assert gc.get_freeze_count() == 0


def test_the_daemon_freezes_its_heap_once(fresh):
    heap.enable()
    assert heap.settle() is True
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # the modules, classes and functions loaded by now
    assert heap.settle() is False  # once: later objects stay collectable
    # nothing more frozen; a frozen object may still die meanwhile (another thread of the test
    # session let go of it: 3 of 915,954 once on CI)
    assert gc.get_freeze_count() <= frozen


def test_garbage_at_the_settle_is_collected_not_frozen(fresh):
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    heap.enable()
    heap.settle()
    assert gone() is None


def test_a_reused_spark_worker_settles_after_its_first_task_and_a_one_task_worker_does_not(fresh, monkeypatch):
    assert heap.settle_worker() is False  # forked for one task: the collection would buy nothing
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    assert heap.settle_worker() is True
    assert heap.settle_worker() is False


def test_reconciler_run_enables_it_for_its_own_process(fresh, monkeypatch, tmp_path):
    """``reconciler run`` is the daemon's process: it turns settling on before the daemon starts,
    unless it only runs until caught up."""
    from click.testing import CliRunner

    import reconciler.daemon
    from reconciler import settings as settings_mod
    from reconciler.cli import cli

    seen = {}

    class Daemon:  # the CLI's wiring only: a real daemon would need a broker
        def __init__(self, *args, **kwargs):
            pass

        def run(self, **kwargs):
            seen["enabled"] = heap._enabled
            return 0

    monkeypatch.setattr(reconciler.daemon, "Daemon", Daemon)
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "no-such-config.yaml")
    env = {env: None for _, env, _, _ in settings_mod.describe()} | {"RECONCILER_CONFIG": None}
    base = ["--specs", str(tmp_path), "--state-dir", str(tmp_path / "state"), "run"]
    result = CliRunner().invoke(cli, [*base, "--until-caught-up"], env=env)
    assert result.exit_code == 0, result.output
    assert seen == {"enabled": False}  # a one-shot run: no later batch to spare the pauses
    result = CliRunner().invoke(cli, base, env=env)
    assert result.exit_code == 0, result.output
    assert seen == {"enabled": True}


def test_collections_are_paused_within_and_back_on_after_even_on_an_error():
    assert gc.isenabled()
    with heap.collections_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), heap.collections_paused():
        raise ValueError("a task failed")
    assert gc.isenabled()


def test_collections_paused_leaves_off_what_was_off():
    gc.disable()
    try:
        with heap.collections_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an embedding application's choice, or another task's pause
    finally:
        gc.enable()


def test_a_cycle_made_while_paused_is_collected_after():
    import weakref

    class Node:
        pass

    with heap.collections_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
    gc.collect()
    assert gone() is None
