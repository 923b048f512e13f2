"""The quick start as a fourth newcomer ran it (issue 46 item 5): `--serve` printed the
catch-up run's status, ending "leader: none: no daemon is running", one line above "the
daemon is running"; and a second `--serve` was refused with a hint to "give this run another
--workdir", an option neither `quickstart.sh --help` nor demo.py's help named."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("quickstart_demo_newcomer4", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("serve, shown", [
    pytest.param(True, False, id="serve: the daemon starts next, its page has the status"),
    pytest.param(False, True, id="a run that ends: the status as the catch-up left it"),
])
def test_serve_does_not_print_a_status_of_no_daemon_before_starting_one(demo, monkeypatch, capsys, tmp_path,
                                                                        serve, shown):
    calls = []
    monkeypatch.setattr(demo, "reconciler", lambda workdir, *args, **kw: calls.append(args) or 0)
    demo.catch_up_status(tmp_path, serve=serve)
    assert (("status",) in calls) == shown
    assert ("== reconciler status" in capsys.readouterr().out) == shown


def _help_options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))


def test_the_refusal_names_only_options_the_help_lists(demo, tmp_path):
    workdir = tmp_path / ".demo"
    workdir.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as listening:  # the serving demo's broker
        (workdir / "bootstrap").write_text(f"127.0.0.1:{listening.getsockname()[1]}")
        with pytest.raises(SystemExit) as refused:
            demo.start_over(workdir)
    hint = str(refused.value.code)
    named = _help_options(hint)
    assert named, hint
    quickstart = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh"), "--help"], capture_output=True,
                                text=True, check=True).stdout
    demo_help = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert named <= _help_options(quickstart), (hint, quickstart)
    assert named <= _help_options(demo_help), (hint, demo_help)
    # and each is explained there, not only named in passing
    for option in named:
        assert re.search(rf"^\s+{option} \S+\s+\S", quickstart, re.M), (option, quickstart)
