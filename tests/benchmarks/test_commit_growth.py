"""Issue 34's goals, fast: 300 one-record commits through ``benchmarks/commit_growth.py``'s
``run()`` (the product's runtime step, its publish with continuous expiry and the deletions
after each commit; Parquet written with pyarrow, no broker, no Spark), measured after EVERY
commit: the table's ``metadata/`` directory never holds more than 100 files once past the
first few commits, the current metadata file stays under 256 KiB, and ``verify`` passes."""

from __future__ import annotations

from tests.benchmarks.load import benchmark

COMMITS = 150  # steady from the 35th commit on: the last 50 are compared with the 50 before


def test_metadata_stays_bounded_after_every_commit(db_url, tmp_path):
    kept = 25  # snapshotsKept's default
    # readerGrace 0: the history the table keeps, without what a grace holds for pinned readers
    # (that is rate x grace more files, deleted once the grace is over: tests/table/test_reader_grace.py)
    doc = benchmark("commit_growth").run(db_url, tmp_path, commits=COMMITS, window=1, records=1, kept=kept,
                                         reader_grace=0)
    windows = doc["windows"]
    assert [w["commits"] for w in windows] == list(range(1, COMMITS + 1))  # one measure per commit
    late = windows[kept + 10:]  # past the first few: the history has reached its steady size
    worst = max(late, key=lambda w: w["metadataDirFiles"])
    assert worst["metadataDirFiles"] <= 100, worst
    assert max(w["metadataFileKiB"] for w in windows) <= 256
    assert max(w["snapshots"] for w in late) <= kept + 5 + 1
    # the directory is flat, not growing: the last 50 commits hold no more files than the 50 before
    assert max(w["metadataDirFiles"] for w in windows[-50:]) <= max(w["metadataDirFiles"] for w in windows[-100:-50]) + 2
    assert doc["verifyOk"], doc
    print(f"metadata/ at most {worst['metadataDirFiles']} files, metadata file at most "
          f"{max(w['metadataFileKiB'] for w in windows)} KiB, {doc['seconds']} s")
    # the peaks sampled after every commit agree with the window's own measure (a window is one commit)
    assert all(w["metadataDirFilesPeak"] == w["metadataDirFiles"] for w in windows)
    assert doc["goals"]["maxMetadataDirFiles"] == max(w["metadataDirFiles"] for w in windows)


def test_the_current_metadata_file_is_the_highest_version_past_five_digits(tmp_path):
    # version 100,000 comes after 99,999 though its name sorts before it
    (tmp_path / "99999-a.metadata.json").write_bytes(b"x" * 2048)
    (tmp_path / "100000-b.metadata.json").write_bytes(b"x" * 100)
    (tmp_path / "snap-1-m0.avro").write_bytes(b"x")
    assert benchmark("commit_growth")._metadata_dir(tmp_path) == (3, 100)
