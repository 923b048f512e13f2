"""``reconciler deadletter replay``: dead letters come back into the table exactly once.

A real pyiceberg catalog in the metadata database (SQLite; PostgreSQL with the
integration marks), batches published by the real transaction (``replaykit``), the
real replay commit, ``reconciler verify --deep`` and the command line."""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta

import pyarrow as pa
import pytest

from reconciler import faults
from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import DataSchema, Position, SupervisorSpec
from reconciler.observe import events
from reconciler.pipeline.transform import DEAD_SCHEMA
from reconciler.store.store import Store
from reconciler.table import catalog as cat
from reconciler.table.deadletters import STREAM_TIME_WHY, DeadFile
from reconciler.table.replay import ReplayRefused, _parse, _ranges, replay
from tests.e2e import helpers as h
from tests.table import replaykit as kit


@pytest.fixture
def setup(db_url, tmp_path):
    s = h.make_settings(tmp_path, db=db_url)
    store = Store(db_url)
    store.migrate()
    kit.create(store, "clicks", "millis")
    tables = cat.Tables(store.engine, s.segments_dir)
    yield s, store, tables
    store.close()


def _ingest(store, tables, batches=3, size=20):
    for b in range(batches):
        kit.publish(store, tables, "clicks", b * size, (b + 1) * size)
    return batches * size


def _dead(tables):
    return kit.table_offsets(tables, "clicks_deadletter")


def _rows(tables):
    return kit.table_offsets(tables, "clicks")


def _verify_deep(s):
    code, out = h.run_cli(s, "verify", "clicks", "--deep", "-o", "json")
    return code, json.loads(out)


def test_replay_after_the_fix_brings_each_record_back_once(setup):
    s, store, tables = setup
    n = _ingest(store, tables)
    dead_before = _dead(tables)
    assert len(dead_before) == n // 2 + n // 10  # ISO text (even offsets) + unparseable (offsets ...9)
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "--dry-run", "-o", "json")
    dry = json.loads(out)
    assert code == 0 and dry["replayed"] == 0  # the spec is not fixed yet: nothing would come back
    kit.set_format(store, "clicks", "auto")
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "--dry-run", "-o", "json")
    dry = json.loads(out)
    stays = [o for o in range(n) if o % 10 == 9]
    assert dry["replayed"] == len(dead_before) - len(stays) and dry["stayed"] == len(stays)
    assert dry["stayedByReason"] == {"unparseable timestamp (auto)": len(stays)}
    assert _dead(tables) == dead_before  # a dry run changes nothing
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    first = json.loads(out)
    assert code == 0 and first["committed"] and first["replayed"] == dry["replayed"], first
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]  # every record once, by offset
    assert _dead(tables) == stays
    reasons = tables.load("clicks_deadletter").scan().to_arrow().column("reason").to_pylist()
    assert all(r.startswith("unparseable timestamp (auto)") for r in reasons)  # their new reason
    code, report = _verify_deep(s)
    assert code == 0 and report["ok"] and report["deep"]["replayed"] == first["replayed"], report
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    second = json.loads(out)
    assert code == 0 and second["replayed"] == 0 and not second["committed"]
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]
    history = [e for e in store.history("clicks") if e["action"] == "deadletter-replay"]
    assert len(history) == 1 and history[0]["details"]["replayed"] == first["replayed"]
    assert history[0]["details"]["stayedByReason"] == {"unparseable timestamp (auto)": len(stays)}
    event = events.event(history[0])  # what a webhook receives
    assert event["type"] == "deadletter.replayed" and f"{first['replayed']} replayed" in event["summary"]
    [st] = h.cli_json(s, "status", "clicks", "--no-lag")["supervisors"]  # status and its pages show them
    assert st["deadLetters"] == {"pending": len(stays), "replayed": first["replayed"],
                                 "lastReason": "unparseable timestamp (auto)",
                                 "command": "reconciler deadletter list clicks"}
    code, text = h.run_cli(s, "status", "--no-lag")
    assert f"clicks: {len(stays)} dead letter(s) pending" in text and "reconciler deadletter list clicks" in text
    code, out = h.run_cli(s, "deadletter", "list", "clicks", "-o", "json")
    listing = json.loads(out)
    assert listing["deadLetters"] == len(stays) and listing["replayed"] == first["replayed"]
    assert listing["byReason"][0]["records"][0]["value"].startswith('{"id":"r9"')


