"""Adversarial schedules of ``Store._commit_external`` (external catalog, Glue on moto): a
maintenance write's database transaction whose outcome is unknown, at the two places where
the row says ``committing`` while the catalog has not committed.

* ``fence-rowless``: a reset's fence write has no ``writing`` row (``_finish_write`` inserts
  one inside transaction (1)). When (1) is dropped before COMMIT (or rolled back from limbo)
  there is no row at all; ``fence_write`` answers False for an unknown write ("nothing says
  it did not commit"), so ``_fenced_after_unknown`` reads "the row is ours" and the catalog's
  commit goes on with NO row. An orphan clean-up at ``external-commit`` takes the unknown
  write for committed and deletes the manifest list the commit then makes current: the table
  cannot be read. (Before 5acf0a6 the CommitOutcomeUnknown reached the reset: nothing
  committed, the reset was run again.)
* ``compaction-conflict``: the catalog refuses the compaction (a batch came first); the
  handler's transaction (``committing`` -> ``writing``) ends unknown and not committed. The
  CommitOutcomeUnknown reaches ``compact``, whose fence finds ``committing`` -> "committed
  after all": reported committed, the catalog holds none of its files, kept for ever (the
  symptom of seed 1373336393, by the other exit).
* ``expiry-conflict``: the same for an expiry, whose "committed" branch retires (deletes) the
  manifests of the snapshots it expired, which the catalog still holds.

All three failed before the fix (``Store._commit_external`` now decides both places itself:
a write not recorded is recorded as discarded, and the conflict's transaction is tried until
the row is ``writing`` again, never reaching the caller as an unknown outcome).

Run: ``.venv/bin/python -m pytest tests/explorer/test_external_row_unknown.py -m integration``.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest

from tests.explorer.__main__ import scratch
from tests.explorer.sched import FaultPlan
from tests.explorer.schedules import END, Runner, Schedule, _ingest, _op, _seq
from tests.explorer.world import DATASOURCE, MAIN

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


def _struck(trace: list[str], entry: str, after: str | None, never: str | None) -> list[str]:
    """The forced fault struck where meant (``entry`` in the trace, right after ``after``),
    and ``never`` did not follow it."""
    if entry not in trace:
        return [f"the fault did not strike ({entry}): the schedule needs updating"]
    at = trace.index(entry)
    if after is not None and after not in trace[max(0, at - 3):at]:
        return [f"the fault struck, but not right after {after}: the schedule needs updating ({trace[at - 3:at + 1]})"]
    if never is not None and never in trace[at:]:
        return [f"{never} after {entry}: the catalog's commit went on for a write nobody recorded"]
    return []


def fence_rowless(fault: str) -> Schedule:
    s = _glue(f"rv-fence-rowless-{fault}", 901)
    s.actors = [("main", "daemon", _ingest(2)), ("reset", "cli-reset", _seq(_op("reset"))),
                ("maint", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", END), ("reset", "external-commit"), ("maint", END), ("reset", END)]
    # the reset's first database commit is the fence's ``committing`` row (transaction (1))
    s.plan = FaultPlan(forced={("reset", "commit-before", 0): fault})
    return s


def compaction_conflict(fault: str) -> Schedule:
    s = _glue(f"rv-compaction-conflict-{fault}", 902)
    s.actors = [("main", "daemon", _ingest(3)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("more", "daemon", _seq(_op("step", MAIN, 1)))]
    s.script = [("main", END), ("compact", "compact-commit"), ("more", END), ("compact", END)]
    # commits of the compaction: begin_write (0), the committing row (1), the conflict's (2)
    s.plan = FaultPlan(forced={("compact", "commit-before", 2): fault})

    def expect(world, tables, store) -> list[str]:
        table = tables.load(DATASOURCE)
        merged = [t.file.file_path for t in table.scan().plan_files() if "/data/compacted/" in t.file.file_path]
        if "compacted" in world.reached and not merged:
            return ["the compaction reported committed; the catalog refused it and holds no compacted file "
                    "(its row stays 'committing': its files kept for ever)"]
        return []

    s.expect = expect
    return s


def expiry_conflict(fault: str) -> Schedule:
    s = _glue(f"rv-expiry-conflict-{fault}", 903)
    s.world["reader_grace"] = 0.0  # retired files go at once
    s.actors = [("main", "daemon", _ingest(4)), ("expire", "cli-maintain", _seq(_op("expire", 1, None, False))),
                ("more", "daemon", _seq(_op("step", MAIN, 1)))]
    s.script = [("main", END), ("expire", "expire-commit"), ("more", END), ("expire", END)]
    s.plan = FaultPlan(forced={("expire", "commit-before", 2): fault})
    return s


CASES = {  # (schedule, the fault's trace entry, the point just before it, a point that must not follow)
    "fence-rowless-drop-before": (lambda: fence_rowless("drop-before"), "reset@commit-before!drop-before",
                                  None, "reset@external-commit"),
    "fence-rowless-limbo-abort": (lambda: fence_rowless("limbo-abort"), "reset@commit-before!limbo-abort",
                                  None, "reset@external-commit"),
    "compaction-conflict-drop-before": (lambda: compaction_conflict("drop-before"),
                                        "compact@commit-before!drop-before", "compact@commit-after", None),
    "compaction-conflict-limbo-abort": (lambda: compaction_conflict("limbo-abort"),
                                        "compact@commit-before!limbo-abort", "compact@commit-after", None),
    "expiry-conflict-drop-before": (lambda: expiry_conflict("drop-before"), "expire@commit-before!drop-before",
                                    "expire@commit-after", None),
}


def _run(runner: Runner, case: str) -> list[str]:
    make, entry, after, never = CASES[case]
    result = runner.run(make())
    return _struck(result.trace, entry, after, never) + result.problems


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
        url = pg_cluster.create_database(f"rowunknown_{case.replace('-', '_')}_{random.randrange(1 << 30)}")
        runner = Runner(url, Path(tmp) / "w", "postgres", glue=glue_props)
        try:
            problems = _run(runner, case)
        finally:
            runner.close()
    assert not problems, problems
