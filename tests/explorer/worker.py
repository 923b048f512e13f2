"""One explorer worker process: its own directory and database, schedules one after
another. A module of its own so that spawned pool processes can import it (a function
defined in ``__main__`` cannot be found by a spawned child)."""

from __future__ import annotations

import logging
from pathlib import Path

from tests.explorer import external
from tests.explorer.schedules import NAMED, Runner, random_schedule


def work(args: tuple) -> list[dict]:
    """One worker: its own directory and database, schedules one after another."""
    db_url, workdir, db_name, jobs, *rest = args
    glue = rest[0] if rest else None  # moto's Glue catalog properties: external-catalog schedules
    logging.disable(logging.CRITICAL)
    runner = Runner(db_url, Path(workdir), db_name, glue=glue)
    out = []
    try:
        for kind, value in jobs:
            if kind == "named":
                schedule = NAMED[value]()
            else:
                schedule = external.random_schedule(value) if kind == "glue-seed" else random_schedule(value)
            r = runner.run(schedule)
            out.append({"name": r.name, "seed": r.seed, "db": db_name, "catalog": schedule.world.get("catalog", "sql"),
                        "ok": r.ok, "problems": r.problems, "faults": r.faults, "seconds": r.seconds, "outcomes": r.outcomes, "reached": r.reached,
                        "trace": r.trace if not r.ok else []})
    finally:
        runner.close()
    return out
