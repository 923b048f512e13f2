"""The schedule explorer in the suite (README: "The schedule explorer"; RELIABILITY.md).

* every named schedule (each defect of issue 28, replayed) on SQLite and on the real
  PostgreSQL;
* random schedules: ``RECONCILER_EXPLORER_SCHEDULES`` in all (default 200: a count, not a
  time, that ends in about a minute on a loaded 2-core machine, far under the 600 s
  timeout), 70 % on SQLite and 30 % on PostgreSQL (140 + 60: a PostgreSQL schedule costs
  about twice a SQLite one, its server sharing the cores), each database's share split
  between the SQL catalog and the external one (``external.py``: moto's Glue, one server for
  the session; ``CATALOG_SHARE``), from a first seed that changes
  every run (``RECONCILER_EXPLORER_SEED`` to fix it), on two worker processes; the big
  counts are behind flags: ``RECONCILER_EXPLORER_SCHEDULES=20000``, or ``--soak`` (100,000
  in all, 70,000 + 30,000).

Each part prints its seeds before it starts (a part killed by the timeout can be
replayed), then its count, elapsed seconds, the faults it injected and its coverage (how
many schedules compacted, expired, tagged, cancelled a backfill batch in flight, committed
a batch after a fault, reset; ``-s`` not needed), records them as a property of the test
(``--junitxml``) and in the terminal summary ("schedule explorer", ``conftest.py``). A
part of 100 schedules or more fails when a coverage counter is under its floor
(``__main__.FLOORS``). A failing schedule is reported with the one-line command that
replays it.
"""

from __future__ import annotations

import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path

import pytest

from tests.explorer.__main__ import below_floor, coverage, explore, scratch
from tests.explorer.schedules import NAMED, Runner, many_batch_directories

SCHEDULES = int(os.environ.get("RECONCILER_EXPLORER_SCHEDULES", "200"))
SOAK_SCHEDULES = 100_000
SHARE = {"sqlite": 0.7, "postgres": 0.3}  # of the random schedules, per database
# Of each database's share, the external catalog's (Glue on moto). Its schedules cost about
# seven SQL ones (median 4.9 s against 0.7 s on a loaded 2-core machine: the catalog's round
# trips), so a tenth of the count keeps the run's time near what it was (SQLite: 126 + 14,
# PostgreSQL: 54 + 6); its floors are judged on bigger counts (``--catalog glue``, 100 and up).
CATALOG_SHARE = {"sql": 0.9, "glue": 0.1}


def split(total: int) -> dict[str, int]:
    """How many random schedules each database runs: ``total`` in all, SQLite the rest."""
    postgres = round(total * SHARE["postgres"])
    return {"sqlite": total - postgres, "postgres": postgres}


def split_catalogs(count: int) -> dict[str, int]:
    """A database's ``count`` split between the catalogs: the SQL one the rest."""
    glue = round(count * CATALOG_SHARE["glue"])
    return {"sql": count - glue, "glue": glue}


@pytest.fixture(scope="session")
def explorer_glue(s3_server) -> dict:
    """moto's Glue on the session's moto server (its ``UpdateTable`` refusing a stale
    ``VersionId``, devservices/glue.py): the catalog properties the workers reach it with."""
    from devservices import glue

    glue.patch_update_table()
    return glue.GlueServer(port=s3_server.port).catalog_properties()


def _glue_for(name: str, request) -> dict | None:
    return request.getfixturevalue("explorer_glue") if NAMED[name]().world.get("catalog") else None


def _replays(results: list[dict]) -> str:
    lines = []
    for r in results:
        if not r["ok"]:
            what = f"--named {r['name']}" if r["name"] != "random" else f"--seed {r['seed']}"
            if r["name"] == "random" and r.get("catalog", "sql") != "sql":
                what = f"--catalog {r['catalog']} {what}"
            lines.append(f"{r['name']} seed {r['seed']}: {'; '.join(r['problems'])[:400]}\n"
                         f"  replay: .venv/bin/python -m tests.explorer --db {r['db']} {what} -v")
    return "\n".join(lines)


