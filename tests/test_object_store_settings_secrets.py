"""A malformed ``objectStore`` entry is refused without echoing its value: the value of a
``secretAccessKey``/``sessionToken`` entry is a secret, and the refusal is printed (stderr,
the journal under systemd) before any scrubber has learnt it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import settings as settings_mod
from reconciler.errors import PermanentError

RECONCILER = str(Path(sys.executable).with_name("reconciler"))
SECRET = "wJalrXUtnFEMI-r31-not-real"


@pytest.mark.parametrize("how", [
    {"cli": {"object_store": (f"secretAccessKey:{SECRET}",)}},
    {"env": {"RECONCILER_OBJECT_STORE": f"accessKeyId=AKID;secretAccessKey {SECRET}"}},
    {"file": f"objectStore:\n  secretAccessKey: [{SECRET}]\n"},
    {"file": f"objectStore:\n  sessionToken: {{v: {SECRET}}}\n"},
    # a session token (base64: it may end with '=') typed with a space instead of the '='
    {"env": {"RECONCILER_OBJECT_STORE": f"sessionToken {SECRET}=="}},
])
def test_a_malformed_object_store_entry_is_refused_without_its_value(tmp_path, how):
    config = tmp_path / "c.yaml"
    config.write_text(how.get("file", ""))
    with pytest.raises(PermanentError) as err:
        settings_mod.load(how.get("cli"), config=str(config), env=how.get("env", {}))
    assert SECRET not in str(err.value)
    assert "objectStore" in str(err.value) or "object" in str(err.value).lower()


def test_the_command_line_prints_no_secret_of_a_malformed_entry(tmp_path):
    done = subprocess.run([RECONCILER, "--state-dir", str(tmp_path), "--object-store",
                           f"secretAccessKey:{SECRET}", "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert SECRET not in done.stderr + done.stdout and "key=value" in done.stderr
