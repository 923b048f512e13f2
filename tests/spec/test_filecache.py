"""The daemon's spec cache: unchanged files are not parsed again, every change is seen.

A file is unchanged when its (device, inode, mode, size, mtime, ctime, symlink target) key
is the one it was loaded with; a file whose timestamps were within the filesystem's
granularity of the moment it was read is in doubt and compared by content. Everything the
loader guarantees (duplicate ids, permissions, revalidation of time-dependent errors)
holds for cached files too.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from reconciler.spec import filecache, specfiles
from reconciler.spec.filecache import FileCache, FileKey
from reconciler.spec.loader import SpecCache, load_directory

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def spec_text(sid: str, topic: str = "t", extra: str = "") -> str:
    return f"""\
id: {sid}
source: {{type: kafka, bootstrapServers: 127.0.0.1:9092, topic: {topic}}}
dataSchema:
  datasource: {sid.replace("-", "_")}
  timestamp: {{column: ts}}
{extra}"""


@pytest.fixture
def specs(tmp_path):
    d = tmp_path / "specs"
    d.mkdir()
    d.chmod(0o755)
    return d


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Paths parsed by the loader, in order."""
    seen: list[str] = []
    real = specfiles.parse_yaml

    def counting(data, path, **kwargs):
        seen.append(os.path.basename(path))
        return real(data, path, **kwargs)

    monkeypatch.setattr(specfiles, "parse_yaml", counting)
    return seen


@pytest.fixture
def settled(monkeypatch):
    """Every file counts as written long ago: the key alone decides (no content check)."""
    monkeypatch.setattr(filecache, "GRANULARITY_NS", -(10**18))


def rewrite_keeping_mtime(path, text: str) -> None:
    """New bytes of the same size with the old mtime, as ``cp -p`` or ``rsync -t`` leave them."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unchanged_files_are_not_parsed_again(specs, parses, settled):
    for i in range(5):
        (specs / f"s{i}.yaml").write_text(spec_text(f"s{i}"))
    cache = SpecCache()
    first = load_directory(str(specs), cache=cache)
    assert len(parses) == 5 and cache.stats.misses == 5
    parses.clear()
    second = load_directory(str(specs), cache=cache)
    assert parses == [] and cache.stats.hits == 5
    assert second.by_id() == first.by_id()
    assert second == load_directory(str(specs))  # the same state as without a cache


def test_a_changed_file_is_loaded_again_even_with_the_old_size_and_mtime(specs, parses, settled):
    path = specs / "a.yaml"
    path.write_text(spec_text("a", topic="t1"))
    (specs / "b.yaml").write_text(spec_text("b"))
    cache = SpecCache()
    load_directory(str(specs), cache=cache)
    parses.clear()
    rewrite_keeping_mtime(path, spec_text("a", topic="t2"))
    state = load_directory(str(specs), cache=cache)
    assert parses == ["a.yaml"]
    assert state.by_id()["a"].source.topic == "t2"


def test_a_file_in_doubt_is_compared_by_content(specs, parses):
    path = specs / "a.yaml"
    path.write_text(spec_text("a"))
    cache = SpecCache()
    load_directory(str(specs), cache=cache)  # just written: in doubt
    parses.clear()
    state = load_directory(str(specs), cache=cache)
    assert parses == [] and cache.stats.confirmed == 1
    assert set(state.by_id()) == {"a"}


def test_file_cache_in_doubt_rereads_and_then_trusts(tmp_path):
    cache: FileCache[str] = FileCache()
    now = 10**18
    key = FileKey(1, 2, 0o100644, 3, mtime_ns=now, ctime_ns=now)
    cache.store("p", key, b"old", read_at_ns=now + 1, value="parsed old")
    assert cache.lookup("p", key, lambda: b"new") is None, "same key, other bytes: loaded again"
    cache.store("p", key, b"old", read_at_ns=now + 1, value="parsed old")
    reads: list[int] = []

    def read() -> bytes:
        reads.append(1)
        return b"old"

    assert cache.lookup("p", key, read) == "parsed old" and len(reads) == 1
    assert cache.lookup("p", key, read) == "parsed old"  # now long after the change: trusted
    assert len(reads) == 1
    assert cache.lookup("p", FileKey(1, 2, 0o100644, 3, now, now + 1), read) is None  # ctime moved


def test_invalid_files_are_validated_again_but_not_parsed_again(specs, parses, settled):
    (specs / "later.yaml").write_text(spec_text("later", extra="startFrom: {timestamp: '2026-11-21T00:00:00Z'}\n"))
    cache = SpecCache()
    before = load_directory(str(specs), cache=cache, now=NOW)
    assert "in the future" in str(before.invalid[str(specs / "later.yaml")])
    parses.clear()
    after = load_directory(str(specs), cache=cache, now=datetime(2026, 11, 22, tzinfo=UTC))
    assert parses == [] and set(after.by_id()) == {"later"}


def test_duplicate_ids_are_found_among_cached_files(specs, settled):
    (specs / "a.yaml").write_text(spec_text("twin"))
    (specs / "b.yaml").write_text(spec_text("twin"))
    cache = SpecCache()
    for _ in range(2):
        state = load_directory(str(specs), cache=cache)
        assert not state.specs and set(state.invalid) == {str(specs / "a.yaml"), str(specs / "b.yaml")}
        assert "also declared in" in str(state.invalid[str(specs / "a.yaml")])
    (specs / "b.yaml").unlink()
    state = load_directory(str(specs), cache=cache)
    assert set(state.by_id()) == {"twin"} and not state.invalid, "the cached file was not left marked"
    assert len(cache) == 1, "a removed file is forgotten"


def test_a_file_made_writable_by_others_is_refused_though_unchanged(specs, settled):
    path = specs / "a.yaml"
    path.write_text(spec_text("a"))
    cache = SpecCache()
    assert set(load_directory(str(specs), cache=cache).by_id()) == {"a"}
    path.chmod(0o666)
    state = load_directory(str(specs), cache=cache)
    assert not state.specs and "writable by others" in str(state.invalid[str(path)])
    assert state.invalid_ids == {"a": str(path)}, "its id is still recovered: never taken as removed"
    path.chmod(0o644)
    assert set(load_directory(str(specs), cache=cache).by_id()) == {"a"}


def test_a_repointed_symlink_is_loaded_again(specs, parses, settled):
    (specs / "v1.yml.txt").write_text(spec_text("a", topic="t1"))
    (specs / "v2.yml.txt").write_text(spec_text("a", topic="t2"))
    link = specs / "a.yaml"
    link.symlink_to("v1.yml.txt")
    cache = SpecCache()
    assert load_directory(str(specs), cache=cache).by_id()["a"].source.topic == "t1"
    link.unlink()
    link.symlink_to("v2.yml.txt")
    assert load_directory(str(specs), cache=cache).by_id()["a"].source.topic == "t2"


def test_broken_files_stay_broken_from_the_cache(specs, parses, settled):
    (specs / "bad.yaml").write_text("id: bad\nsource: [unclosed\n")
    cache = SpecCache()
    first = load_directory(str(specs), cache=cache)
    parses.clear()
    second = load_directory(str(specs), cache=cache)
    assert parses == []
    assert [str(p) for p in second.problems] == [str(p) for p in first.problems]
    assert second.invalid_ids == {"bad": str(specs / "bad.yaml")}
