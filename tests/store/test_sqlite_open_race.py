"""Several processes opening one brand-new SQLite database at once all start.

SQLite answers "database is locked" at once, without its busy handler, to a
``PRAGMA journal_mode=WAL`` that races another connection on a new file (found by the
fault suite under load: a daemon and a test's reader starting together). The race is
timing-dependent, so this is a smoke test of the behaviour, not a reliable reproduction.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = "from reconciler.store.store import Store; s = Store({url!r}); s.migrate(); s.read_actual(); print('ok')"


@pytest.mark.integration  # eight Python processes
def test_processes_opening_a_new_database_together_all_start(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT.format(url=url)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err[-500:] for _, err in results]
    assert [out.strip() for out, _ in results] == ["ok"] * 8
