"""The import layers of ``pyproject.toml`` ([tool.importlinter]) hold: no arrow runs back up,
and ``plan`` imports nothing that does I/O. Runs the virtualenv's ``lint-imports``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    command = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is missing: install the test extra (pip install -e '.[test]')"
    done = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"import contracts broken:\n{done.stdout}\n{done.stderr}"
