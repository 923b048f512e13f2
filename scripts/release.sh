#!/usr/bin/env bash
# Cut a release: scripts/release.sh X.Y.Z
#   1. CHANGELOG.md must have a section "## X.Y.Z (YYYY-MM-DD)" (rename "## Unreleased" and
#      commit it first): a tag whose changes nobody wrote down is not a release;
#   2. the work tree must be clean (the tag names a commit, not what lies around it);
#   3. tags the commit vX.Y.Z (annotated) and builds dist/stream_reconciler-X.Y.Z-*.whl and
#      the sdist from it (the version comes from the tag: setuptools-scm).
# Publishing is yours: git push origin vX.Y.Z, and the wheel wherever your hosts install from.
set -euo pipefail
die() { echo "release: $*" >&2; exit 1; }

version=${1:-}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "usage: scripts/release.sh X.Y.Z (three numbers, e.g. 0.2.0)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ -z "$(git status --porcelain --untracked-files=no)" ] || die "the work tree has uncommitted changes: commit or stash them first"
git rev-parse -q --verify "refs/tags/v$version" >/dev/null && die "v$version exists already ($(git rev-list -n 1 "v$version" | cut -c1-12))"
heading=$(grep -E "^## ${version//./\\.}( |$)" CHANGELOG.md || true)
[ -n "$heading" ] || die "CHANGELOG.md has no section '## $version (YYYY-MM-DD)': rename '## Unreleased' to it, say what an operator notices, commit, and run this again"
case "$heading" in
    *[Uu]nreleased*) die "CHANGELOG.md still calls $version unreleased ('$heading'): give it its date and commit" ;;
esac

git tag -a "v$version" -m "stream-reconciler $version"
PY=${PYTHON:-.venv/bin/python}
if "$PY" -c 'import build' >/dev/null 2>&1; then
    "$PY" -m build --no-isolation -o dist . >/dev/null
    echo "release: tagged v$version and built dist/stream_reconciler-$version-py3-none-any.whl and its sdist"
else
    echo "release: tagged v$version (no 'build' module in $PY: build with python -m build)"
fi
echo "release: publish it with: git push origin v$version"
