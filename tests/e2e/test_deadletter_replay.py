"""Dead letters come back, end to end: real Tansu, real Spark, the daemon and the CLI.

Records whose ``ts`` is ISO text are dead-lettered under ``format: millis``; the spec is
changed to ``format: auto``; ``reconciler deadletter replay`` brings them into the table
exactly once by key, while records whose ``ts`` is no time at all stay pending. A second
replay adds nothing; a replay killed mid-way (SIGKILL at a crash point) committed nothing
and the next one completes; a replay beside a running daemon that keeps ingesting (and
dead-lettering) loses and duplicates nothing. ``verify --deep`` passes after each.
"""

from __future__ import annotations

import collections
import json
import signal
import threading
import time

import pytest

import devservices
from reconciler.daemon import Daemon
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

T0_MS = 1_763_632_800_000  # 2025-11-20T10:00:00Z


def _records(start: int, n: int) -> list[tuple[str, bytes]]:
    """Keys k<i>: i % 3 == 0 ISO text ts, i % 10 == 7 no time at all, the rest millis."""
    out = []
    for i in range(start, start + n):
        if i % 10 == 7:
            ts = '"sometime"'
        elif i % 3 == 0:
            ts = json.dumps(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((T0_MS + i * 1000) / 1000)))
        else:
            ts = str(T0_MS + i * 1000)
        value = f'{{"id":"k{i:06d}","ts":{ts},"user":"u{i % 7}","page":"/p","bytes":{i % 100}}}'
        out.append((f"k{i:06d}", value.encode()))
    return out


def _never(i: int) -> bool:
    return i % 10 == 7


def _spec(s, broker, name, fmt):
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(broker.bootstrap, name),
                                     timestamp={"column": "ts", "format": fmt}))


def _pending(s) -> dict:
    return h.cli_json(s, "deadletter", "list", "clicks")


def _verify_deep(s) -> dict:
    code, out = h.run_cli(s, "verify", "clicks", "--deep", "-o", "json")
    report = json.loads(out)
    assert code == 0 and report["ok"], report
    return report


def test_fixed_spec_then_replay_exactly_once_killed_replay_and_second_replay(spark, kafka_broker, topic, tmp_path):
    n = 600
    name = topic(partitions=2)
    records = _records(0, n)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    _spec(s, kafka_broker, name, "millis")
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    dead = [i for i in range(n) if _never(i) or i % 3 == 0]
    assert _pending(s)["deadLetters"] == len(dead)
    assert set(h.key_counts(spark, s, "clicks")) == {f"k{i:06d}" for i in range(n) if i not in set(dead)}

    _spec(s, kafka_broker, name, "auto")  # the fix, applied as the daemon would
    assert h.run_cli(s, "apply")[0] == 0
    # killed after its files were written, before its commit: nothing changes
    killed = h.run_subprocess(s, "deadletter", "replay", "clicks", env={"RECONCILER_CRASH_AT": "replay-written"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _pending(s)["deadLetters"] == len(dead)
    # killed right after its commit: done, whatever it did not get to say
    done = h.run_subprocess(s, "deadletter", "replay", "clicks", env={"RECONCILER_CRASH_AT": "replay-committed"})
    assert done.returncode == -signal.SIGKILL, done.stderr
    expected = {f"k{i:06d}" for i in range(n) if not _never(i)}
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), expected)
    listing = _pending(s)
    assert listing["deadLetters"] == sum(1 for i in range(n) if _never(i))
    assert [r["reason"] for r in listing["byReason"]] == ["unparseable timestamp (auto)"]
    assert _verify_deep(s)["deep"]["replayed"] == sum(1 for i in range(n) if i % 3 == 0 and not _never(i))

    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")  # a second replay
    again = json.loads(out)
    assert code == 0 and again["replayed"] == 0 and not again["committed"]
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), expected)
    assert _pending(s)["deadLetters"] == listing["deadLetters"]
    [st] = h.cli_json(s, "status", "clicks", "--no-lag")["supervisors"]
    assert st["deadLetters"]["pending"] == listing["deadLetters"]


