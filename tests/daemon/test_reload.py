"""SIGHUP's reload reaches the leader's table maintenance, and says what needs a restart.

The daemon runs in this process (a thread, SQLite, no supervisors: no Spark) with a real
config file; ``request_reload`` is what the SIGHUP handler calls. The compactor's schedule
itself is checked against a clock the test moves.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler import settings as settings_mod
from reconciler.daemon import RESTART_KEYS, Daemon
from reconciler.runtime.compactor import Compactor


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """The host's RECONCILER_* variables would beat the config file the test rewrites."""
    for _name, env, _key, _help in settings_mod.describe():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("RECONCILER_CONFIG", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _config(tmp_path: Path, **values: str) -> str:
    base = {"specs": str(tmp_path / "specs"), "stateDir": str(tmp_path / "state"), "http": "''",
            # a long lease: on a loaded machine a short one may lapse, and a new term builds a new compactor
            "tickInterval": "0.5", "leaseTtl": "30", "compactInterval": "0", "maintainInterval": "0"}
    base.update(values)
    path = tmp_path / "config.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in base.items()))
    return str(path)


def _wait(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_reload_applies_the_maintenance_settings_to_the_running_leader(tmp_path, capsys, caplog):
    (tmp_path / "specs").mkdir()
    config = _config(tmp_path)
    daemon = Daemon(settings_mod.load({}, config), config_path=config)
    thread = threading.Thread(target=daemon.run, kwargs={"timeout": 120}, daemon=True)
    thread.start()
    try:
        _wait(lambda: daemon.manager is not None)
        compactor, token = daemon.manager.compactor, daemon.lease_token
        assert compactor.next_runs() == (math.inf, math.inf)  # both off in the first config

        _config(tmp_path, compactInterval="1s", compactLateness="2h", maintainInterval="1s",
                snapshotRetention="3h", sparkMaster="'local[1]'")
        daemon.request_reload()
        _wait(lambda: compactor.every == 1.0)
        assert daemon.lease_token == token and daemon.manager.compactor is compactor  # reconfigured in its term
        assert (compactor.maintain_every, compactor.lateness, compactor.snapshot_retention) == (
            1.0, timedelta(hours=2), timedelta(hours=3))
        # compaction comes due a second after the leader started, and runs; maintenance's
        # first run waits for the compactor's first minute
        assert compactor.next_runs()[1] == compactor._started + 60.0
        _wait(lambda: compactor._last_compact is not None)
        _wait(lambda: not compactor.running)
        assert compactor.last_error is None, compactor.last_error
        assert daemon.settings.spark_master == "local[*]"  # a restart setting is kept
    finally:
        daemon.request_stop()
        thread.join(60)
    assert not thread.is_alive()
    # before the reload's logs.setup the warning goes to pytest's handler, after it to stderr
    err = capsys.readouterr().err
    assert "SIGHUP: sparkMaster cannot change while running (restart to change them); kept" in caplog.text
    reloaded = next(line for line in err.splitlines() if "SIGHUP: settings reloaded:" in line)
    assert "compactInterval 0.0 -> 1.0; compactLateness 3600.0 -> 7200.0" in reloaded
    assert "maintainInterval 0.0 -> 1.0; snapshotRetention 3600.0 -> 10800.0" in reloaded
    assert reloaded.endswith(f"({RESTART_KEYS} need a restart)")
    assert RESTART_KEYS == "db, segments, objectStore, catalog, stateDir, sparkMaster, spark, snapshotsKept, readerGrace"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_new_interval_counts_from_the_last_run():
    clock = _Clock()
    compactor = Compactor(None, every=3600.0, maintain_every=900.0, first_delay=60.0, clock=clock)
    assert compactor.next_runs() == (1060.0, 1900.0)  # first compaction after first_delay, maintenance after its interval
    compactor._last_compact = 1060.0  # as maybe_run records a run it starts
    compactor.configure(every=600.0, lateness=3600.0, maintain_every=0.0, snapshot_retention=3600.0)
    assert compactor.next_runs() == (1660.0, math.inf)  # shorter: sooner; 0: off
    compactor.configure(every=7200.0, lateness=3600.0, maintain_every=60.0, snapshot_retention=3600.0)
    assert compactor.next_runs() == (8260.0, 1060.0)  # longer: later; maintenance on again, from the start
    compactor.configure(every=0.0, lateness=3600.0, maintain_every=0.0, snapshot_retention=3600.0)
    assert compactor.next_runs() == (math.inf, math.inf)
