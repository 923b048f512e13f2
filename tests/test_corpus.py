"""The bad-input corpus (``tests/corpus/``): every file gives its expected error, and the
daemon, fed all of them at once while it ingests, keeps every valid supervisor running.

``tests/corpus/expected.yaml`` maps each corpus file to the error substring and line the
loader must report (and the id it must recover, so the supervisor is never taken as
removed). Cases that cannot live in git (a 50 MiB file, symlinks leaving the directory,
a FIFO, insecure modes) are generated here into ``tmp_path``. "Offsets out of range" is
only knowable against the broker: that marker loads, and is rejected at apply time with
the valid range, against a real Tansu topic.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import devservices
from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.control.apply import Applier
from reconciler.control.reconcile import reconcile_once
from reconciler.runtime.supervisor import RUNNABLE
from reconciler.spec.loader import DirectoryState, load_directory
from reconciler.store.store import Store

CORPUS = Path(__file__).parent / "corpus"
EXPECTED: dict = yaml.safe_load((CORPUS / "expected.yaml").read_text(encoding="utf-8"))
CASES: dict[str, dict] = {**EXPECTED["files"], **EXPECTED["generated"]}
CANARY = Path("/tmp/reconciler-corpus-pwned")  # what python-tag.yaml would create if run
OUTSIDE_SECRET = b"OUTSIDE-SECRET-5c7e1d: never copied into the spec directory\n"
HUGE = 50 << 20


def spec_text(sid: str, bootstrap: str = "127.0.0.1:9092", topic: str | None = None) -> str:
    return f"""\
id: {sid}
source:
  type: kafka
  bootstrapServers: {bootstrap}
  topic: {topic or sid}
taskDuration: 500ms
maxBatchRecords: 2000
dataSchema:
  datasource: {sid.replace("-", "_")}
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, page, __key, __partition, __offset]
  granularity: {{segment: hour, query: none, rollup: false}}
