"""A release is a git tag and a wheel built from it (``python -m build``).

Each test copies the files git knows of (committed or not, ignored ones left out) into a
fresh repository, so what is checked is this work tree as a clone would build it. The
builds run without an isolated environment (the test extras hold the build requirements),
as ``python -m build --no-isolation``: the same backend, no index needed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def copy_work_tree(dest: Path) -> Path:
    """This work tree's files (what a clone of it would hold) in a new repository at
    ``dest`` with one commit: a build there leaves the work tree as it was (no egg-info,
    no build/ whose version would shadow the installed one)."""
    names = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        else:
            shutil.copy2(src, target)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "a release")
    return dest


@pytest.fixture
def tree(tmp_path) -> Path:
    return copy_work_tree(tmp_path / "src")


def build(tree: Path, *kinds: str) -> list[Path]:
    out = tree / "dist"
    r = subprocess.run([sys.executable, "-m", "build", *kinds, "--no-isolation", "-o", str(out), str(tree)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return sorted(out.iterdir())


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return z.read(name).decode()


@pytest.mark.integration  # git, build and release.sh processes
def test_a_tag_is_the_version_of_the_wheel_and_the_sdist(tree):
    _git(tree, "tag", "v9.8.7")
    wheel, sdist = build(tree)  # sorted by name
    assert (sdist.name, wheel.name) == ("stream_reconciler-9.8.7.tar.gz", "stream_reconciler-9.8.7-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    # what the package reads at run time, beside its modules
    for needed in ("reconciler/schemas/supervisor.schema.json", "reconciler/schemas/marker.schema.json",
                   "reconciler/store/migrations/env.py", "reconciler/store/migrations/script.py.mako",
                   "reconciler/store/migrations/versions/0001_initial.py", "reconciler/cli/__init__.py",
                   "stream_reconciler-9.8.7.dist-info/entry_points.txt"):
        assert needed in names, needed
    # test machinery stays out of what pip install ships
    assert not [n for n in names if n.startswith(("tests/", "devservices/", "benchmarks/", "scripts/"))]
    meta = _metadata(wheel)
    assert "\nVersion: 9.8.7\n" in meta
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    extras_only = [r for r in requires if "calfkit" in r or "pytest" in r or "pika" in r]
    assert extras_only and all("extra ==" in r for r in extras_only), extras_only


@pytest.mark.integration  # git, build and release.sh processes
def test_commits_after_a_tag_and_a_clone_without_tags_get_dev_versions(tree):
    _git(tree, "tag", "v9.8.7")
    (tree / "CHANGELOG.md").write_text((tree / "CHANGELOG.md").read_text() + "\n")
    _git(tree, "commit", "-q", "-am", "after the release")
    [wheel] = build(tree, "--wheel")
    assert re.fullmatch(r"stream_reconciler-9\.8\.8\.dev1\+g[0-9a-f]+-py3-none-any\.whl", wheel.name), wheel.name
    shutil.rmtree(tree / "dist")
    _git(tree, "tag", "-d", "v9.8.7")
    [wheel] = build(tree, "--wheel")  # no tag at all: counted from the fallback, 0.1.0
    assert re.fullmatch(r"stream_reconciler-0\.1\.1\.dev2\+g[0-9a-f]+-py3-none-any\.whl", wheel.name), wheel.name


@pytest.mark.integration  # git, build and release.sh processes
def test_a_tree_without_git_metadata_builds_the_fallback_version(tree):
    shutil.rmtree(tree / ".git")
    [wheel] = build(tree, "--wheel")
    assert wheel.name == "stream_reconciler-0.1.0-py3-none-any.whl"


@pytest.mark.integration  # git, build and release.sh processes
def test_release_sh_refuses_what_is_not_a_release_and_tags_what_is(tree):
    """Issue 46: the docs named v0.2.0, which no tag held. A release is made by one documented
    command, which refuses a version the changelog does not describe, a dirty tree and a tag
    that exists, and then tags and builds."""
    release = lambda *a: subprocess.run(["bash", "scripts/release.sh", *a], cwd=tree, capture_output=True,  # noqa: E731
                                        text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                         "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"})
    r = release("1.2")
    assert r.returncode == 1 and "usage: scripts/release.sh X.Y.Z" in r.stderr
    r = release("9.8.7")
    assert r.returncode == 1 and "CHANGELOG.md has no section '## 9.8.7" in r.stderr
    changelog = tree / "CHANGELOG.md"
    text = changelog.read_text()
    assert "## Unreleased" in text
    changelog.write_text(text.replace("## Unreleased", "## 9.8.7 (unreleased)", 1))
    _git(tree, "commit", "-q", "-am", "changelog")
    r = release("9.8.7")
    assert r.returncode == 1 and "still calls 9.8.7 unreleased" in r.stderr
    changelog.write_text(text.replace("## Unreleased", "## 9.8.7 (2026-11-28)", 1))
    r = release("9.8.7")
    assert r.returncode == 1 and "uncommitted changes" in r.stderr
    _git(tree, "commit", "-q", "-am", "changelog")
    r = release("9.8.7")
    assert r.returncode == 0, r.stderr
    assert _git(tree, "tag", "-l").split() == ["v9.8.7"]
    assert _git(tree, "cat-file", "-t", "v9.8.7").strip() == "tag"  # annotated
    assert (tree / "dist" / "stream_reconciler-9.8.7-py3-none-any.whl").is_file()
    r = release("9.8.7")
    assert r.returncode == 1 and "v9.8.7 exists already" in r.stderr


def test_no_document_names_a_release_tag_that_does_not_exist():
    """A tag named as what to check out or pin must exist in this repository; the release
    command's own example (scripts/release.sh 0.2.0) is not such a name."""
    tags = set(_git(ROOT, "tag", "-l").split())
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md",
            *sorted((ROOT / "examples").rglob("*.y*ml"))]
    named = set()
    for doc in docs:
        for line in doc.read_text().splitlines():
            if "release.sh" in line or "git push origin" in line or "git tag v0.2.0 &&" in line:
                continue
            named |= set(re.findall(r"(?:checkout|rev:|@)\s*(v\d+\.\d+\.\d+)\b", line))
    assert named <= tags, f"documents pin {sorted(named - tags)}, which no tag holds"
