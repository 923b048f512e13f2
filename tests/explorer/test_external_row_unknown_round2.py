"""Second adversarial round on ``Store._commit_external`` (external catalog, Glue on moto):
a maintenance write whose row stays ``committing`` AFTER its catalog commit landed, met by
an orphan clean-up in flight.

``_stale_manifest_lists`` (orphans.py) deletes the manifest lists of ``committing`` writes
whose parent is not ``main``. It reads ``main`` AFTER the clean-up's first read of the
references (``_referenced_now``), and the references are read again only when ``doomed``
(the finished writes) is not empty, never for ``doomed_lists``. A catalog commit that lands
between the two reads makes its own manifest list the current snapshot's: unreferenced in
the first read, "parent != main" in the second, deleted. The row stays ``committing`` after
the commit when ``_forget_committed`` gives up (4 dropped COMMITs: it logs and reports the
write committed, mend (d)) or the process dies at that COMMIT.

* ``forget-gives-up``: a compaction; its catalog commit lands while a clean-up is parked
  between its reads; the 4 tries of ``_forget_committed`` are dropped before COMMIT.
* ``forget-killed``: a reset's fence, killed at ``_forget_committed``'s COMMIT.

Either way the current snapshot's manifest list is deleted: the table cannot be read, and
every later commit on ``main`` (a batch's append, the reset's fence run again) fails reading
its parent's manifests.

* ``fence-limbo-commit`` / ``fence-drop-after`` (controls): the rowless fence's transaction
  (1) committed after all: ``committing_or_fenced`` must find ``committing`` and the fence's
  catalog commit must go on.
* ``fence-unknown-then-resolve-dropped``: (1) dropped before COMMIT, then the first try of
  ``committing_or_fenced`` dropped after COMMIT (its ``discarded`` row landed): the retry must
  read ``discarded`` and the catalog's commit must not go on.

Both breaks failed before the fix: the clean-up now reads the references again whenever it
judged a manifest list stale, after it read ``main`` for that judgement.

Run: ``.venv/bin/python -m pytest tests/explorer/test_external_row_unknown_round2.py -m integration``.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest

from tests.explorer.__main__ import scratch
from tests.explorer.sched import FaultPlan
from tests.explorer.schedules import END, Runner, Schedule, _ingest, _op, _seq
from tests.explorer.world import DATASOURCE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def glue_props(s3_server) -> dict:
    from devservices import glue

    glue.patch_update_table()
    return glue.GlueServer(port=s3_server.port).catalog_properties()


def _glue(name: str, seed: int) -> Schedule:
    s = Schedule(name, seed)
    s.world = dict(catalog="glue")
    return s


def _current_list_present(world, tables, store) -> list[str]:
    table = tables.load(DATASOURCE)
    snap = table.current_snapshot() if table is not None else None
    if snap is None:
        return []
    path = snap.manifest_list
    local = path[len("file://"):] if path.startswith("file://") else path
    if not os.path.exists(local):
        return [f"the current snapshot's manifest list was deleted by orphan clean-up: {path}"]
    return []


def forget_gives_up() -> Schedule:
    s = _glue("rv2-compaction-forget-gives-up", 911)
    s.actors = [("main", "daemon", _ingest(3)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("maint", "cli-maintain", _seq(_op("orphans")))]
    # the clean-up lists and reads the references (the compaction staged, not committed),
    # parks at orphans-judge; the compaction commits; then the clean-up judges
    s.script = [("main", END), ("compact", "compact-commit"), ("maint", "orphans-judge"), ("compact", END),
                ("maint", END)]
    # commits of the compaction: begin_write (0), the committing row (1), _forget_committed (2..5)
    s.plan = FaultPlan(forced={("compact", "commit-before", i): "drop-before" for i in (2, 3, 4, 5)})
    s.expect = _current_list_present
    return s


def forget_killed() -> Schedule:
    s = _glue("rv2-fence-forget-killed", 912)
    s.actors = [("main", "daemon", _ingest(2)), ("reset", "cli-reset", _seq(_op("reset"))),
                ("maint", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", END), ("reset", "external-commit"), ("maint", "orphans-judge"), ("reset", END),
                ("maint", END)]
    # after the fence's catalog commit, the next database COMMIT is _forget_committed's
    s.plan = FaultPlan(armed={("reset", "external-commit"): ("commit-before", "kill")})
    s.expect = _current_list_present
    return s


def fence_resolved(fault: str) -> Schedule:
    s = _glue(f"rv2-fence-{fault}", 913)
    s.actors = [("main", "daemon", _ingest(2)), ("reset", "cli-reset", _seq(_op("reset")))]
    s.script = [("main", END), ("reset", END)]
    if fault == "drop-after":
        s.plan = FaultPlan(forced={("reset", "commit-after", 0): "drop-after"})
    elif fault == "unknown-then-resolve-dropped":
        s.plan = FaultPlan(forced={("reset", "commit-before", 0): "drop-before",
                                   ("reset", "commit-after", 0): "drop-after"})
    else:
        s.plan = FaultPlan(forced={("reset", "commit-before", 0): fault})
    return s


CASES = {  # (schedule, the fault's trace entry, whether the catalog's commit must follow it)
    "compaction-forget-gives-up": (forget_gives_up, "compact@commit-before!drop-before", None),
    "fence-forget-killed": (forget_killed, "reset@commit-before!kill", None),
    "fence-limbo-commit": (lambda: fence_resolved("limbo-commit"), "reset@commit-before!limbo-commit", True),
    "fence-drop-after": (lambda: fence_resolved("drop-after"), "reset@commit-after!drop-after", True),
    "fence-unknown-then-resolve-dropped": (lambda: fence_resolved("unknown-then-resolve-dropped"),
                                           "reset@commit-after!drop-after", False),
}


def _run(runner: Runner, case: str) -> list[str]:
    make, entry, follows = CASES[case]
    result = runner.run(make())
    trace = result.trace
    out = []
    if entry not in trace:
        out.append(f"the fault did not strike ({entry}): the schedule needs updating ({trace})")
    elif follows is not None:
        after = trace[trace.index(entry):]
        went_on = "reset@external-commit" in after
        if went_on != follows:
            out.append(f"after {entry} the fence's catalog commit {'went on' if went_on else 'did not go on'}")
    return out + result.problems


@pytest.mark.parametrize("case", sorted(CASES))
def test_on_sqlite(case, glue_props):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        runner = Runner(f"sqlite:///{tmp}/w/reconciler.db", Path(tmp) / "w", "sqlite", glue=glue_props)
        try:
            problems = _run(runner, case)
        finally:
            runner.close()
    assert not problems, problems


@pytest.mark.postgres
@pytest.mark.parametrize("case", sorted(CASES))
def test_on_postgresql(case, glue_props, pg_cluster):
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        url = pg_cluster.create_database(f"rowunknown2_{case.replace('-', '_')}_{random.randrange(1 << 30)}")
        runner = Runner(url, Path(tmp) / "w", "postgres", glue=glue_props)
        try:
            problems = _run(runner, case)
        finally:
            runner.close()
    assert not problems, problems