def test_two_replays_at_once_bring_each_record_back_once(setup):
    s, store, tables = setup
    n = _ingest(store, tables)
    kit.set_format(store, "clicks", "auto")
    barrier = threading.Barrier(2)
    results, errors = [], []

    def hook(name, subject):
        if name == "replay-commit":  # both have staged on the same dead-letter version
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass

    def run():
        try:
            results.append(replay(tables, store, "clicks", actor="t"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    faults.install(hook)
    try:
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        faults.install(None)
    assert not errors, errors
    assert sum(r.committed for r in results) == 1
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]
    assert _verify_deep(s)[0] == 0


def test_replay_racing_an_ingestion_commit_retries_and_loses_nothing(setup):
    s, store, tables = setup
    _ingest(store, tables, batches=2)
    kit.set_format(store, "clicks", "millis")
    # the fix comes later: the next batch dead-letters too, and lands while the replay is staged
    kit.set_format(store, "clicks", "auto")
    fired = []

    def hook(name, subject):
        if name == "replay-commit" and not fired:
            fired.append(1)
            kit.set_format(store, "clicks", "millis")
            kit.publish(store, tables, "clicks", 40, 60)  # moves both tables' pointers
            kit.set_format(store, "clicks", "auto")

    faults.install(hook)
    try:
        result = replay(tables, store, "clicks", actor="t")
    finally:
        faults.install(None)
    assert result.committed and result.attempts >= 2, result
    assert _rows(tables) == [o for o in range(60) if o % 10 != 9]  # the racing batch's letters too
    assert _dead(tables) == [o for o in range(60) if o % 10 == 9]
    assert _verify_deep(s)[0] == 0


@pytest.mark.parametrize("point", ["replay-written", "replay-commit"])
def test_a_replay_killed_before_its_commit_commits_nothing_and_runs_again(setup, point):
    s, store, tables = setup
    n = _ingest(store, tables)
    kit.set_format(store, "clicks", "auto")
    dead_before, rows_before = _dead(tables), _rows(tables)

    class Killed(BaseException):
        pass

    def hook(name, subject):
        if name == point:
            raise Killed

    faults.install(hook)
    try:
        with pytest.raises(Killed):
            replay(tables, store, "clicks", actor="t")
    finally:
        faults.install(None)
    assert _dead(tables) == dead_before and _rows(tables) == rows_before
    result = replay(tables, store, "clicks", actor="t")
    assert result.committed
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]
    assert _verify_deep(s)[0] == 0


def test_a_commit_whose_outcome_was_unknown_but_committed_counts_once(setup):
    """The connection drops after the COMMIT reached the database: the fence says it committed."""
    s, store, tables = setup
    n = _ingest(store, tables)
    kit.set_format(store, "clicks", "auto")
    from reconciler.errors import CommitOutcomeUnknown

    armed: list = []

    def hook(name, subject):
        if name == "replay-commit":
            armed.append(1)
        elif name == "commit-after" and len(armed) == 1:
            armed.append(2)
            raise CommitOutcomeUnknown("connection lost after COMMIT")

    faults.install(hook)
    try:
        result = replay(tables, store, "clicks", actor="t")
    finally:
        faults.install(None)
    assert armed == [1, 2]
    assert result.replayed and _rows(tables) == [o for o in range(n) if o % 10 != 9]
    assert replay(tables, store, "clicks", actor="t").replayed == 0
    assert _verify_deep(s)[0] == 0


def test_bad_input_is_refused_and_changes_nothing(setup):
    s, store, tables = setup
    code, out = h.run_cli(s, "deadletter", "replay", "nowhere")
    assert code == 1
    _ingest(store, tables, batches=1)
    kit.set_format(store, "clicks", "auto")
    code, _ = h.run_cli(s, "deadletter", "replay", "clicks", "--supervisor", "nobody", "-o", "json")
    assert code == 1
    store.mark_invalid("clicks", "specs/clicks.yaml:4: dataSchema: bad", None, actor="t", path="specs/clicks.yaml")
    before = _dead(tables)
    with pytest.raises(ReplayRefused, match="invalid"):
        replay(tables, store, "clicks", actor="t")
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    assert code == 1 and "invalid" in json.loads(out)["error"]
    assert _dead(tables) == before


