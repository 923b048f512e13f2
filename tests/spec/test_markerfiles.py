"""Retiring a marker never writes through a link (issue 29): a link committed to the repo at
the old fixed temporary name, or at the result's own name, is never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.spec.markerfiles import retire


@pytest.mark.parametrize("planted", [".clicks.reset.yaml.rejected.tmp", "clicks.reset.yaml.rejected"])
def test_a_link_in_the_way_is_never_written_through(tmp_path, planted):
    specs = tmp_path / "specs"
    specs.mkdir()
    victim = tmp_path / "reconciler.db"  # what a hostile dotfile pointed at: the metadata database
    victim.write_bytes(b"SQLite format 3\x00 precious")
    (specs / planted).symlink_to(victim)
    (specs / "clicks.reset.yaml").write_text("resetTo: latest\nreason: test\n")
    new = retire(str(specs / "clicks.reset.yaml"), "rejected", {"reason": "bad"})
    assert victim.read_bytes() == b"SQLite format 3\x00 precious"
    assert new is not None and not os.path.islink(new)
    text = open(new).read()
    assert text.startswith("resetTo: latest\nreason: test\n") and "# reason: bad" in text
    assert not (specs / "clicks.reset.yaml").exists()
    assert not [p for p in specs.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()], "no temporary left"


def test_the_retired_file_keeps_the_markers_mode(tmp_path):
    marker = tmp_path / "clicks.reset.yaml"
    marker.write_text("resetTo: latest\n")
    marker.chmod(0o640)
    new = retire(str(marker), "applied", {"ok": True})
    assert oct(os.stat(new).st_mode & 0o777) == "0o640"


def test_a_long_reason_stays_on_one_comment_line(tmp_path):
    """An operator greps retired markers for a reason: YAML must not fold it (where it would
    fold depends on the length of the path the reason names)."""
    marker = tmp_path / "x.reset.yaml"
    marker.write_text("resetTo: latest\n")
    reason = f"{tmp_path / ('deep' * 30) / 'x.reset.yaml'}: unknown supervisor 'x' (known: " + ", ".join(
        f"s{i}" for i in range(60)) + ")"
    retired = retire(str(marker), "rejected", {"reason": reason})
    comments = [line for line in Path(retired).read_text().splitlines() if line.startswith("# ")]
    assert len(comments) == 2 and "unknown supervisor" in comments[1] and comments[1].endswith("s59)'"), comments
