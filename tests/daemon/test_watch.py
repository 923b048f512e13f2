"""The watched spec directory: debounced events + a safety-net tick, one consistent pass.

The daemon runs in this process, in a thread (``Daemon.run``; signals are not
installed off the main thread). Supervisors are suspended where ingestion does not
matter, so these tests need no Spark. Passes are counted with the daemon's
``reconciler_reconcile_passes_total{outcome="changed"}`` counter (a pass that applied
at least one action) and cross-checked against the audit log.

* a real ``git checkout`` that changes 50 spec files (40 updated, 5 removed, 5 added)
  gives exactly ONE pass that applied changes, and the database shows the final state;
* a slow rewrite while ``.git/index.lock`` exists (gaps longer than the debounce) is
  still one pass: neither the debounce nor the periodic tick acts on half of it;
* an editor's save that briefly removes the file (rename to backup, write anew) is an
  update, never a termination;
* a pass whose files change while they are read is dropped, not applied;
* a marker dropped in the directory is applied within a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

import devservices
from reconciler.control.apply import Applier
from reconciler.control.reconcile import reconcile_once
from reconciler.daemon import Daemon
from reconciler.store.store import Store
from tests.daemon.test_notify import wait_until
from tests.e2e import helpers

NOWHERE = helpers.kafka_source("127.0.0.1:9", "unused")  # suspended supervisors never connect


def suspended(sid: str, **extra) -> dict:
    return helpers.spec_doc(sid, NOWHERE, suspended=True, **extra)


@contextlib.contextmanager
def daemon_thread(settings):
    """``Daemon(settings).run()`` in a thread; stopped (like a first SIGTERM) on exit."""
    daemon = Daemon(settings)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", daemon.run()), name="daemon", daemon=True)
    thread.start()
    try:
        wait_until(lambda: daemon.metrics.last_loop > 0 or not thread.is_alive(), 30, "the daemon's loop")
        assert thread.is_alive(), "the daemon did not start"
        yield daemon
    finally:
        daemon.request_stop()
        thread.join(60)
    assert not thread.is_alive() and result.get("rc") == 0


def changed(daemon: Daemon) -> int:
    return daemon.metrics.passes_count("changed")


def store_of(settings) -> Store:
    return Store(settings.db_url)


def actual(settings):
    store = store_of(settings)
    try:
        return store.read_actual()
    finally:
        store.close()


def audit_actions(settings, ids) -> list[str]:
    store = store_of(settings)
    try:
        return [e["action"] for sid in ids for e in store.history(sid)]
    finally:
        store.close()


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args], cwd=repo,
                   check=True, capture_output=True)


def wait_quiet(daemon: Daemon, seconds: float) -> None:
    """Let the daemon run ``seconds`` more (several ticks) so any extra pass would show."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


# --------------------------------------------------------------------------- git checkout


@pytest.mark.integration  # git processes and real debounce time
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_checkout_of_50_changes_is_one_pass_with_the_final_state(tmp_path):
    s = helpers.make_settings(tmp_path, tick_interval=0.2, debounce=0.3)
    repo = Path(s.specs)
    git(repo, "init", "-q", "-b", "main")
    for i in range(50):
        helpers.write_spec(repo, suspended(f"s{i:02d}"))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fifty supervisors")
    git(repo, "checkout", "-q", "-b", "next")
    for i in range(40):
        helpers.write_spec(repo, suspended(f"s{i:02d}", task_count=2, task_duration="2s"))
    for i in range(40, 45):
        (repo / f"s{i:02d}.yaml").unlink()
    for i in range(5):
        helpers.write_spec(repo, suspended(f"n{i:02d}"))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "50 changes")
    git(repo, "checkout", "-q", "main")

    with daemon_thread(s) as daemon:
        wait_until(lambda: len(actual(s).supervisors) == 50, 30, "the first 50 supervisors")
        wait_quiet(daemon, 1.0)
        assert changed(daemon) == 1  # all 50 created in one pass

        git(repo, "checkout", "-q", "next")

        def final_state():
            a = actual(s)
            updated = all(a.supervisors[f"s{i:02d}"].spec_document["taskCount"] == 2 for i in range(40))
            removed = all(a.supervisors[f"s{i:02d}"].state == "TERMINATED" for i in range(40, 45))
            added = all(f"n{i:02d}" in a.supervisors for i in range(5))
            return updated and removed and added

        wait_until(final_state, 30, "the final state of the checkout")
        wait_quiet(daemon, 2.0)  # ten more ticks: any further pass with changes would show
        assert changed(daemon) == 2, "the checkout was applied in more than one pass"
        assert daemon.passes == 2
    actions = audit_actions(s, [f"s{i:02d}" for i in range(50)] + [f"n{i:02d}" for i in range(5)])
    assert actions.count("update") == 40
    assert actions.count("terminated") == 5
    assert actions.count("create") == 55