def test_a_datasource_without_dead_letters_is_refused(setup):
    s, store, tables = setup
    kit.set_format(store, "clicks", "auto")
    kit.publish(store, tables, "clicks", 0, 5, raw=[b'{"id":"a","ts":1}'] * 5)
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    assert code == 1 and "no dead letters" in json.loads(out)["error"]


# --------------------------------------------------------------------------- review of 79c0c37 / bd9f2e9


def _dead_rows(offsets: list[int], values: list[bytes], reasons: list[str]) -> pa.Table:
    return pa.table({"partition": ["0"] * len(offsets), "offset": pa.array(offsets, pa.int64()),
                     "key": pa.array([f"k{o}".encode() for o in offsets], pa.binary()),
                     "value": pa.array(values, pa.binary()), "reason": reasons}).cast(DEAD_SCHEMA)


class _Spec:
    def __init__(self, **kw):
        self.data_schema = DataSchema(datasource="clicks", dimensions=("id",), **kw)


def test_a_spec_timed_by_stream_time_leaves_its_dead_letters_where_they_are():
    """The operator moved the spec to ``__stream_time`` (the records' ``ts`` was bad); the
    dead letters of before keep no stream time, so none comes back, and each keeps the
    reason that said what was wrong with the record (it was rewritten to ``missing
    timestamp column '__stream_time'``, and ``--reason 'unparseable'`` no longer found it)."""
    before = ["unparseable timestamp (millis): 2026-11-20T10:00:00Z", "unparseable timestamp (millis): soon"]
    rows = _dead_rows([4, 6], [b'{"id":"r4","ts":"2026-11-20T10:00:00Z"}', b'{"id":"r6","ts":"soon"}'], before)
    parsed = _parse(DeadFile(task=None, supervisor="clicks", rows=rows), _Spec(timestamp_column="__stream_time"), None)
    assert parsed.replayed == []
    assert parsed.kept.column("reason").to_pylist() == before, parsed.kept.column("reason").to_pylist()
    assert not parsed.changed
    assert parsed.left == [STREAM_TIME_WHY] * 2 and parsed.stayed_reasons == before


def test_under_a_stream_time_spec_the_dry_run_and_list_say_why_the_letters_stay(setup):
    s, store, tables = setup
    _ingest(store, tables, batches=1)
    dead = _dead(tables)
    reasons_before = sorted(tables.load("clicks_deadletter").scan().to_arrow().column("reason").to_pylist())
    kit.set_format(store, "clicks", "millis", column="__stream_time")
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "--dry-run", "-o", "json")
    dry = json.loads(out)
    assert code == 0 and dry["replayed"] == 0 and dry["stayed"] == len(dead), dry
    assert dry["cannotComeBack"] == {STREAM_TIME_WHY: len(dead)} and STREAM_TIME_WHY in dry["message"]
    code, text = h.run_cli(s, "deadletter", "replay", "clicks", "--dry-run")
    assert STREAM_TIME_WHY in text
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    assert not json.loads(out)["committed"]
    after = sorted(tables.load("clicks_deadletter").scan().to_arrow().column("reason").to_pylist())
    assert _dead(tables) == dead and after == reasons_before
    code, out = h.run_cli(s, "deadletter", "list", "clicks", "-o", "json")
    assert json.loads(out)["cannotComeBack"] == [{"why": STREAM_TIME_WHY, "count": len(dead)}]
    code, text = h.run_cli(s, "deadletter", "list", "clicks")
    assert f"{len(dead)} will stay whatever the spec: {STREAM_TIME_WHY}" in text


