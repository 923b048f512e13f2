"""The quick start's --serve started the demo over in silence (issue 46, a third newcomer):
`scripts/quickstart.sh --serve` after a first run wiped .demo (its database, tables, audit
history) and neither --help nor its output said so. Every run starts over (the Tansu broker
keeps its events in memory only); now the help and the run say so, and a run refuses while a
--serve of the same directory still runs rather than pulling its database from under it."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("quickstart_demo_start_over", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_help_says_serve_starts_over():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    text = " ".join(out.split())
    assert "Every run starts over, --serve too: it removes the earlier run's .demo" in text
    assert "history" in text and "in memory only" in text


def test_a_run_after_an_earlier_one_says_what_it_removed(demo, tmp_path):
    workdir = tmp_path / ".demo"
    assert demo.start_over(workdir) is None  # the first run: nothing to say
    assert sorted(p.name for p in workdir.iterdir()) == ["specs"]
    (workdir / "state").mkdir()
    (workdir / "state" / "reconciler.db").write_bytes(b"the earlier run's history")
    said = demo.start_over(workdir)
    assert said is not None and said.startswith(f"== starting over in {workdir}: ")
    assert "database, tables and history are gone" in said and "--serve too" in said
    assert sorted(p.name for p in workdir.iterdir()) == ["specs"]


def test_a_run_refuses_while_a_serve_of_the_same_directory_runs(demo, tmp_path):
    workdir = tmp_path / ".demo"
    (workdir / "state").mkdir(parents=True)
    (workdir / "state" / "reconciler.db").write_bytes(b"in use")
    with socket.create_server(("127.0.0.1", 0)) as listening:  # where the serving demo's broker listens
        (workdir / "bootstrap").write_text(f"127.0.0.1:{listening.getsockname()[1]}")
        with pytest.raises(SystemExit, match=r"a demo is serving from .*: stop it with Ctrl-C first"):
            demo.start_over(workdir)
        assert (workdir / "state" / "reconciler.db").read_bytes() == b"in use"
    assert demo.start_over(workdir) is not None  # its broker gone: a stale bootstrap file is no reason to refuse
