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


UNREACHABLE = ["--segments", "s3://bkt/wh", "--object-store", "accessKeyId=AKID", "--object-store",
               f"secretAccessKey={SECRET}"]


@pytest.mark.parametrize("how", [["--object-store", f"endpoint=http://minio:{SECRET}@127.0.0.1:1"], []])
def test_an_endpoint_with_credentials_is_refused_without_the_password(tmp_path, how):
    """Issue 41.8: credentials in the endpoint URL were accepted, then shown in full in the
    unreachable-store error of ``status`` and the page."""
    env = {"PATH": "/usr/bin:/bin"} if how else {"PATH": "/usr/bin:/bin",
                                                 "AWS_ENDPOINT_URL": f"http://minio:{SECRET}@127.0.0.1:1"}
    done = subprocess.run([RECONCILER, "--state-dir", str(tmp_path), *UNREACHABLE, *how, "status"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "objectStore.endpoint" in done.stderr and "credentials (user:password@), which are refused" in done.stderr
    assert SECRET not in done.stdout + done.stderr and "minio:" not in done.stderr


@pytest.mark.integration  # CLI processes that wait out an unreachable store
@pytest.mark.parametrize("output", ["text", "json"])
def test_maintain_dry_run_against_an_unreachable_store_is_one_clear_line(tmp_path, output):
    """Issue 41.8: ``maintain --dry-run`` printed a raw traceback."""
    base = [RECONCILER, "--state-dir", str(tmp_path), *UNREACHABLE, "--object-store", "endpoint=http://127.0.0.1:1"]
    env = {"PATH": "/usr/bin:/bin"}
    subprocess.run([*base, "db", "upgrade"], capture_output=True, text=True, timeout=60, env=env, check=True)
    done = subprocess.run([*base, "maintain", "--dry-run", "-o", output], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 1
    shown = done.stdout + done.stderr
    assert "Traceback" not in shown and SECRET not in shown
    assert "the warehouse's object store http://127.0.0.1:1 failed: NETWORK_CONNECTION" in shown
    if output == "text":
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    else:
        assert '"ok": false' in done.stdout