def test_one_offset_twice_in_a_dead_letter_file_each_row_is_judged_on_its_own():
    """Offset 5 twice (a value that now parses and one that does not) and offset 7 twice
    (the same record): keyed by (partition, offset), the good 5 was appended but not
    counted as replayed, and the bad 5's letter was the only one kept."""
    good, bad = b'{"id":"r5","ts":"2026-11-20T10:00:00Z"}', b'{"id":"r5","ts":"soon"}'
    same = b'{"id":"r7","ts":"2026-11-20T11:00:00Z"}'
    old = "unparseable timestamp (millis): x"
    rows = _dead_rows([5, 5, 7, 7], [good, bad, same, same], [old] * 4)
    parsed = _parse(DeadFile(task=None, supervisor="clicks", rows=rows), _Spec(timestamp_column="ts"), None)
    assert sorted(parsed.replayed) == [("0", 5), ("0", 7), ("0", 7)] and parsed.rows.num_rows == 3
    assert parsed.kept.column("value").to_pylist() == [bad]
    assert parsed.kept.column("reason").to_pylist() == ["unparseable timestamp (auto): soon"]
    assert parsed.changed and parsed.stayed_reasons == ["unparseable timestamp (auto): soon"]
    assert _ranges(parsed.replayed) == [["0", 5, 6], ["0", 7, 8]]


def test_status_of_one_supervisor_counts_its_backfills_dead_letters(setup):
    """``status clicks`` shows the main alone: its pending count counted the items shown,
    so the backfill's dead letters were missing from it (and the replayed count, from the
    audit log, had them: pending could go to 0 with letters left)."""
    s, store, tables = setup
    kit.publish(store, tables, "clicks", 0, 20)
    pos = Positions(earliest={"0": 0}, latest={"0": 40})
    res = store.apply_reset(from_cli("clicks", Position("latest"), operation_id="r"),
                            lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True),
                            initial={}, earliest=pos.earliest, actor="t")
    kit.publish(store, tables, res.backfill_id, 20, 40)
    pending = len(_dead(tables))
    assert pending == 24
    every = {x["id"]: x for x in h.cli_json(s, "status", "--no-lag")["supervisors"]}
    [one] = h.cli_json(s, "status", "clicks", "--no-lag")["supervisors"]
    assert every["clicks"]["deadLetters"]["pending"] == one["deadLetters"]["pending"] == pending


# --------------------------------------------------------------------------- two lineages


def _doc(sid: str, segment: str, fmt: str) -> dict:
    d = kit.spec_document(sid, fmt, datasource="clicks")
    d["dataSchema"]["granularity"] = {"segment": segment}
    return d


@pytest.fixture
def two(db_url, tmp_path):
    s = h.make_settings(tmp_path, db=db_url)
    store = Store(db_url)
    store.migrate()
    for sid, seg in (("clicks", "hour"), ("views", "day")):
        store.create_supervisor(SupervisorSpec.from_document(_doc(sid, seg, "millis")), None, actor="test")
        store.init_checkpoints(sid, {"0": 0})
    tables = cat.Tables(store.engine, s.segments_dir)
    yield s, store, tables
    store.close()


def _values(start: int, end: int) -> list[bytes]:
    """Even offsets: ISO text (dead under millis), hours apart; odd: epoch millis."""
    out = []
    for o in range(start, end):
        t = kit.T0 + timedelta(hours=o % 6)
        ts = f'"{t.strftime("%Y-%m-%dT%H:%M:%SZ")}"' if o % 2 == 0 else str(int(t.timestamp() * 1000))
        out.append(f'{{"id":"r{o}","ts":{ts}}}'.encode())
    return out


def test_replay_of_a_datasource_two_lineages_write_with_other_segment_granularities(two):
    """Two supervisors write datasource ``clicks`` (allowed: crossfile.py asks them to
    agree on rollup and columns only), one by hour, one by day. Each batch stages its
    append with its own spec's granularity. A replay wrote every lineage's rows in ONE
    append staged with the granularity of ``changed[0]``'s spec: when that was the hourly
    one, the daily lineage's files (a day of hours each) could not be given one hour
    partition and the replay failed, every time (ValueError from the partition
    inference). Now the rows are split by the table's own partitioning."""
    s, store, tables = two
    for sid in ("views", "clicks"):  # two topics, each partition 0, offsets 0..11
        kit.publish(store, tables, sid, 0, 12, raw=_values(0, 12))
    for sid, seg in (("clicks", "hour"), ("views", "day")):
        store.update_spec(SupervisorSpec.from_document(_doc(sid, seg, "auto")), None, actor="test")
    dead = kit.table_offsets(tables, "clicks_deadletter")
    assert len(dead) == 12  # the even offsets of each
    result = replay(tables, store, "clicks", actor="t")
    assert result.committed and result.replayed == 12, result
    assert kit.table_offsets(tables, "clicks_deadletter") == []
    assert kit.table_offsets(tables, "clicks") == sorted(list(range(12)) * 2)


