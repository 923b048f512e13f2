"""The warehouse on an object store (``table/storage.py``): settings, credentials, and the
table's clean-ups on a bucket with the fencing rules of a local disk. A real S3-protocol
server (moto's server mode, ``s3_server``), real pyiceberg SQL catalog on SQLite."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler import settings as settings_mod
from reconciler.errors import PermanentError
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.runtime.recovery import recover
from reconciler.spec import secrets
from reconciler.store.store import Store
from reconciler.table import orphans as mo
from reconciler.table import storage
from reconciler.table.catalog import Tables
from reconciler.table.writeids import new_write_id

RECONCILER = str(Path(sys.executable).with_name("reconciler"))
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string())])


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("value", ["s3://bucket", "s3://bucket/prefix/", "s3a://b/p", "/var/x", "file:///var/x", ""])
def test_segments_takes_a_directory_or_a_bucket(value):
    s = settings_mod.load({"segments": value}, config="/dev/null", env={})
    assert s.remote_warehouse == value.startswith("s3")
    if s.remote_warehouse:
        assert s.warehouse == value.rstrip("/")
    else:
        assert s.warehouse.startswith("/") and not s.warehouse.startswith("file:")


@pytest.mark.parametrize("value, words", [
    ("http://bucket/x", "http:// is not supported"),
    ("s3://key:secret@bucket/x", "never in the URL"),
    ("s3:///x", "is not s3://bucket/prefix"),
])
def test_a_bad_segments_url_is_refused_naming_the_setting(value, words):
    with pytest.raises(PermanentError) as err:
        settings_mod.load({"segments": value}, config="/dev/null", env={})
    assert "setting segments" in str(err.value) and words in str(err.value)
    assert "secret" not in str(err.value).replace("never", "")


def test_the_command_line_refuses_a_bad_store_in_one_line_exit_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("objectStore: {endpont: http://x}\n")
    done = subprocess.run([RECONCILER, "--config", str(config), "--state-dir",
                           str(tmp_path), "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "objectStore" in done.stderr and "endpont" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([RECONCILER, "--segments", "gs://b/x", "--state-dir",
                           str(tmp_path), "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "setting segments" in done.stderr and "Traceback" not in done.stderr


def test_the_object_store_map_resolves_references_and_hides_its_secrets(tmp_path, grant_secrets, monkeypatch):
    (tmp_path / "s3-secret").write_text("wJalrXUtnFEMI-not-real-secret")
    monkeypatch.setenv("S3_KEY_ID", "AKIA-not-real-id")
    grant_secrets(secrets_dir=tmp_path, env=["S3_KEY_ID"])
    config = tmp_path / "c.yaml"
    config.write_text("segments: s3://b/wh\nobjectStore:\n  endpoint: http://127.0.0.1:9\n"
                      "  accessKeyId: ${env:S3_KEY_ID}\n  secretAccessKey: ${file:s3-secret}\n  pathStyle: true\n")
    s = settings_mod.load({}, config=str(config), env={"RECONCILER_OBJECT_STORE": "region=eu-west-3"})
    assert s.object_store["secretAccessKey"] == "${file:s3-secret}"  # kept as written
    store = storage.ObjectStore.from_settings(s, env={"AWS_ENDPOINT_URL": "http://elsewhere"})
    assert (store.endpoint, store.region, store.path_style) == ("http://127.0.0.1:9", "eu-west-3", True)
    assert store.access_key_id == "AKIA-not-real-id" and store.secret_access_key == "wJalrXUtnFEMI-not-real-secret"
    # what travels to the executors (Spark's options) holds no credential
    public = json.loads(store.to_json())
    assert public == {"endpoint": "http://127.0.0.1:9", "region": "eu-west-3", "pathStyle": True}
    assert "wJalrXUtnFEMI-not-real-secret" not in store.to_json()
    # the scrubber learned it: no log line or refusal shows it
    assert secrets.scrub("key wJalrXUtnFEMI-not-real-secret") == f"key {secrets.REDACTED}"


def test_executors_get_the_daemons_endpoint_never_its_credentials(monkeypatch):
    """A batch's task plan (pickled into the Spark job, shown in its UI) carries the endpoint
    and region; an executor takes credentials from its own environment."""
    import pickle

    from reconciler.model import PartitionRange, SupervisorSpec
    from reconciler.pipeline import sink
    from reconciler.pipeline.batch import task_plan

    spec = SupervisorSpec.from_document({"id": "x", "source": {"type": "kafka", "bootstrapServers": "b:1",
                                                               "topic": "t"}, "dataSchema": {"datasource": "x", "timestamp": {"column": "ts"}}})
    storage.configure(storage.ObjectStore(endpoint="http://127.0.0.1:9", region="r1", access_key_id="daemon-id",
                                          secret_access_key="daemon-secret-value"))
    try:
        plan = task_plan(spec, [PartitionRange("0", 0, 10)], "s3://b/wh/x/data/batch=1", "s3://b/wh/x_dl/data/batch=1")
    finally:
        storage.configure(None)
    assert json.loads(plan.store) == {"endpoint": "http://127.0.0.1:9", "region": "r1"}
    shipped = pickle.dumps(plan)
    assert b"daemon-secret-value" not in shipped and b"daemon-id" not in shipped
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "executor-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "executor-secret")
    sink.task_storage.cache_clear()
    try:
        files = sink.task_storage("s3://b/wh/x", plan.store)
        assert files.remote and files.store.endpoint == "http://127.0.0.1:9"
        assert files.store.access_key_id == "executor-id"
    finally:
        sink.task_storage.cache_clear()


# --------------------------------------------------------------------------- on a bucket


@pytest.fixture
def bucket_env(s3_bucket, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    warehouse = f"s3://{s3_bucket}/wh"
    yield store, Tables(store.engine, warehouse), warehouse
    store.close()


def _put_parquet(location: str) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"__time": pa.array([0], pa.timestamp("us", tz="UTC")), "id": ["k"]}), buf)
    storage.at(location).write_bytes(location, buf.getvalue())


def test_storage_lists_by_prefix_and_deletes_without_renames(s3_bucket):
    files = storage.at(f"s3://{s3_bucket}/x")
    root = f"s3://{s3_bucket}/wh/default/t/data"
    for name in ("batch=a/p1.parquet", "batch=a/c/p2.parquet", "batch=b/p3.parquet"):
        files.write_bytes(f"{root}/{name}", b"x")
    assert sorted(files.list(root)) == [f"{root}/batch=a/c/p2.parquet", f"{root}/batch=a/p1.parquet",
                                        f"{root}/batch=b/p3.parquet"]
    assert sorted(d.rsplit("/", 1)[-1] for d in files.dirs(root)) == ["batch=a", "batch=b"]
    files.delete_dir(f"{root}/batch=a")
    assert list(files.list(root)) == [f"{root}/batch=b/p3.parquet"]
    assert files.read_bytes(f"{root}/batch=b/p3.parquet") == b"x"
    assert files.exists([f"{root}/batch=b/p3.parquet", f"{root}/nope"]) == {f"{root}/batch=b/p3.parquet"}


def test_recovery_on_a_bucket_fences_and_deletes_uncommitted_writes_only(bucket_env, s3_server, s3_bucket):
    store, tables, warehouse = bucket_env
    store.publish(supervisor_id="clicks", epoch=1, batch_id="done", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 5)], files=[], records=5, unparseable=0)
    data = f"{warehouse}/default/clicks/data"
    in_flight = new_write_id()
    store.begin_write(in_flight, "batch", tables=["clicks", "clicks_deadletter"], supervisor_id="clicks")
    for name in ("batch=done/time_chunk=x/p.parquet", "batch=crashed/time_chunk=x/p.parquet",
                 f"batch={in_flight}/time_chunk=x/p.parquet"):
        _put_parquet(f"{data}/{name}")
    _put_parquet(f"{warehouse}/default/clicks_deadletter/data/batch={in_flight}/p.parquet")
    assert recover(store, warehouse) == {"orphansDeleted": 3}
    left = [k for k in s3_server.keys(s3_bucket, "wh/") if not k.endswith("/")]
    assert left == ["wh/default/clicks/data/batch=done/time_chunk=x/p.parquet"]
    assert store.fence_write(in_flight)  # already fenced: it can never commit
    assert recover(store, warehouse) == {"orphansDeleted": 0}


def test_orphans_on_a_bucket_keep_a_write_in_flight_and_delete_it_once_fenced(bucket_env, s3_server, s3_bucket):
    store, tables, warehouse = bucket_env
    table = tables.ensure("clicks", SCHEMA, None)
    committed = new_write_id()
    store.begin_write(committed, "batch", tables=["clicks"], supervisor_id="clicks")
    path = f"{tables.data_dir(table, committed)}/p.parquet"
    _put_parquet(path)
    commit = tables.stage_append("clicks", [path], {"reconciler.batch-id": committed}, write_id=committed)
    store.commit_tables(committed, "batch", [commit])
    tables.committed([commit])

    writing = new_write_id()
    store.begin_write(writing, "batch", tables=["clicks"], supervisor_id="clicks")
    pending = f"{tables.data_dir(table, writing)}/p.parquet"
    _put_parquet(pending)
    result = mo.remove_orphans(tables, "clicks", store=store)
    assert result.kept_in_flight == 1 and result.deleted_files == []
    assert storage.at(pending).exists([pending])

    assert store.fence_write(writing)
    result = mo.remove_orphans(tables, "clicks", store=store)
    assert result.deleted_files == [pending]
    assert not storage.at(pending).exists([pending])
    assert storage.at(path).exists([path])  # referenced: never deleted
    assert tables.load("clicks").scan().to_arrow().column("id").to_pylist() == ["k"]
    # verify finds a referenced object that is gone (one listing of the table's prefix)
    from reconciler.table.verify import missing_files

    assert missing_files(tables.load("clicks")) == []
    storage.at(path).delete([path])
    assert missing_files(tables.load("clicks")) == [path]


def test_a_missing_bucket_is_created_once(s3_server, s3_bucket, tmp_path):
    bucket = f"{s3_bucket}-new"
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    store.migrate()
    try:
        tables = Tables(store.engine, f"s3://{bucket}/wh")
        tables.ensure("clicks", SCHEMA, None)
        assert any(k.endswith(".metadata.json") for k in s3_server.keys(bucket, "wh/default/clicks/"))
        Tables(store.engine, f"s3://{bucket}/wh")  # exists now: nothing to do
    finally:
        store.close()


def test_duckdb_reads_a_table_from_the_bucket(bucket_env, s3_server, s3_bucket):
    """The DuckDB example of docs/operations.md on a bucket, run: DuckDB's own Iceberg reader (and its
    S3 access, httpfs) reads the table from its current metadata object alone, every key
    once. The extensions are loaded by path from their PyPI wheels (no download)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    store, tables, warehouse = bucket_env
    table = tables.ensure("clicks", SCHEMA, None)
    paths = []
    for write in range(2):
        write_id = new_write_id()
        store.begin_write(write_id, "batch", tables=["clicks"], supervisor_id="clicks")
        path = f"{tables.data_dir(table, write_id)}/p.parquet"
        buf = io.BytesIO()
        pq.write_table(pa.table({"__time": pa.array([0, 1, 2], pa.timestamp("us", tz="UTC")),
                                 "id": [f"k{write}-{i}" for i in range(3)]}), buf)
        storage.at(path).write_bytes(path, buf.getvalue())
        commit = tables.stage_append("clicks", [path], {"reconciler.batch-id": write_id}, write_id=write_id)
        store.commit_tables(write_id, "batch", [commit])
        tables.committed([commit])
        paths.append(path)
    current = tables.load("clicks").metadata_location
    assert current.startswith(f"s3://{s3_bucket}/wh/default/clicks/metadata/")

    def extension(module, name: str) -> str:
        [found] = Path(module.__file__).parent.glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
        return str(found)

    env = s3_server.env()
    endpoint = env["AWS_ENDPOINT_URL"].removeprefix("http://")
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        for module, name in ((duckdb_extension_httpfs, "httpfs"), (duckdb_extension_avro, "avro"),
                             (duckdb_extension_iceberg, "iceberg")):
            con.execute(f"LOAD '{extension(module, name)}'")
        con.execute(f"CREATE SECRET s3 (TYPE s3, KEY_ID '{env['AWS_ACCESS_KEY_ID']}', "
                    f"SECRET '{env['AWS_SECRET_ACCESS_KEY']}', REGION '{env['AWS_REGION']}', "
                    f"ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false)")
        rows = con.execute("SELECT id, count(*) FROM iceberg_scan(?) GROUP BY id ORDER BY id", [current]).fetchall()
    finally:
        con.close()
    assert rows == [(f"k{w}-{i}", 1) for w in range(2) for i in range(3)]