@pytest.mark.integration  # git processes and real debounce time
def test_slow_rewrite_under_git_index_lock_is_one_pass(tmp_path):
    # gaps (0.4 s) longer than the debounce (0.1 s), and a tick due every 0.1 s: only the
    # index lock holds the passes back until the whole rewrite is on disk.
    s = helpers.make_settings(tmp_path, tick_interval=0.1, debounce=0.1)
    specs = Path(s.specs)
    for i in range(6):
        helpers.write_spec(specs, suspended(f"s{i}"))
    with daemon_thread(s) as daemon:
        wait_until(lambda: len(actual(s).supervisors) == 6, 30, "the first supervisors")
        wait_quiet(daemon, 0.5)
        before = changed(daemon)
        (specs / ".git").mkdir()
        lock = specs / ".git" / "index.lock"
        lock.write_text("")
        for i in range(6):
            helpers.write_spec(specs, suspended(f"s{i}", task_count=3))
            time.sleep(0.4)
        wait_quiet(daemon, 0.5)
        assert changed(daemon) == before, "a pass ran while the git operation held its index lock"
        assert all(r.spec_document["taskCount"] == 1 for r in actual(s).supervisors.values())
        lock.unlink()
        wait_until(lambda: all(r.spec_document["taskCount"] == 3 for r in actual(s).supervisors.values()),
                   10, "the rewrite to be applied")
        wait_quiet(daemon, 1.0)
        assert changed(daemon) == before + 1


def test_editor_atomic_save_is_an_update_never_a_removal(tmp_path):
    s = helpers.make_settings(tmp_path, tick_interval=0.05, debounce=0.6)
    specs = Path(s.specs)
    path = helpers.write_spec(specs, suspended("clicks"))
    with daemon_thread(s) as daemon:
        wait_until(lambda: "clicks" in actual(s).supervisors, 30, "the supervisor")
        wait_quiet(daemon, 0.5)
        before = changed(daemon)
        # vim's backupcopy=no: the file is renamed away, a swap file comes and goes, the new
        # content is written under the old name, the backup is removed. For a moment the
        # spec does not exist at all.
        backup = specs / "clicks.yaml~"
        os.rename(path, backup)
        (specs / ".clicks.yaml.swp").write_text("swap")
        time.sleep(0.1)
        with open(path, "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(suspended("clicks", task_count=4))[:40])
            f.flush()
            time.sleep(0.05)  # half a file on disk, for a moment
            f.write(yaml.safe_dump(suspended("clicks", task_count=4))[40:])
        backup.unlink()
        (specs / ".clicks.yaml.swp").unlink()
        wait_until(lambda: actual(s).supervisors["clicks"].spec_document["taskCount"] == 4, 10, "the update")
        wait_quiet(daemon, 1.0)
        assert changed(daemon) == before + 1
        assert actual(s).supervisors["clicks"].state == "SUSPENDED"
    actions = audit_actions(s, ["clicks"])
    assert "terminated" not in actions and "mark-invalid" not in actions
    assert actions.count("update") == 1


def test_a_pass_whose_files_change_while_read_is_dropped(tmp_path):
    s = helpers.make_settings(tmp_path)
    helpers.write_spec(s.specs, suspended("clicks"))
    store = store_of(s)
    store.migrate()
    try:
        assert reconcile_once(s.specs, Applier(store), stable=lambda: False) is None
        assert store.read_actual().supervisors == {}
        result = reconcile_once(s.specs, Applier(store), stable=lambda: True)
        assert [a.kind for a in result.plan.actions] == ["create"]
        assert "clicks" in store.read_actual().supervisors
    finally:
        store.close()


# --------------------------------------------------------------------------- markers


def test_marker_is_applied_within_a_second(kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(200))
    # tickInterval 30s: only the file event can make the marker's pass happen this fast
    s = helpers.make_settings(tmp_path, tick_interval=30.0, debounce=0.1)
    specs = Path(s.specs)
    helpers.write_spec(specs, helpers.spec_doc("clicks", helpers.kafka_source(kafka_broker.bootstrap, name),
                                               suspended=True))
    latencies = []
    with daemon_thread(s) as daemon:
        wait_until(lambda: "clicks" in actual(s).supervisors, 30, "the supervisor")
        for i in range(3):
            devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(50, start=200 + 50 * i))
            marker = specs / "clicks.reset.yaml"
            applied_before = len(list(specs.glob("clicks.reset.yaml*.applied")))
            t0 = time.monotonic()
            marker.write_text(f"resetTo: latest\nbackfill: false\nreason: latency probe {i}\n")

            def done(marker=marker, applied_before=applied_before, i=i):
                renamed = not marker.exists() and len(list(specs.glob("clicks.reset.yaml*.applied"))) > applied_before
                return renamed and audit_actions(s, ["clicks"]).count("reset") == i + 1

            wait_until(done, 10, f"marker {i} to be applied", every=0.005)
            latencies.append(time.monotonic() - t0)
        resets = daemon.metrics.registry.get_sample_value(
            "reconciler_resets_total", {"supervisor": "clicks", "trigger": "marker"})
    print(f"marker-to-reset latencies: {[round(x, 3) for x in latencies]}")
    assert resets == 3
    assert max(latencies) < 1.0, latencies
    assert sum(actual(s).checkpoints["clicks"].values()) == 350  # the last reset moved to latest
