"""The schedule explorer in the suite (README: "The schedule explorer"; RELIABILITY.md).

* every named schedule (each defect of issue 28, replayed) on SQLite and on the real
  PostgreSQL;
* random schedules: ``RECONCILER_EXPLORER_SCHEDULES`` per database (default 1,000, so
  2,000 a run), from a first seed that changes every run (``RECONCILER_EXPLORER_SEED`` to
  fix it), on two worker processes; ``--soak``: 50,000 per database.

A failing schedule is reported with the one-line command that replays it.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import pytest

from tests.explorer.__main__ import explore, scratch
from tests.explorer.schedules import NAMED, Runner, many_batch_directories

SCHEDULES = int(os.environ.get("RECONCILER_EXPLORER_SCHEDULES", "1000"))
SOAK_SCHEDULES = 50_000


def _replays(results: list[dict]) -> str:
    lines = []
    for r in results:
        if not r["ok"]:
            what = f"--named {r['name']}" if r["name"] != "random" else f"--seed {r['seed']}"
            lines.append(f"{r['name']} seed {r['seed']}: {'; '.join(r['problems'])[:400]}\n"
                         f"  replay: .venv/bin/python -m tests.explorer --db {r['db']} {what} -v")
    return "\n".join(lines)


def _named(name: str, db: str):
    if name == "many-batch-directories":  # PostgreSQL's limit is 65,535 parameters a query
        return many_batch_directories(70_000 if db == "postgres" else 3_000)
    return NAMED[name]()


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_schedule_on_sqlite(name):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        runner = Runner(f"sqlite:///{tmp}/w/reconciler.db", Path(tmp) / "w", "sqlite")
        try:
            result = runner.run(_named(name, "sqlite"))
        finally:
            runner.close()
    assert result.ok, _replays([{"ok": False, "name": name, "seed": result.seed, "db": "sqlite",
                                 "problems": result.problems}])


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_schedule_on_postgresql(name, pg_cluster):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        url = pg_cluster.create_database(f"named_{name.replace('-', '_')}_{random.randrange(1 << 30)}")
        runner = Runner(url, Path(tmp) / "w", "postgres")
        try:
            result = runner.run(_named(name, "postgres"))
        finally:
            runner.close()
    assert result.ok, _replays([{"ok": False, "name": name, "seed": result.seed, "db": "postgres",
                                 "problems": result.problems}])


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres,
                                                                          pytest.mark.integration])])
def test_random_schedules(db, request, capsys):
    count = SOAK_SCHEDULES if request.config.getoption("--soak") else SCHEDULES
    first = int(os.environ.get("RECONCILER_EXPLORER_SEED", random.randrange(1 << 31)))
    cluster = request.getfixturevalue("pg_cluster") if db == "postgres" else None
    with tempfile.TemporaryDirectory(prefix="explorer-", dir=scratch()) as tmp:
        results = explore(db, [("seed", first + i) for i in range(count)], 2, Path(tmp),
                          pg_url_for=cluster.create_database if cluster else None)
    failed = [r for r in results if not r["ok"]]
    faults: dict[str, int] = {}
    for r in results:
        for f in r["faults"]:
            faults[f.split()[0]] = faults.get(f.split()[0], 0) + 1
    with capsys.disabled():
        print("\nexplorer: " + json.dumps({"db": db, "firstSeed": first, "schedules": len(results),
                                           "failed": len(failed), "faultsInjected": dict(sorted(faults.items()))}))
    assert len(results) == count
    assert not failed, _replays(failed)