"""


# --------------------------------------------------------------------------- building


def _huge(specs: Path, outside: Path) -> None:
    line = b"# padding: a spec is a few hundred bytes, this file is 50 MiB\n"
    with open(specs / "huge.yaml", "wb") as fh:
        fh.write(b"id: huge\n")
        chunk = line * ((1 << 20) // len(line))
        while fh.tell() < HUGE:
            fh.write(chunk[: HUGE - fh.tell()])


def _escape(specs: Path, outside: Path) -> None:
    (outside / "escape.yaml").write_text(spec_text("escape"))
    (specs / "escape.yaml").symlink_to(outside / "escape.yaml")


def _escape_marker(specs: Path, outside: Path) -> None:
    (outside / "secret.txt").write_bytes(OUTSIDE_SECRET)
    (specs / "escape.reset.yaml").symlink_to(outside / "secret.txt")


def _dangling(specs: Path, outside: Path) -> None:
    (specs / "dangling.yaml").symlink_to(specs / "nowhere" / "dangling.yaml")


def _fifo(specs: Path, outside: Path) -> None:
    os.mkfifo(specs / "fifo.yaml")


def _world_writable(specs: Path, outside: Path) -> None:
    path = specs / "world-writable.yaml"
    path.write_text(spec_text("world-writable"))
    path.chmod(0o666)


def _group_writable(specs: Path, outside: Path) -> None:
    path = specs / "group-writable.yaml"
    path.write_text(spec_text("group-writable"))
    path.chmod(0o664)
    foreign = next(g for g in range(4242, 5000) if g != os.getegid())
    try:
        os.chown(path, -1, foreign)
    except PermissionError:
        pytest.skip("giving a file to another group needs root (tests run as root in CI)")


def _writable_marker(specs: Path, outside: Path) -> None:
    path = specs / "writable.reset.yaml"
    path.write_text("resetTo: latest\n")
    path.chmod(0o666)


def _directory_marker(specs: Path, outside: Path) -> None:
    (specs / "directory.reset.yaml").mkdir()


GENERATORS: dict[str, Callable[[Path, Path], None]] = {
    "huge.yaml": _huge,
    "escape.yaml": _escape,
    "escape.reset.yaml": _escape_marker,
    "dangling.yaml": _dangling,
    "fifo.yaml": _fifo,
    "world-writable.yaml": _world_writable,
    "group-writable.yaml": _group_writable,
    "writable.reset.yaml": _writable_marker,
    "directory.reset.yaml": _directory_marker,
}


def add_corpus(specs: Path, outside: Path, names=None) -> None:
    """Copy the corpus files (or ``names`` of them) into ``specs`` and generate the rest."""
    outside.mkdir(exist_ok=True)
    for name in names if names is not None else CASES:
        if name in GENERATORS:
            GENERATORS[name](specs, outside)
        else:
            shutil.copyfile(CORPUS / name, specs / name)


def partners(name: str) -> list[str]:
    """The files a case needs beside it (a duplicate id needs its twin)."""
    if name.startswith("duplicate-id-"):
        return ["duplicate-id-a.yaml", "duplicate-id-b.yaml"]
    return [name]


def problems_of(state: DirectoryState, path: str) -> list:
    err = state.invalid.get(path) or state.rejected_markers.get(path)
    return list(err.problems) if err else []


def check_case(state: DirectoryState, specs: Path, name: str) -> None:
    case = CASES[name]
    path = str(specs / name)
    if case["stage"] == "apply":
        assert path in {m.path for m in state.markers}, f"{name} should load; fails only at apply"
        return
    found = problems_of(state, path)
    assert found, f"{name}: no problem reported"
    hits = [p for p in found if case["error"] in str(p)]
    assert hits, f"{name}: expected {case['error']!r}, got {[str(p) for p in found]}"
    assert hits[0].line == case["line"], f"{name}: line {hits[0].line}, expected {case['line']}"
    assert hits[0].path == path
    if case["kind"] == "spec":
        assert path in state.invalid and path not in state.specs
        assert case["recovered"] in state.invalid_ids, f"{name}: id {case['recovered']} not recovered"
    else:
        assert path in state.rejected_markers


# --------------------------------------------------------------------------- the loader


def test_expected_yaml_lists_every_corpus_file():
    on_disk = {p.name for p in CORPUS.iterdir()} - {"expected.yaml"}
    assert on_disk == set(EXPECTED["files"])
    assert set(EXPECTED["generated"]) == set(GENERATORS)
    for name, case in CASES.items():
        assert set(case) == {"kind", "stage", "line", "recovered", "error"}, name
        assert case["kind"] in ("spec", "marker") and case["stage"] in ("load", "apply"), name


@pytest.fixture(scope="module")
def whole_corpus(tmp_path_factory) -> tuple[Path, DirectoryState, float]:
    """Every case in one directory with one valid spec, ``target``, loaded once."""
    base = tmp_path_factory.mktemp("corpus")
    specs = base / "specs"
    specs.mkdir()
    (specs / "target.yaml").write_text(spec_text("target"))
    add_corpus(specs, base / "outside")
    CANARY.unlink(missing_ok=True)
    started = time.monotonic()
    state = load_directory(str(specs))
    return specs, state, time.monotonic() - started


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_in_the_whole_corpus(whole_corpus, name):
    specs, state, _ = whole_corpus
    check_case(state, specs, name)


def test_the_whole_corpus_keeps_the_valid_spec_and_runs_nothing(whole_corpus):
    specs, state, seconds = whole_corpus
    assert state.ok
    assert set(state.by_id()) == {"target"}
    assert [m.path for m in state.markers] == [str(specs / "target.reset.yaml")]
    assert not CANARY.exists(), "a YAML tag ran a command"
    assert seconds < 20, f"loading the corpus took {seconds:.1f}s (size limits and bomb guards)"
    invalid = {os.path.basename(p) for p in state.invalid}
    rejected = {os.path.basename(p) for p in state.rejected_markers}
    assert invalid == {n for n, c in CASES.items() if c["kind"] == "spec"}
    assert rejected == {n for n, c in CASES.items() if c["kind"] == "marker" and c["stage"] == "load"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_alone(tmp_path, name):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "target.yaml").write_text(spec_text("target"))
    add_corpus(specs, tmp_path / "outside", partners(name))
    state = load_directory(str(specs))
    assert state.ok
    check_case(state, specs, name)
    assert set(state.by_id()) == {"target"}


def test_validate_command_reports_every_file(tmp_path, monkeypatch):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "target.yaml").write_text(spec_text("target"))
    add_corpus(specs, tmp_path / "outside")
    monkeypatch.chdir(tmp_path)
    env = {env: None for _, env, _, _ in settings_mod.describe()}
    env |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None}
    result = CliRunner().invoke(cli, ["validate", "specs"], env=env)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()  # the report (issue 46)
    for name, case in CASES.items():
        if case["stage"] == "apply":
            continue
        where = f"specs/{name}:{case['line']}:" if case["line"] else f"specs/{name}:"
        assert any(line.startswith(where) and case["error"] in line for line in lines), (
            f"{name} not reported as {where} ... {case['error']}"
        )
    assert lines[-1].endswith("1 valid spec(s), 1 valid marker(s)")


def test_a_pass_over_the_whole_corpus_carries_on(tmp_path):
    """Every bad file at once (the deep nesting and the directory marker included) is one
    pass that reports them and creates the valid supervisor; the broker-only case is left out."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "target.yaml").write_text(spec_text("target"))
    add_corpus(specs, tmp_path / "outside", [n for n in CASES if CASES[n]["stage"] == "load"])
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        result = reconcile_once(str(specs), Applier(store, actor="test"))
        kinds = {(r.action.kind, os.path.basename(r.action.path or "")) for r in result.results}
        assert ("create", "target.yaml") in kinds
        assert ("reject-marker", "directory.reset.yaml") in kinds
        assert ("reject-marker", "deep.reset.yaml") in kinds
        assert set(store.read_actual().mains()) == {"target"}
        assert not (specs / "directory.reset.yaml").exists(), "the directory marker is retired"
        assert (specs / "directory.reset.yaml.rejected").is_dir()
    finally:
        store.close()


