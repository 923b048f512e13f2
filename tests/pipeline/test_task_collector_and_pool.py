"""The task's collector pause (``heap.collections_paused``) and pool choice
(``arrowpool``), from an adversarial review.

Passing tests add coverage: a task over bad records makes no reference cycles per record
(so pausing the collector cannot grow a worker without bound), a failed or interrupted task
leaves the collector as it found it, and Arrow memory allocated before the pool switch is
freed by its own pool.

Two defects were proven here and are fixed: two pauses in threads of one process could
leave the collector OFF FOR GOOD. ``collections_paused`` reads ``gc.isenabled()`` and
then calls ``gc.disable()``; a thread preempted between the two reads "off" (another
thread's pause) but disables after that pause has ended, so its own exit leaves the
collector off, and every later pause finds it off and leaves it off (now a lock and a count).
And the pool switch did not reach Parquet's column encoders, which still allocated from
mimalloc (now the pool is named in the environment before pyarrow's import).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from reconciler.model import DataSchema, Dimension, PartitionRange
from reconciler.pipeline import heap, tasks
from tests.pipeline.test_protobuf import pb  # noqa: F401 - the fixture
from tests.pipeline.test_transform import T0_MS
from tests.pipeline.test_transform import records as json_records
from tests.pipeline.test_typed_tables import T0, avro_body
from tests.pipeline.test_typed_tables import records as raw_records

AVRO = {"type": "record", "name": "O", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "country", "type": "string"}]}
GOOD_AVRO = avro_body(AVRO, {"id": 1, "ts": T0, "country": "de"})


class MadeReader:
    """Serves ``MAKE(start, end)`` in batches of ``BATCH`` (one partition)."""

    MAKE = None
    BATCH = 1000
    RAISE: BaseException | None = None  # raised after the first batch

    def __init__(self, source=None):
        pass

    def read(self, rng, max_batch_rows=65536):
        for s in range(rng.start, rng.end, self.BATCH):
            yield type(self).MAKE(s, min(rng.end, s + self.BATCH))
            if type(self).RAISE is not None:
                raise type(self).RAISE


def _plan(tmp_path, ds, n, reader=MadeReader, files=None, name="t"):
    return tasks.TaskPlan(source={}, data_schema=ds, groups=((PartitionRange("0", 0, n),),),
                          data_dir=str(tmp_path / name / "d"), dead_dir=str(tmp_path / name / "dl"), store=None,
                          max_batch_rows=65536, reader=reader, format_files=files or {})


def _cycles_left(plan) -> tuple[int, dict[str, int]]:
    """The objects a task left in reference cycles (the collector off before, so the pause
    leaves it off and nothing collects them before they are counted)."""
    gc.collect()
    gc.disable()
    try:
        out = tasks.one_task(plan, plan.groups[0])
        found = gc.collect()
    finally:
        gc.enable()
    return found, {k: sum(r["rows"] for r in out if r["kind"] == k) for k in (tasks.DATA, tasks.DEAD, tasks.READ)}


def _json(**kw):
    return DataSchema("o", "ts", **kw)


CSV = DataSchema("o", "ts", timestamp_format="millis", format="csv", dimensions=("a", "b"),
                 format_options={"columns": ["ts", "a", "b"]})
AVRO_DS = DataSchema("o", "ts", format="avro", dimensions=("country",), format_options={"schemaFile": "o.avsc"})
AVRO_FILES = {"o.avsc": json.dumps(AVRO).encode()}

BAD = {
    "json_invalid": (_json(dimensions=("a",)), lambda s, e: json_records([b'{"a": '] * (e - s)), None),
    "json_deep": (_json(dimensions=("a",)), lambda s, e: json_records(["[" * 2000] * (e - s)), None),
    "json_typed_misfit": (_json(dimensions=("q",), typed=(Dimension("q", "long", ("q",)),)),
                          lambda s, e: json_records([{"ts": T0_MS, "q": f"x{i}"} for i in range(s, e)]), None),
    "json_mixed": (_json(dimensions=("a", "q"), typed=(Dimension("q", "long", ("q",)),)),
                   lambda s, e: json_records([[{"ts": T0_MS, "a": "x", "q": 1}, {"ts": "no", "a": [1]}, b"\xff",
                                               {"ts": T0_MS, "a": {"n": 1}, "q": 2**70}][i % 4] for i in range(s, e)]),
                   None),
    "csv_unclosed_quote": (CSV, lambda s, e: raw_records([f'{T0},"x,y'.encode()] * (e - s)), None),
    "csv_wrong_width": (CSV, lambda s, e: raw_records([f"{T0},x".encode()] * (e - s)), None),
    "avro_truncated": (AVRO_DS, lambda s, e: raw_records([GOOD_AVRO[:3]] * (e - s)), AVRO_FILES),
    "avro_mixed": (AVRO_DS, lambda s, e: raw_records([GOOD_AVRO if i % 3 else GOOD_AVRO[:-2] + b"\xff\xfe"
                                                      for i in range(s, e)]), AVRO_FILES),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_make_no_cycles_for_the_paused_collector_to_miss(tmp_path, case):
    """Measured at 20,000-100,000 records (Kafka and RabbitMQ readers included): 0 cyclic
    objects per record, a constant few hundred per process (first imports) or per read
    (46, RabbitMQ's event loop). What a task frees, reference counting frees."""
    ds, make, files = BAD[case]
    MadeReader.MAKE, MadeReader.RAISE = make, None
    _cycles_left(_plan(tmp_path, ds, 200, files=files, name="warm"))  # first use: imports, caches
    n = 3000
    found, rows = _cycles_left(_plan(tmp_path, ds, n, files=files))
    assert rows[tasks.READ] == n and rows[tasks.DATA] + rows[tasks.DEAD] == n
    assert found < 100, f"{found} objects in cycles after {n} records"


def test_corrupt_protobuf_records_make_no_cycles(tmp_path, pb):  # noqa: F811 - the fixture
    ds = DataSchema("o", "ts", format="protobuf", dimensions=("country",),
                    format_options={"descriptorFile": "o.desc", "message": "acme.Order"})
    files = {"o.desc": pb.DESC.read_bytes()}
    good = pb.Order(id=1, country="DE")
    good.ts.FromMilliseconds(T0)
    body = good.SerializeToString()
    MadeReader.MAKE, MadeReader.RAISE = (lambda s, e: raw_records([body if i % 2 else b"\xff\xff\xff\xff"
                                                                   for i in range(s, e)])), None
    _cycles_left(_plan(tmp_path, ds, 200, files=files, name="warm"))
    found, rows = _cycles_left(_plan(tmp_path, ds, 3000, files=files))
    assert rows[tasks.DEAD] == 1500 and rows[tasks.DATA] == 1500
    assert found < 100


@pytest.mark.parametrize("error", [RuntimeError("the broker went away"), KeyboardInterrupt(), GeneratorExit()])
@pytest.mark.parametrize("before", [True, False])
def test_a_task_that_fails_mid_read_leaves_the_collector_as_it_found_it(tmp_path, error, before):
    MadeReader.MAKE = lambda s, e: json_records([{"ts": T0_MS, "a": "x"}] * (e - s))
    MadeReader.RAISE = error
    (gc.enable if before else gc.disable)()
    try:
        with pytest.raises(type(error)):
            tasks.one_task(_plan(tmp_path, _json(dimensions=("a",)), 5000), (PartitionRange("0", 0, 5000),))
        assert gc.isenabled() is before
        assert not list((tmp_path / "t").rglob("*.parquet"))  # aborted: nothing of the attempt left
    finally:
        MadeReader.RAISE = None
        gc.enable()


def _in_a_new_process(code: str, **env: str) -> list[str]:
    import os
    from pathlib import Path

    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**clean, **env}, cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_arrow_memory_from_before_the_switch_is_freed_by_its_own_pool_and_a_task_still_writes_every_record():
    code = """if 1:
        import sys, tempfile
        sys.path.insert(0, ".")
        import pyarrow as pa, pyarrow.compute as pc
        from pathlib import Path
        from reconciler.model import DataSchema
        from reconciler.pipeline import arrowpool, tasks
        from tests.pipeline.test_task_collector_and_pool import MadeReader, _plan
        from tests.pipeline.test_transform import T0_MS, records
        mi, je = pa.mimalloc_memory_pool(), pa.jemalloc_memory_pool()
        before = pa.array(range(1_000_000))
        assert mi.bytes_allocated() >= 8_000_000
        assert arrowpool.use_preferred() == "jemalloc" == pa.default_memory_pool().backend_name
        after = pc.add(before, 1)  # computed from a mimalloc buffer into a jemalloc one
        assert je.bytes_allocated() >= 8_000_000
        MadeReader.MAKE = lambda s, e: records([{"ts": T0_MS, "a": "x", "id": i} for i in range(s, e)])
        plan = _plan(Path(tempfile.mkdtemp()), DataSchema("o", "ts", dimensions=("a", "id")), 20000)
        out = tasks.one_task(plan, plan.groups[0])
        assert sum(r["rows"] for r in out if r["kind"] == "data") == 20000
        import pyarrow.dataset as ds
        ids = ds.dataset(plan.data_dir, format="parquet").to_table(columns=["id"]).column("id")
        assert len(ids) == len(ids.unique()) == 20000
        del before, after
        assert mi.bytes_allocated() == 0, mi.bytes_allocated()
        print("ok")
    """
    assert _in_a_new_process(code) == ["ok"]