def test_the_driver_keeps_the_batch_at_the_daemons_endpoint(s3_server, s3_bucket):
    """What the driver does with a batch's files (list, check, delete a killed attempt's) runs
    in the daemon's own process, which reaches the store at its endpoint, not at
    ``executorEndpoint`` (an address that may resolve only where the executors run)."""
    import devservices
    from reconciler.pipeline import segments, tasks

    dead = f"http://127.0.0.1:{devservices.free_port()}"
    storage.configure(storage.ObjectStore.from_environment({"executorEndpoint": dead}))
    try:
        path = f"s3://{s3_bucket}/wh/default/t/data/batch=b1"
        files = storage.at(path)
        files.write_bytes(f"{path}/time_chunk=20260101T0000Z/part-1.parquet", b"x")
        files.write_bytes(f"{path}/time_chunk=20260101T0000Z/part-2.parquet", b"y")  # a killed attempt's
        described = tasks.FileDescription(tasks.DATA, "time_chunk=20260101T0000Z/part-1.parquet",
                                          "20260101T0000Z", 1, 1)
        written = segments.finish(tasks.TaskResults((described,), 1, 1, {"0": 1}), path,
                                  f"s3://{s3_bucket}/wh/default/t_deadletter/data/batch=b1", "b1")
        assert [f.path for f in written.files] == [f"{path}/time_chunk=20260101T0000Z/part-1.parquet"]
        assert sorted(files.list(path)) == [f"{path}/time_chunk=20260101T0000Z/part-1.parquet"]
    finally:
        storage.configure(None)
