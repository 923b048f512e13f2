#!/usr/bin/env bash
# Set the machine up (idempotent), then run the test suite: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh --with-test-services

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
