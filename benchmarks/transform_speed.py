"""CPU seconds of ``Transformer`` (parse + transform) on 1M small JSON records.

    python benchmarks/transform_speed.py [records] [--rollup] [--floats] [--python]

Records of ~100 bytes: a millis timestamp, three string dimensions, two integer metrics
(``--floats``: and a float one, read as a double), in batches of 65,536 as a reader yields
them; ``--python`` parses every record in Python (the bulk parser's fallback). Prints CPU
seconds per million records.
"""

from __future__ import annotations

import json
import random
import sys
import time

import pyarrow as pa

from reconciler.model import DataSchema, Metric
from reconciler.pipeline.transform import Transformer
from reconciler.streams.base import record_schema

BATCH = 65_536
T0 = 1_763_640_000_000


def batches(total: int, floats: bool = False) -> list[pa.RecordBatch]:
    rnd = random.Random(1)
    out = []
    for start in range(0, total, BATCH):
        n = min(BATCH, total - start)
        values = [
            json.dumps({"ts": T0 + (start + i) * 7, "user": f"u{rnd.randrange(500)}",
                        "page": rnd.choice(["/a", "/b/c", "/home"]), "country": rnd.choice(["fr", "de", "us"]),
                        "bytes": rnd.randrange(10_000), "n": rnd.randrange(10),
                        **({"lat": round(rnd.random() * 100, 3)} if floats else {})}).encode()
            for i in range(n)
        ]
        out.append(pa.RecordBatch.from_arrays(
            [pa.array(["0"] * n), pa.array(range(start, start + n), pa.int64()),
             pa.array([b"k%d" % i for i in range(n)], pa.binary()), pa.array(values, pa.binary()),
             pa.array([T0 + start + i for i in range(n)], pa.timestamp("ms", tz="UTC"))],
            schema=record_schema("ms")))
    return out


def main() -> None:
    total = int(next((a for a in sys.argv[1:] if a.isdigit()), 1_000_000))
    rollup, floats = "--rollup" in sys.argv, "--floats" in sys.argv
    extra = (Metric("lat", "doubleSum", "lat"),) if floats else ()
    ds = DataSchema("d", "ts", timestamp_format="millis", dimensions=("user", "page", "country"),
                    metrics=(Metric("count", "count"), Metric("bytes", "longSum", "bytes"),
                             Metric("n", "longMax", "n"), *extra),
                    rollup=rollup, query_granularity="minute" if rollup else "none")
    data = batches(total, floats)
    size = sum(b.column("value").nbytes for b in data) / total
    t = Transformer(ds, bulk="--python" not in sys.argv)
    rows = 0
    start = time.process_time()
    for b in data:
        rows += t(b).rows.num_rows
    rows += t.finish().rows.num_rows
    spent = time.process_time() - start
    print(f"{total} records (~{size:.0f} B each), {' '.join(sys.argv[1:])}: {spent:.2f} CPU-s, "
          f"{spent / total * 1e6:.2f} CPU-s per 1M records, {rows} rows")


if __name__ == "__main__":
    main()
