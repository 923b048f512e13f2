"""Records the Spark path's output_schemas (reconciler.pipeline.batch, before the pyarrow
transform) over a spread of data schemas as tests/pipeline/output_schemas.json: run once
from the commit before the rewrite, from the worktree root (PYTHONPATH=.)."""
import json, sys
from dataclasses import asdict
from reconciler.model import DataSchema, Metric
from reconciler.pipeline.spark import get_session
from reconciler.pipeline.batch import output_schemas

M = Metric
ALL_METRICS = (M("count", "count"), M("ls", "longSum", "n"), M("lmin", "longMin", "n"), M("lmax", "longMax", "n"),
               M("ds", "doubleSum", "x"), M("dmin", "doubleMin", "x"), M("dmax", "doubleMax", "x"))
VIRT = ("__key", "__partition", "__offset", "__stream_time")
cases = []
def add(**kw):
    kw.setdefault("datasource", "d"); kw.setdefault("timestamp_column", "ts")
    cases.append(DataSchema(**kw))
add()
add(dimensions=("user", "page"))
add(dimensions=("user",), metrics=ALL_METRICS)
add(dimensions=("user",), metrics=ALL_METRICS, rollup=True)
add(dimensions=("user",), metrics=ALL_METRICS, rollup=True, query_granularity="minute")
add(dimensions=("user",), rollup=True)
add(dimensions=("user",), rollup=True, query_granularity="fifteen_minute", segment_granularity="day")
add(dimensions=VIRT)
add(dimensions=VIRT, rollup=True, metrics=(M("c", "count"),))
add(dimensions=("user",) + VIRT, query_granularity="hour", segment_granularity="month")
for q in ("none", "second", "minute", "fifteen_minute", "hour", "day"):
    add(dimensions=("u",), metrics=(M("b", "longSum", "bytes"),), query_granularity=q)
    add(dimensions=("u",), metrics=(M("b", "longSum", "bytes"),), query_granularity=q, rollup=True)
for tsc in VIRT:
    add(timestamp_column=tsc, dimensions=("u",))
    add(timestamp_column=tsc, dimensions=("u",), rollup=True, metrics=(M("c", "count"),))
for v in VIRT:
    for t in ("longSum", "longMin", "longMax", "doubleSum", "doubleMin", "doubleMax"):
        add(dimensions=("u",), metrics=(M("m", t, v),))
        add(dimensions=("u",), metrics=(M("m", t, v),), rollup=True)
# a metric field also a dimension; a field both long and double; metric field = timestamp
add(dimensions=("n",), metrics=(M("s", "longSum", "n"),))
add(dimensions=("u",), metrics=(M("s", "longSum", "n"), M("t", "doubleMax", "n")))
add(dimensions=("u",), metrics=(M("t", "doubleMax", "n"), M("s", "longSum", "n")))
add(dimensions=("u",), metrics=(M("s", "longSum", "ts"),))
add(dimensions=("u",), metrics=(M("s", "longSum", "ts"),), rollup=True)
add(dimensions=("__offset",), metrics=(M("s", "longSum", "__offset"),))
add(metrics=(M("c", "count"), M("s", "doubleSum", "x")), rollup=True, timestamp_format="millis")
add(metrics=(M("s", "longSum", "n"),), timestamp_format="iso")

spark = get_session("local[1]")
out = []
def fields(s):
    assert not s.metadata, s.metadata
    return [[f.name, str(f.type), f.nullable] for f in s]
for ds in cases:
    rows, dead = output_schemas(spark, ds)
    d = asdict(ds); d["metrics"] = [asdict(m) for m in ds.metrics]
    out.append({"data_schema": d, "rows": fields(rows), "dead": fields(dead)})
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(len(out), "cases")