# --------------------------------------------------------------------------- against Tansu


def test_out_of_range_offsets_are_rejected_at_apply_with_the_valid_range(kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(40))
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "target.yaml").write_text(spec_text("target", kafka_broker.bootstrap, name))
    shutil.copyfile(CORPUS / "target.reset.yaml", specs / "target.reset.yaml")
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        result = reconcile_once(str(specs), Applier(store, actor="test"))
        by_kind = {(r.action.kind, r.action.supervisor_id): r for r in result.results}
        assert by_kind[("create", "target")].ok
        reset = by_kind[("reset", "target")]
        assert not reset.ok
        expected = f"partition 0: offset 1000000000 is outside the valid range [0, {ends[0]}]"
        assert expected in reset.message
        assert not (specs / "target.reset.yaml").exists()
        retired = (specs / "target.reset.yaml.rejected").read_text()
        assert expected in retired and retired.startswith("# valid when loaded")
        assert store.checkpoints("target") == {}, "a rejected reset moved no checkpoint"
        [row] = [r for r in store.history("target") if r["action"] == "reject-request"]
        assert expected in row["reason"]
        again = reconcile_once(str(specs), Applier(store, actor="test"))
        assert again.plan.actions == ()
    finally:
        store.close()


# --------------------------------------------------------------------------- the daemon


def _wait(what: str, condition: Callable[[], bool], timeout: float, thread: threading.Thread) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert thread.is_alive(), f"the daemon stopped while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _read_ids(spark, settings, datasource: str) -> collections.Counter:
    """Committed ids, read through the Iceberg catalog."""
    from tests.e2e import helpers as h

    return h.key_counts(spark, settings, datasource)


