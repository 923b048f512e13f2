"""Dead letters replayed: how long ``reconciler deadletter replay`` takes for N of them.

Prints ONE JSON document on stdout. No broker and no Spark: ``--records`` records whose
``ts`` is ISO text are published under ``format: millis`` (all dead letters) in
``--batches`` batches, exactly as the runtime publishes (``tests/table/replaykit.py``: the
real transform, Parquet writer and publish transaction); the spec is changed to
``format: auto``; then ``table.replay.replay`` runs, timed whole (read, parse, write,
stage, commit). SQLite in a temporary directory by default, ``--db URL`` for PostgreSQL.

Usage: ``.venv/bin/python benchmarks/deadletter_replay.py [--records 100000] [--batches 10]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconciler.store.store import Store  # noqa: E402
from reconciler.table import catalog as cat  # noqa: E402
from reconciler.table.replay import replay  # noqa: E402
from tests.table import replaykit as kit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--db", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db or f"sqlite:///{tmp}/reconciler.db")
        store.migrate()
        kit.create(store, "clicks", "millis")
        tables = cat.Tables(store.engine, f"{tmp}/segments")
        per = args.records // args.batches
        for b in range(args.batches):
            raw = [f'{{"id":"r{o}","ts":"2026-11-20T10:00:{o % 60:02d}Z","user":"u{o % 97}"}}'.encode()
                   for o in range(b * per, (b + 1) * per)]
            kit.publish(store, tables, "clicks", b * per, (b + 1) * per, raw=raw)
        kit.set_format(store, "clicks", "auto")
        started = time.perf_counter()
        result = replay(tables, store, "clicks", actor="benchmark")
        seconds = time.perf_counter() - started
        rows = tables.load("clicks").scan(selected_fields=("__offset",)).to_arrow().num_rows
        store.close()
    print(json.dumps({"deadLetters": per * args.batches, "replayed": result.replayed, "rowsInTable": rows,
                      "committed": result.committed, "attempts": result.attempts,
                      "seconds": round(seconds, 3), "recordsPerSecond": round(result.replayed / seconds)}))


if __name__ == "__main__":
    main()