# --------------------------------------------------------------------------- a write fenced by recovery


@pytest.mark.parametrize("then_publish", [True, False], ids=["then-a-publish", "alone"])
def test_a_replay_whose_write_recovery_fenced_starts_over_under_a_new_write(setup, then_publish):
    """Schedule ``replay-fenced-by-recovery``: the replay is staged at its COMMIT when a
    daemon starts; its recovery fences the replay's write and deletes its files. Then a
    batch publishes (its new letters do not parse under the fixed spec either, so the
    replay's changed set stays the same): the replay planned again, reused the files of
    its fenced write and failed with FileNotFoundError on its own deleted Parquet file.
    Alone, the commit met the fence and the replay gave up though nothing was committed.
    Now it starts over under a new write and commits once."""
    from reconciler.runtime.recovery import recover

    s, store, tables = setup
    _ingest(store, tables, batches=2)
    kit.set_format(store, "clicks", "auto")
    fenced: list[str] = []

    def hook(name, subject):
        if name == "replay-commit" and not fenced:
            [intent] = store.writes_in_flight()
            fenced.append(intent.write_id)
            assert recover(store, s.segments_dir)["orphansDeleted"] >= 1  # a new leader starts
            if then_publish:  # under the fixed spec: offsets 49 and 59 still do not parse
                kit.publish(store, tables, "clicks", 40, 60)

    faults.install(hook)
    try:
        result = replay(tables, store, "clicks", actor="t")
    finally:
        faults.install(None)
    n = 60 if then_publish else 40
    assert result.committed and result.attempts >= 2, result
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]
    assert _dead(tables) == [o for o in range(n) if o % 10 == 9]
    [entry] = [e for e in store.history("clicks") if e["action"] == "deadletter-replay"]
    assert entry["details"]["writeId"] != fenced[0]
    assert store.write_statuses(fenced) == {fenced[0]: "discarded"}
    for name in ("clicks", "clicks_deadletter"):
        assert not (cat.local_path(tables.load(name).location()) / "data" / "compacted" / fenced[0]).exists()
    assert _verify_deep(s)[0] == 0


def test_a_file_error_during_a_replay_is_an_error_message_and_commits_nothing(setup):
    """A file of the replay's write vanishes while the write is live (not a clean-up's
    fence: a disk or an operator's ``rm``): the command printed a FileNotFoundError
    traceback. Now it says what stopped it, exits 1, and a second run commits."""
    s, store, tables = setup
    n = _ingest(store, tables, batches=2)
    kit.set_format(store, "clicks", "auto")
    dead_before, rows_before = _dead(tables), _rows(tables)
    gone: list[str] = []

    def hook(name, subject):
        if name == "replay-written" and not gone:
            [intent] = store.writes_in_flight()
            folder = cat.local_path(tables.load("clicks").location()) / "data" / "compacted" / intent.write_id
            gone.extend(str(p) for p in folder.rglob("*.parquet"))
            for p in gone:
                os.unlink(p)

    faults.install(hook)
    try:
        code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    finally:
        faults.install(None)
    assert gone and code == 1, out
    error = json.loads(out)["error"]
    assert "stopped on a file" in error and "run it again" in error, error
    assert _dead(tables) == dead_before and _rows(tables) == rows_before
    assert store.writes_in_flight() == []  # fenced and deleted by the replay itself
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    assert code == 0 and json.loads(out)["committed"], out
    assert _rows(tables) == [o for o in range(n) if o % 10 != 9]