PARQUET_WRITE = """if 1:
    import os, sys, tempfile
    sys.path.insert(0, ".")
    from reconciler.pipeline import arrowpool
    {first}
    import pyarrow as pa, pyarrow.parquet as pq
    {then}
    mi = pa.mimalloc_memory_pool()
    t = pa.table({{"a": pa.array([f"v{{i % 5000}}" for i in range(200_000)]), "b": pa.array(range(200_000))}})
    pq.write_table(t, os.path.join(tempfile.mkdtemp(), "x.parquet"))
    print(arrowpool.use_preferred(), mi.max_memory())
"""


def test_a_process_that_chooses_before_pyarrow_is_imported_writes_parquet_from_jemalloc_too():
    """A task's first call in a fresh worker, or the ``reconciler`` entry point: the pool is
    named in the environment before pyarrow's import, which Arrow C++ (Parquet's encoders
    among it) reads once. (The review found that ``pa.set_memory_pool`` alone leaves them on
    mimalloc: 31 MiB of a 1M-row write.)"""
    pool, from_mimalloc = _in_a_new_process(PARQUET_WRITE.format(first="arrowpool.use_preferred()", then=""))
    assert pool == "jemalloc"
    assert int(from_mimalloc) < 64 * 1024, f"{int(from_mimalloc) >> 10} KiB of a Parquet write came from mimalloc"