def test_daemon_fed_the_whole_corpus_while_ingesting(spark, kafka_broker, topic, tmp_path, caplog):
    """Valid supervisors keep running and ingest every record once; every bad file is reported;
    the supervisor whose own file broke keeps its last valid spec and keeps ingesting."""
    from reconciler.daemon import Daemon

    caplog.set_level(logging.INFO)
    bootstrap = kafka_broker.bootstrap
    topics = {"target": topic(partitions=2), "steady": topic(partitions=1), "victim": topic(partitions=1)}
    specs, state_dir = tmp_path / "specs", tmp_path / "state"
    specs.mkdir()
    for sid, name in topics.items():
        (specs / f"{sid}.yaml").write_text(spec_text(sid, bootstrap, name))
    first = devservices.make_records(4000)
    second = devservices.make_records(2000, start=4000)
    ends = {sid: devservices.produce_kafka(bootstrap, name, first) for sid, name in topics.items()}

    settings = settings_mod.load(
        {"specs": str(specs), "state_dir": str(state_dir), "segments": str(tmp_path / "segments"),
         "spark_master": "local[2]", "tick_interval": 0.5, "debounce": 0.1, "http": ""},
        env={},
    )
    daemon = Daemon(settings)
    failure: list[BaseException] = []

    def run():
        try:
            daemon.run(timeout=600)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    state_dir.mkdir()
    store = Store(settings.db_url)
    store.migrate()
    thread = threading.Thread(target=run, name="daemon-under-test", daemon=True)
    thread.start()
    try:
        def ingested(sid: str) -> int:
            return sum(store.checkpoints(sid).values()) if store.get(sid) else 0

        _wait("the first batch", lambda: any(ingested(s) > 0 for s in topics), 180, thread)
        assert sum(ingested(s) for s in topics) < 3 * len(first), "the corpus should land mid-ingestion"

        # Everything at once: the corpus, the generated cases, and the victim's own file breaking.
        CANARY.unlink(missing_ok=True)
        add_corpus(specs, tmp_path / "outside")
        (specs / "victim.yaml").write_bytes(b"\x00\x01 the victim's file, overwritten by garbage \xff")
        for sid, name in topics.items():
            ends[sid] = devservices.produce_kafka(bootstrap, name, second)

        def everything_ingested() -> bool:
            return all(store.checkpoints(sid) == {str(p): e for p, e in ends[sid].items()} for sid in topics)

        _wait("every record of both waves", everything_ingested, 300, thread)
        markers = [n for n, c in CASES.items() if c["kind"] == "marker"]
        _wait("every marker retired", lambda: not any((specs / m).exists() or (specs / m).is_symlink()
                                                       for m in markers), 60, thread)
        _wait("the victim's error recorded", lambda: (store.get("victim").last_error or "") != "", 30, thread)
    finally:
        daemon.request_stop()
        thread.join(timeout=120)
    assert not thread.is_alive(), "the daemon did not stop"
    assert not failure, failure

    try:
        # every valid supervisor is still there, none was terminated
        actual = store.read_actual()
        assert set(actual.mains()) == set(topics)
        for sid in topics:
            assert actual.supervisors[sid].state in RUNNABLE, (sid, actual.supervisors[sid].state)
        victim = actual.supervisors["victim"]
        assert "victim.yaml" in victim.last_error and "binary data, not YAML text" in victim.last_error
        assert not any(e["action"] == "terminated" for sid in topics for e in store.history(sid))
        # the broken file is recorded once, not again on every tick
        marks = [e for e in store.history("victim") if e["action"] == "mark-invalid"]
        assert len(marks) == 1, [(e["at"], e["reason"]) for e in marks]
    finally:
        store.close()

    # exactly once, by key, for every supervisor (the victim ingested its second wave too)
    want = collections.Counter(k for k, _ in first + second)
    for sid in topics:
        got = _read_ids(spark, settings, sid)
        dupes = {k: n for k, n in got.items() if n > 1}
        missing = set(want) - set(got)
        assert not dupes, f"{sid}: duplicated {list(dupes)[:5]}"
        assert not missing, f"{sid}: missing {sorted(missing)[:5]} ({len(missing)})"
        assert set(got) == set(want)

    # each file's error was reported (logged once, WARNING) with its file name
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for name, case in CASES.items():
        if case["stage"] == "apply":
            continue
        assert any(name in m and case["error"] in m for m in messages), f"{name} not reported"
    assert any("outside the valid range [0, " in m and "target" in m for m in messages)

    # markers were retired with their reasons; nothing from outside was copied in
    assert "outside the valid range [0, " in (specs / "target.reset.yaml.rejected").read_text()
    assert "unknown supervisor" in (specs / "ghost.reset.yaml.rejected").read_text()
    assert (specs / "escape.reset.yaml.rejected").is_symlink()
    for path in specs.iterdir():
        if path.is_file() and not path.is_symlink() and path.stat().st_size < (1 << 20):
            assert OUTSIDE_SECRET not in path.read_bytes(), f"{path.name} holds the outside file"
    assert not CANARY.exists(), "a YAML tag ran a command"