def _children_cpu() -> float:
    """CPU seconds of this process's ended children (the explorer's workers once their pool
    closed): what a part costs on cores of its own, whatever else the machine runs (the
    PostgreSQL server's share aside)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _server_cpu(cluster) -> float:
    """CPU seconds of the PostgreSQL server (the postmaster and its ended backends), 0 when
    there is none or it cannot be read."""
    if cluster is None:
        return 0.0
    try:
        pid = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def _named(name: str, db: str):
    if name == "many-batch-directories":  # PostgreSQL's limit is 65,535 parameters a query
        return many_batch_directories(70_000 if db == "postgres" else 3_000)
    return NAMED[name]()


def _named_params() -> list:
    """The named schedules; those on the external catalog talk to a moto server (a process of
    its own): integration tests, out of the quick unit run."""
    return [pytest.param(n, marks=pytest.mark.integration) if n.startswith("glue-") else n for n in sorted(NAMED)]


@pytest.mark.parametrize("name", _named_params())
def test_named_schedule_on_sqlite(name, request):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        runner = Runner(f"sqlite:///{tmp}/w/reconciler.db", Path(tmp) / "w", "sqlite", glue=_glue_for(name, request))
        try:
            result = runner.run(_named(name, "sqlite"))
        finally:
            runner.close()
    assert result.ok, _replays([{"ok": False, "name": name, "seed": result.seed, "db": "sqlite",
                                 "problems": result.problems}])


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_schedule_on_postgresql(name, pg_cluster, request):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        url = pg_cluster.create_database(f"named_{name.replace('-', '_')}_{random.randrange(1 << 30)}")
        runner = Runner(url, Path(tmp) / "w", "postgres", glue=_glue_for(name, request))
        try:
            result = runner.run(_named(name, "postgres"))
        finally:
            runner.close()
    assert result.ok, _replays([{"ok": False, "name": name, "seed": result.seed, "db": "postgres",
                                 "problems": result.problems}])


@pytest.mark.parametrize("catalog", ["sql", pytest.param("glue", marks=pytest.mark.integration)])
@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres,
                                                                          pytest.mark.integration])])
def test_random_schedules(db, catalog, request, capsys, record_property):
    total = SOAK_SCHEDULES if request.config.getoption("--soak") else SCHEDULES
    count = split_catalogs(split(total)[db])[catalog]
    first = int(os.environ.get("RECONCILER_EXPLORER_SEED", random.randrange(1 << 31)))
    if db == "postgres":  # the SQLite part runs the seeds before
        first += split(total)["sqlite"]
    if catalog == "glue":  # and the SQL catalog's part before the external one's
        first += split_catalogs(split(total)[db])["sql"]
    flag = "" if catalog == "sql" else f" --catalog {catalog}"
    with capsys.disabled():
        print(f"\nexplorer: {db}, catalog {catalog}, {count} random schedules, seeds {first}..{first + count - 1}; "
              f"replay one: .venv/bin/python -m tests.explorer --db {db}{flag} --seed <seed> -v; all: "
              f"--seeds {first}:{first + count}", flush=True)
    cluster = request.getfixturevalue("pg_cluster") if db == "postgres" else None
    glue = request.getfixturevalue("explorer_glue") if catalog == "glue" else None
    started, cpu, server = time.monotonic(), _children_cpu(), _server_cpu(cluster)
    with tempfile.TemporaryDirectory(prefix="explorer-", dir=scratch()) as tmp:
        kind = "seed" if catalog == "sql" else "glue-seed"
        results = explore(db, [(kind, first + i) for i in range(count)], 2, Path(tmp),
                          pg_url_for=cluster.create_database if cluster else None, glue=glue)
    seconds, cpu, server = time.monotonic() - started, _children_cpu() - cpu, _server_cpu(cluster) - server
    failed = [r for r in results if not r["ok"]]
    faults: dict[str, int] = {}
    for r in results:
        for f in r["faults"]:
            faults[f.split()[0]] = faults.get(f.split()[0], 0) + 1
    summary = {"db": db, "catalog": catalog, "firstSeed": first, "schedules": len(results), "failed": len(failed),
               "seconds": round(seconds, 1), "workersCpuSeconds": round(cpu, 1),
               **({"serverCpuSeconds": round(server, 1)} if cluster else {}),
               "loadAverage": round(os.getloadavg()[0], 1), "faultSchedules": sum(1 for r in results if r["faults"]),
               "faultsInjected": dict(sorted(faults.items())), "coverage": coverage(results)}
    record_property("explorer", summary)  # the terminal summary's (conftest.py) and --junitxml's
    with capsys.disabled():
        print("\nexplorer: " + json.dumps(summary))
    assert len(results) == count
    assert not failed, _replays(failed)
    low = below_floor(results)
    assert not low, ("the explorer's operations found too little to do (coverage under its floor): "
                     + "; ".join(low) + f"; seeds {first}..{first + count - 1}")