def test_after_pyarrow_was_imported_the_switch_is_pyarrows_own_default_only():
    """What ``arrowpool`` says of such a process (a Spark Connect server's workers): the
    Python-level default moves, Parquet's encoders do not."""
    pool, from_mimalloc = _in_a_new_process(PARQUET_WRITE.format(first="", then="arrowpool.use_preferred()"))
    assert pool == "jemalloc"
    assert int(from_mimalloc) > 1024 * 1024


def test_the_environment_variable_moves_parquet_writes_too():
    pool, from_mimalloc = _in_a_new_process(PARQUET_WRITE.format(first="", then=""),
                                            ARROW_DEFAULT_MEMORY_POOL="jemalloc")
    assert pool == "jemalloc" and int(from_mimalloc) < 64 * 1024


def test_the_entry_point_names_jemalloc_before_any_import_and_keeps_the_operators_pool():
    code = """if 1:
        import os, sys
        sys.path.insert(0, ".")
        sys.argv = ["reconciler", "--version"]
        from reconciler.cli import main
        try:
            main()
        except SystemExit:
            pass
        print(os.environ.get("ARROW_DEFAULT_MEMORY_POOL"), "pyarrow" in sys.modules)
    """
    assert _in_a_new_process(code)[-2:] == ["jemalloc", "False"]
    assert _in_a_new_process(code, ARROW_DEFAULT_MEMORY_POOL="system")[-2:] == ["system", "False"]


def test_an_unknown_pool_name_in_the_environment_reports_the_pool_really_in_use():
    """pyarrow warns about ``ARROW_DEFAULT_MEMORY_POOL=foo`` and keeps mimalloc; the switch
    respects the variable, so such a worker runs on mimalloc (and says so)."""
    code = ("from reconciler.pipeline import arrowpool; import pyarrow as pa; "
            "print(arrowpool.use_preferred(), pa.default_memory_pool().backend_name)")
    env = {**__import__("os").environ, "ARROW_DEFAULT_MEMORY_POOL": "foo"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    name, in_use = out.stdout.split()
    assert name == in_use


# --------------------------------------------------------------------------- the defect


def test_a_pause_that_reads_the_state_inside_another_pause_cannot_leave_the_collector_off_for_good(monkeypatch):
    """The schedule (a GIL switch between ``gc.isenabled()`` and ``gc.disable()`` in B):

        A: was = True; gc.disable()            -- A's task runs
        B: was = gc.isenabled() -> False       -- B preempted here
        A: task done; was True -> gc.enable()
        B: gc.disable(); B's task; was False -> leaves it off

    The collector is then off for the process's life: every later pause finds it off and
    leaves it off (``heap.collections_paused``'s own rule). The events below force that
    order; their waits are bounded, so an implementation that serialises the pauses (a lock
    and a count) just waits them out and passes."""
    real = gc
    a_in, b_read, a_out = threading.Event(), threading.Event(), threading.Event()

    def isenabled():
        on = real.isenabled()
        if threading.current_thread().name == "B":
            b_read.set()
        return on

    def disable():
        if threading.current_thread().name == "B":
            a_out.wait(timeout=2)
        real.disable()

    monkeypatch.setattr(heap, "gc", SimpleNamespace(isenabled=isenabled, disable=disable, enable=real.enable))

    def task_a():
        with heap.collections_paused():
            a_in.set()
            b_read.wait(timeout=2)
        a_out.set()

    def task_b():
        a_in.wait(timeout=2)
        with heap.collections_paused():
            pass

    gc.enable()
    try:
        threads = [threading.Thread(target=task_a, name="A"), threading.Thread(target=task_b, name="B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        left_on = gc.isenabled()
        with heap.collections_paused():  # a later task in the same process
            pass
        still_on = gc.isenabled()
    finally:
        gc.enable()
    assert left_on and still_on, "two tasks in threads of one process left the cyclic collector off for good"


def test_pauses_in_threads_leave_the_collector_on_without_any_help():
    """The same with nothing forced: 4 threads x 2,000 pauses, repeated. On the code under
    review 33 of 200 repetitions ended with the collector off (2 cores, switch interval 1 us)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def pauses():
        for _ in range(2000):
            with heap.collections_paused():
                pass

    try:
        for _ in range(150):
            gc.enable()
            threads = [threading.Thread(target=pauses) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert gc.isenabled(), "pauses in threads left the cyclic collector off"
    finally:
        sys.setswitchinterval(interval)
        gc.enable()