def test_replay_beside_a_running_daemon(spark, kafka_broker, topic, tmp_path):
    name = topic(partitions=2)
    devservices.produce_kafka(kafka_broker.bootstrap, name, _records(0, 400))
    s = h.make_settings(tmp_path)
    _spec(s, kafka_broker, name, "millis")
    assert h.run_daemon(s, timeout=180)[0] == 0
    _spec(s, kafka_broker, name, "auto")
    daemon = Daemon(s)
    thread = threading.Thread(target=lambda: daemon.run(timeout=600), name="daemon", daemon=True)
    thread.start()
    results: list[dict] = []
    try:
        time.sleep(3)  # the daemon applies the fixed spec
        for k in range(4):  # ingestion keeps committing while the replays run
            devservices.produce_kafka(kafka_broker.bootstrap, name, _records(400 + k * 100, 100))
            r = h.run_subprocess(s, "deadletter", "replay", "clicks", "-o", "json")
            assert r.returncode == 0, r.stdout + r.stderr
            results.append(json.loads(r.stdout))
        deadline = time.monotonic() + 120
        while h.cli_json(s, "status", "clicks", "--no-lag")["supervisors"][0]["records"] < 800:
            assert time.monotonic() < deadline, "the daemon did not ingest everything"
            time.sleep(0.5)
    finally:
        daemon.request_stop()
        thread.join(120)
    assert any(r["replayed"] for r in results), results
    last = h.cli_json(s, "deadletter", "replay", "clicks")  # whatever a batch dead-lettered before the fix
    assert last["ok"]
    assert _pending(s)["deadLetters"] == sum(1 for i in range(800) if _never(i))
    counts = h.key_counts(spark, s, "clicks")
    h.assert_exactly_once(counts, {f"k{i:06d}" for i in range(800) if not _never(i)})
    assert collections.Counter(counts.values()) == {1: len(counts)}
    _verify_deep(s)


def test_typed_json_a_fixed_timestamp_comes_back_and_a_misfit_qty_stays(spark, kafka_broker, topic, tmp_path):
    """Issue 43's check with typed JSON: ``ts`` as ISO text under ``format: millis`` and ``qty``
    as text under ``type: long`` are both dead letters; ``format: auto`` fixes the first kind
    only, so replay brings those in exactly once and leaves the others pending; a second
    replay adds nothing."""
    n = 300
    name = topic(partitions=2)
    records = []
    for i in range(n):
        ts = json.dumps(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((T0_MS + i * 1000) / 1000))) \
            if i % 3 == 0 else str(T0_MS + i * 1000)
        qty = '"lots"' if i % 5 == 0 and i % 3 != 0 else str(i)
        records.append((f"k{i:06d}", f'{{"id":"k{i:06d}","ts":{ts},"qty":{qty}}}'.encode()))
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    dims = ["id", {"name": "qty", "type": "long"}, "__partition", "__offset"]

    def spec(fmt: str) -> None:
        h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name),
                                         timestamp={"column": "ts", "format": fmt}, dimensions=dims))

    spec("millis")
    assert h.run_daemon(s, timeout=180)[0] == 0
    iso = {i for i in range(n) if i % 3 == 0}
    misfit = {i for i in range(n) if i % 5 == 0 and i % 3 != 0}
    assert _pending(s)["deadLetters"] == len(iso) + len(misfit)
    listing = _pending(s)
    assert {r["reason"] for r in listing["byReason"]} == {"qty", "unparseable timestamp (millis)"}, listing
    assert "is not a long" in json.dumps(listing), listing  # the samples name the misfit
    spec("auto")
    assert h.run_cli(s, "apply")[0] == 0
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    first = json.loads(out)
    assert code == 0 and first["replayed"] == len(iso), first
    expected = {f"k{i:06d}" for i in range(n) if i not in misfit}
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), expected)
    assert _pending(s)["deadLetters"] == len(misfit)
    code, out = h.run_cli(s, "deadletter", "replay", "clicks", "-o", "json")
    again = json.loads(out)
    assert code == 0 and again["replayed"] == 0, again
    h.assert_exactly_once(h.key_counts(spark, s, "clicks"), expected)
    assert _pending(s)["deadLetters"] == len(misfit)
    _verify_deep(s)
