#!/usr/bin/env bash
# Install stream-reconciler as a systemd service on a Debian host (12 or newer), upgrade it
# in place, or remove it. Run as root from a checkout of the release to install:
#
#   sudo scripts/install.sh                        install, or upgrade what is installed
#   sudo scripts/install.sh --from dist/stream_reconciler-X.Y.Z-py3-none-any.whl
#   sudo scripts/install.sh --uninstall [--purge]
#
# What it makes (each path below DIR with --root DIR):
#   user and group stream-reconciler   system user, home /var/lib/stream-reconciler, no login shell
#   /opt/stream-reconciler             a virtualenv with the package alone (no test or demo
#                                      extras); its docs in share/doc/stream-reconciler/, and
#                                      Spark's class archive, built as the service user, in
#                                      share/stream-reconciler/
#   /etc/stream-reconciler/config.yaml root:stream-reconciler 0640, from examples/etc/config.yaml;
#                                      an existing one is kept
#   /etc/stream-reconciler/credentials root 0700: sources of the unit's LoadCredential= lines
#   /srv/stream-reconciler/specs       the watched directory, stream-reconciler:stream-reconciler
#                                      2775: the daemon refuses specs that a user other than
#                                      its own or a group other than its own could write
#   /var/lib/stream-reconciler         the state directory (database, tables), 0750
#   /etc/systemd/system/stream-reconciler.service   enabled; started (an upgrade restarts it)
#   /etc/systemd/system/stream-reconciler-pull.{service,timer}   with --pull-every: the config
#                                      repo's checkout pulled (fast-forward only) as the service
#                                      user, which then owns the checkout
#   /usr/local/bin/reconciler          the command line, run as the service user (the database
#                                      is that user's; a command run as root would leave
#                                      root-owned files in the state directory)
#   /var/log/stream-reconciler-install.log   the last run's steps' own output (pip, apt-get,
#                                      the JVM building the archive); one line per step is shown
#
# Upgrading: run it again from the newer checkout (or with the newer wheel). The virtualenv
# is updated in place, the configuration, the state and the specs are kept, the unit is
# replaced and the daemon restarted if it ran (it migrates the database as it starts).
# Uninstalling: --uninstall stops and removes the service, the command and the virtualenv,
# and keeps the configuration, the state, the specs and the user; --purge removes those
# too, except a spec directory that is not empty (it is your config repo's checkout).
set -euo pipefail
umask 022  # what it installs is read by the service user; a root umask of 077 would hide it

usage() {
    cat >&2 <<'EOF'
usage: scripts/install.sh [--from WHEEL|DIR] [--specs DIR] [--segments DIR] [--root DIR]
                          [--operator USER]... [--pull-every INTERVAL] [--no-user]
                          [--no-systemctl] [--no-start] [--no-spark-archive]
       scripts/install.sh --uninstall [--purge] [--root DIR] [--no-systemctl]
  --from WHEEL|DIR    what to install: a wheel, or a source checkout (default: this script's checkout)
  --specs DIR         the watched directory (default /srv/stream-reconciler/specs)
  --segments DIR      the tables' warehouse (default <state directory>/segments)
  --operator USER     let USER operate the service: membership of the group stream-reconciler
                      (to write specs and markers; effective at USER's next login) and a sudoers
                      drop-in (checked by visudo -c) to run `reconciler` as the service user
                      without a password; repeat for several users. Root needs neither.
  --pull-every INTERVAL  pull the git checkout that holds --specs every INTERVAL (a systemd
                      time span: 30s, 1min, 1h), `git pull --ff-only` as the service user, by
                      the timer stream-reconciler-pull.timer; the checkout becomes the service
                      user's. Changes then arrive by a push to the config repo.
  --root DIR          install below DIR as if it were / (tests): useradd/userdel --prefix DIR
                      (a DIR without etc/passwd gets this host's passwd and group, and empty
                      shadow files), systemctl --root DIR, nothing started; the virtualenv runs in place there;
                      the paths it prints are the staged ones (DIR/etc/...), the files name /etc/...
  --no-user           do not create the user (it must exist)
  --no-systemctl      neither enable, start, restart nor reload anything
  --no-start          enable the unit but do not start or restart it
  --no-spark-archive  do not build Spark's class archive (Spark then starts ~2.5 s slower)
  --uninstall         remove the service, the command and the virtualenv; keep the rest
  --purge             with --uninstall: also the configuration, the state, the user and an
                      empty spec directory
EOF
}

SERVICE=stream-reconciler
SERVICE_USER=stream-reconciler
PREFIX=/opt/stream-reconciler
CONF_DIR=/etc/stream-reconciler
STATE=/var/lib/stream-reconciler
DEFAULT_SPECS=/srv/stream-reconciler/specs
UNIT_DIR=/etc/systemd/system
WRAPPER=/usr/local/bin/reconciler
INSTALL_LOG=/var/log/stream-reconciler-install.log
SUDOERS=/etc/sudoers.d/stream-reconciler
PULL_UNIT=stream-reconciler-pull
SERVICE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # systemd's, so the archive finds the daemon's java
# The system's Python, not the first on PATH: the virtualenv links to it, and one in root's
# home (pyenv) is out of the service user's reach.
PYTHON=${PYTHON:-/usr/bin/python3}

CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

FROM=$CHECKOUT
SPECS=$DEFAULT_SPECS
SEGMENTS=
ROOT=
OPERATORS=()
PULL_EVERY=
SPECS_GIVEN=0
NO_USER=0 NO_SYSTEMCTL=0 NO_START=0 NO_ARCHIVE=0 UNINSTALL=0 PURGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --from) FROM=${2:?--from needs a path}; shift ;;
        --specs) SPECS=${2:?--specs needs a directory}; SPECS_GIVEN=1; shift ;;
        --segments) SEGMENTS=${2:?--segments needs a directory}; shift ;;
        --root) ROOT=${2:?--root needs a directory}; shift ;;
        --operator) OPERATORS+=("${2:?--operator needs a user name}"); shift ;;
        --pull-every) PULL_EVERY=${2:?--pull-every needs an interval, e.g. 1min}; shift ;;
        --no-user) NO_USER=1 ;;
        --no-systemctl) NO_SYSTEMCTL=1 ;;
        --no-start) NO_START=1 ;;
        --no-spark-archive) NO_ARCHIVE=1 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage; exit 2 ;;
    esac
    shift
done

say() { echo "install: $*"; }
die() { echo "install: $*" >&2; exit 1; }

# paths given relative to where it was started, before it moves to its checkout
FROM=$(realpath -m -- "$FROM")
[ -z "$ROOT" ] || ROOT=$(realpath -m -- "$ROOT")
cd "$CHECKOUT"

# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=scripts/lib/configrepo.sh
source scripts/lib/configrepo.sh

if [ -n "$ROOT" ]; then
    [ -d "$ROOT" ] || die "--root $ROOT: no such directory"
    ROOT=$(cd "$ROOT" && pwd)
    [ "$ROOT" != / ] || ROOT=
    NO_START=1
fi
IS_ROOT=0
[ "$(id -u)" -eq 0 ] && IS_ROOT=1
if [ "$IS_ROOT" -eq 0 ] && [ -z "$ROOT" ]; then
    die "run as root (sudo scripts/install.sh), or stage below a directory with --root DIR"
fi
# Below a staging root, every path printed is the staged one ($ROOT/etc/...), the one to look
# at now; what the files themselves say (config, unit, wrapper) is the installed host's path.
if [ -n "$ROOT" ]; then
    say "staging below $ROOT: the paths printed are the staged files; the config, unit and wrapper name the installed host's (without $ROOT)"
fi
for path in "$SPECS" ${SEGMENTS:+"$SEGMENTS"}; do
    case "$path" in
        /*) ;;
        *) die "$path: give an absolute path" ;;
    esac
    case "$path" in
        *[!A-Za-z0-9/._-]*) die "$path: use letters, digits and / . _ - only (the path goes into the unit)" ;;
    esac
done
[ "$PURGE" -eq 0 ] || [ "$UNINSTALL" -eq 1 ] || die "--purge goes with --uninstall"
if [ -n "$PULL_EVERY" ] && ! [[ "$PULL_EVERY" =~ ^[1-9][0-9]*(s|sec|min|m|h)$ ]]; then
    die "--pull-every $PULL_EVERY: give a number and a unit: 30s, 1min, 1h"
fi
for op in ${OPERATORS[@]+"${OPERATORS[@]}"}; do
    case "$op" in
        root) die "--operator root: root runs \`reconciler\` as the service user already (through runuser); name the operators' own users" ;;
        "$SERVICE_USER") die "--operator $op: that is the service user itself" ;;
        [a-z_]*) [[ "$op" =~ ^[a-z_][a-z0-9_-]*[$]?$ ]] || die "--operator $op: not a user name" ;;
        *) die "--operator $op: not a user name" ;;
    esac
done
if [ "$UNINSTALL" -eq 0 ] && [ ! -d "$FROM" ] && { [ ! -f "$FROM" ] || [[ "$FROM" != *.whl ]]; }; then
    die "--from $FROM: not a wheel (.whl) nor a source directory"
fi

VENV=$ROOT$PREFIX
UNIT=$ROOT$UNIT_DIR/$SERVICE.service
DROPIN=$ROOT$UNIT_DIR/$SERVICE.service.d/install.conf

# systemd runs here (not a container without it, not a staging root): then start, restart, reload.
systemd_running() { [ -z "$ROOT" ] && [ -d /run/systemd/system ] && [ "$NO_SYSTEMCTL" -eq 0 ]; }

# --------------------------------------------------------------- the user, by number
lookup() {  # lookup passwd|group NAME -> the entry, from DIR/etc with --root
    if [ -n "$ROOT" ]; then
        [ -f "$ROOT/etc/$1" ] || return 1
        awk -F: -v n="$2" '$1 == n { print; found = 1 } END { exit !found }' "$ROOT/etc/$1"
    else
        getent "$1" "$2"
    fi
}
service_ids() {  # sets SVC_UID and SVC_GID; 1 when the user does not exist (yet)
    local entry
    entry=$(lookup passwd "$SERVICE_USER") || return 1
    SVC_UID=$(echo "$entry" | cut -d: -f3)
    SVC_GID=$(echo "$entry" | cut -d: -f4)
}
# own OWNER_SPEC PATH...: chown when we can (root); a staging run as another user cannot
own() {
    if [ "$IS_ROOT" -eq 1 ]; then
        chown "$@"
    fi
}
# as_service CMD...: run as the service user, with the environment systemd gives the daemon
# (and from /: the checkout here is no business of the service's)
as_service() {
    env -i -C / PATH="$SERVICE_PATH" HOME="$ROOT$STATE" LANG=C.UTF-8 \
        setpriv --reuid="$SVC_UID" --regid="$SVC_GID" --clear-groups -- "$@"
}
# vpython ARGS...: the virtualenv's Python, isolated: from this checkout, `python -c` and
# `-m` would otherwise import its reconciler/ and read its egg-info's version
vpython() { "$VENV/bin/python" -I "$@"; }
# Spark's JVM asks the system's user database for its user's name and home, and fails on a
# user that only DIR/etc/passwd holds: below --root the archive is built only when the host
# knows the same user.
host_knows_service_user() {
    [ -z "$ROOT" ] || [ "$(getent passwd "$SERVICE_USER" | cut -d: -f3)" = "$SVC_UID" ]
}

# useradd and usermod --prefix DIR work on DIR/etc's user database and fail without one, as
# on a fresh staging root: seed it with this host's users (passwd and group hold no secret)
# and empty shadow files (the host's password hashes stay on the host).
seed_user_database() {
    [ -f "$ROOT/etc/passwd" ] && [ -f "$ROOT/etc/group" ] && return 0
    install -d -m 0755 "$ROOT/etc"
    local f
    for f in passwd group; do [ -f "$ROOT/etc/$f" ] || install -m 0644 "/etc/$f" "$ROOT/etc/$f"; done
    for f in shadow gshadow; do [ -f "$ROOT/etc/$f" ] || install -m 0600 /dev/null "$ROOT/etc/$f"; done
    say "seeded $ROOT/etc/passwd and group with this host's users, and empty shadow files: useradd and usermod --prefix $ROOT need them"
}
if [ "$UNINSTALL" -eq 0 ] && [ -n "$ROOT" ] && [ "$IS_ROOT" -eq 1 ] && { [ "$NO_USER" -eq 0 ] || [ ${#OPERATORS[@]} -gt 0 ]; }; then
    seed_user_database
fi
[ ${#OPERATORS[@]} -eq 0 ] || [ "$IS_ROOT" -eq 1 ] || die "--operator needs root: it changes the group's members and writes a sudoers rule"
for op in ${OPERATORS[@]+"${OPERATORS[@]}"}; do  # before anything is installed
    lookup passwd "$op" >/dev/null || die "--operator $op: no such user${ROOT:+ in $ROOT/etc/passwd}; create it first (useradd ${ROOT:+--prefix $ROOT }--create-home $op), then run this again"
done
# An upgrade keeps the config file: its specs is the watched directory. A different --specs
# would reach the unit's drop-in but not the config (the daemon would watch one directory
# and be allowed to write another): refuse it, before anything is installed.
kept_specs=$(awk '/^specs:/ { print $2 }' "$ROOT$CONF_DIR/config.yaml" 2>/dev/null || true)
if [ "$UNINSTALL" -eq 0 ] && [ -n "$kept_specs" ]; then
    if [ "$SPECS_GIVEN" -eq 1 ] && [ "$kept_specs" != "$SPECS" ]; then
        die "--specs $SPECS: the kept $ROOT$CONF_DIR/config.yaml watches $kept_specs${ROOT:+ (staged: $ROOT$kept_specs)}; edit its specs: line to change it (then run this again), or leave --specs out"
    fi
    SPECS=$kept_specs
fi
# --pull-every: the git checkout that holds the watched directory (it or a folder above it)
REPO=
if [ "$UNINSTALL" -eq 0 ] && [ -n "$PULL_EVERY" ]; then
    REPO=$(checkout_of "$SPECS") || die "--pull-every: $ROOT$SPECS is in no git checkout; clone the config repo first (git clone URL $(dirname "$ROOT$SPECS")), then run this again"
fi

# disown_kept DIR: a spec directory kept by --purge outlives the user and the group: what
# they owned (the directory, a pulled checkout, renamed markers) becomes root's, and the
# directory loses its group write and setgid bits, which would now serve a number no group has.
disown_kept() {
    [ "$IS_ROOT" -eq 1 ] && service_ids || return 0
    local top=$1
    while [ "$top" != "$ROOT" ] && [ "$top" != / ] && [ ! -e "$top/.git" ]; do top=$(dirname "$top"); done
    [ -e "$top/.git" ] || top=$1
    find "$top" \( -uid "$SVC_UID" -o -gid "$SVC_GID" \) -exec chown -h 0:0 {} +
    chmod g-ws "$1"
    say "$1 (and what $SERVICE_USER owned in ${top}) is now root:root, mode $(stat -c %a "$1"): the user and group $SERVICE_USER go now"
}

# =============================================================== uninstall
if [ "$UNINSTALL" -eq 1 ]; then
    if systemd_running; then
        systemctl disable --now "$SERVICE.service" 2>/dev/null || true
        systemctl disable --now "$PULL_UNIT.timer" 2>/dev/null || true
    elif [ "$NO_SYSTEMCTL" -eq 0 ] && [ -f "$UNIT" ]; then
        systemctl --root="${ROOT:-/}" disable "$SERVICE.service" >/dev/null 2>&1 || true
        systemctl --root="${ROOT:-/}" disable "$PULL_UNIT.timer" >/dev/null 2>&1 || true
    fi
    if [ -f "$ROOT$UNIT_DIR/$PULL_UNIT.timer" ]; then
        rm -f "$ROOT$UNIT_DIR/$PULL_UNIT.timer" "$ROOT$UNIT_DIR/$PULL_UNIT.service"
        say "removed the config repo's pull timer $ROOT$UNIT_DIR/$PULL_UNIT.timer (the checkout stays)"
    fi
    if [ -f "$ROOT$SUDOERS" ]; then  # the operators' rule names the command removed here
        rm -f "$ROOT$SUDOERS"
        kept_members=" (their membership of the group $SERVICE_USER stays until --purge)"
        [ "$PURGE" -eq 0 ] || kept_members=  # the purge deletes the group below
        say "removed the operators' sudoers rule $ROOT$SUDOERS$kept_members"
    fi
    # Without systemctl (--no-systemctl) nothing disabled the units: their enable links stay
    # and would dangle, naming units that are gone.
    for link in "$ROOT$UNIT_DIR"/*.wants/"$SERVICE.service" "$ROOT$UNIT_DIR"/*.wants/"$PULL_UNIT.timer"; do
        if [ -L "$link" ]; then
            rm -f "$link"
            say "removed the link $link"
        fi
    done
    rm -f "$UNIT" "$ROOT$WRAPPER"
    rm -rf "$ROOT$UNIT_DIR/$SERVICE.service.d" "$VENV"
    if systemd_running; then
        systemctl daemon-reload
    fi
    say "removed the unit $UNIT, $ROOT$WRAPPER and $VENV"
    if [ "$PURGE" -eq 0 ]; then
        say "kept $ROOT$CONF_DIR, $ROOT$STATE, the spec directory and the user $SERVICE_USER (--purge removes them)"
        exit 0
    fi
    specs=$(awk '/^specs:/ { print $2 }' "$ROOT$CONF_DIR/config.yaml" 2>/dev/null || true)
    rm -rf "$ROOT$CONF_DIR" "$ROOT$STATE"
    rm -f "$ROOT$INSTALL_LOG"
    for dir in "${specs:-$DEFAULT_SPECS}" "$(dirname "$DEFAULT_SPECS")"; do
        if [ -d "$ROOT$dir" ]; then
            if rmdir "$ROOT$dir" 2>/dev/null; then
                say "removed the empty $ROOT$dir"
            else
                say "kept $ROOT$dir: it is not empty (your config repo's checkout?)"
                disown_kept "$ROOT$dir"
            fi
        fi
    done
    if [ "$NO_USER" -eq 0 ] && service_ids; then
        userdel ${ROOT:+--prefix "$ROOT"} "$SERVICE_USER"
        if lookup group "$SERVICE_USER" >/dev/null; then
            groupdel ${ROOT:+--prefix "$ROOT"} "$SERVICE_USER"
        fi
        say "removed the user $SERVICE_USER"
    fi
    say "purged $ROOT$CONF_DIR and $ROOT$STATE"
    exit 0
fi

# =============================================================== install or upgrade
step_log_start "$ROOT$INSTALL_LOG" "$@"
UPGRADE=0
[ -x "$VENV/bin/reconciler" ] && UPGRADE=1

# --------------------------------------------------------------- what the host needs
if [ ! -x "$PYTHON" ]; then
    [ -z "$ROOT" ] || die "no $PYTHON here: install python3 first (or set PYTHON)"
    apt_install python3
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    die "$PYTHON is older than 3.11 (Debian 12 has 3.11): set PYTHON to a newer one"
fi
if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    [ -z "$ROOT" ] || die "$PYTHON has no venv module here: install python3-venv first"
    ver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install "python${ver}-venv" || apt_install python3-venv
fi
jm=$(java_major)
if [ "${jm:-0}" -lt 17 ] 2>/dev/null; then
    if [ -n "$ROOT" ]; then
        say "no Java 17 here: Spark needs it on the host the daemon runs on"
    else
        mkdir -p /usr/share/man/man1  # openjdk's postinst fails on slim images without it
        apt_install openjdk-17-jre-headless
    fi
fi

# --------------------------------------------------------------- the user
if ! service_ids; then
    if [ "$NO_USER" -eq 1 ]; then
        [ -n "$ROOT" ] || die "the user $SERVICE_USER does not exist (drop --no-user to create it)"
        say "no user $SERVICE_USER below $ROOT (--no-user): files stay root's"
    elif [ "$IS_ROOT" -eq 0 ]; then
        say "not root: the user $SERVICE_USER is not created and files stay yours"
    else
        useradd ${ROOT:+--prefix "$ROOT"} --system --user-group --home-dir "$STATE" --no-create-home \
            --shell /usr/sbin/nologin --comment "stream-reconciler daemon" "$SERVICE_USER"
        say "created the system user $SERVICE_USER"
    fi
fi
HAVE_USER=0
if service_ids; then
    HAVE_USER=1
else
    SVC_UID=0 SVC_GID=0
fi

# --------------------------------------------------------------- the virtualenv
if [ -x "$VENV/bin/python" ] && ! vpython -c 'import sys' >/dev/null 2>&1; then
    say "the virtualenv's Python is gone (a Python upgrade?): building it again"
    rm -rf "$VENV"
    UPGRADE=0
fi
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    step "creating the virtualenv $VENV" "$PYTHON" -m venv "$VENV"
fi
old_version=$(vpython -c 'from importlib.metadata import version; print(version("stream-reconciler"))' \
    2>/dev/null || true)
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
if [ -d "$FROM" ]; then
    # pip builds in the checkout: leave it as it was (an egg-info there would shadow the
    # version of a development virtualenv run from it)
    leftovers=()
    for made in build stream_reconciler.egg-info; do
        [ -e "$FROM/$made" ] || leftovers+=("$FROM/$made")
    done
    step "building the wheel of $FROM" vpython -m pip wheel --disable-pip-version-check --no-deps -w "$BUILD" "$FROM"
    rm -rf "${leftovers[@]}"
    WHEEL=$(ls "$BUILD"/stream_reconciler-*.whl)
else
    WHEEL=$FROM
fi
# The dependencies first, then the package itself again: pip keeps an installed
# package of the same version as it is, which an in-place upgrade must not.
install_wheel() {
    vpython -m pip install --disable-pip-version-check "$WHEEL" \
        && vpython -m pip install --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
}
step "installing $(basename "$WHEEL") (the package alone: no test or demo extras)" install_wheel
new_version=$(vpython -c 'from importlib.metadata import version; print(version("stream-reconciler"))')
if [ "$HAVE_USER" -eq 1 ] && [ "$IS_ROOT" -eq 1 ] && ! as_service "$VENV/bin/reconciler" --version >/dev/null; then
    die "$SERVICE_USER cannot run $VENV/bin/reconciler (does its Python, $(readlink -f "$VENV/bin/python"), lie in a directory only root may enter?)"
fi
DOC=$VENV/share/doc/stream-reconciler
rm -rf "$DOC"
mkdir -p "$DOC"
cp -r README.md RELIABILITY.md CHANGELOG.md docs examples "$DOC/"  # docs/: the pages the README links

# --------------------------------------------------------------- configuration and directories
install -d -m 0755 "$ROOT$CONF_DIR"
CONF=$ROOT$CONF_DIR/config.yaml
if [ -e "$CONF" ]; then
    say "kept $CONF (this version's example: $DOC/examples/etc/config.yaml)"
else
    sed -e "s|^specs: $DEFAULT_SPECS |specs: $SPECS |" \
        ${SEGMENTS:+-e "s|^# segments: [^ ]* |segments: $SEGMENTS |"} \
        examples/etc/config.yaml > "$BUILD/config.yaml"
    install -m 0640 "$BUILD/config.yaml" "$CONF"
    own "0:$SVC_GID" "$CONF"
    say "wrote $CONF"
fi
install -d -m 0700 "$ROOT$CONF_DIR/credentials"
own 0:0 "$ROOT$CONF_DIR/credentials"
install -d -m 0750 "$ROOT$STATE"
own "$SVC_UID:$SVC_GID" "$ROOT$STATE"
if [ "$SPECS" = "$DEFAULT_SPECS" ]; then
    install -d -m 0755 "$ROOT$(dirname "$SPECS")"
fi
if [ -d "$ROOT$SPECS" ]; then
    mode=$(stat -c %a "$ROOT$SPECS")
    if (( 8#$mode & 8#002 )); then
        say "warning: $ROOT$SPECS is writable by others (mode $mode): the daemon refuses it (chmod o-w $ROOT$SPECS)"
    fi
    # The daemon renames markers in it and operators write specs: its group's, group-writable,
    # setgid (what a new one gets). A checkout made by root before the install is not.
    if [ "$IS_ROOT" -eq 1 ] && [ "$HAVE_USER" -eq 1 ] && { [ "$(stat -c %g "$ROOT$SPECS")" != "$SVC_GID" ] || (( (8#$mode & 8#2070) != 8#2070 )); }; then
        chgrp "$SVC_GID" "$ROOT$SPECS"
        chmod g+rwxs "$ROOT$SPECS"
        say "made $ROOT$SPECS the group $SERVICE_USER's, group-writable and setgid (was $(stat -c %U "$ROOT$SPECS"):$mode): the daemon renames markers there, operators write specs"
    fi
else
    mkdir -p "$(dirname "$ROOT$SPECS")"
    install -d -m 2775 "$ROOT$SPECS"
    own "$SVC_UID:$SVC_GID" "$ROOT$SPECS"
    chmod 2775 "$ROOT$SPECS"  # chown clears the setgid bit
    say "created the spec directory $ROOT$SPECS (put your config repo's checkout there)"
fi
if [ -n "$SEGMENTS" ] && [ ! -d "$ROOT$SEGMENTS" ]; then
    mkdir -p "$(dirname "$ROOT$SEGMENTS")"
    install -d -m 0750 "$ROOT$SEGMENTS"
    own "$SVC_UID:$SVC_GID" "$ROOT$SEGMENTS"
fi

# --------------------------------------------------------------- Spark's class archive
# sparkcds names the archive after java, pyspark and the user (whose private SPARK_HOME its
# class path records): built as the service user, it is the one the daemon maps.
ARCHIVES=$VENV/share/stream-reconciler
if [ "$NO_ARCHIVE" -eq 1 ]; then
    say "no Spark class archive (--no-spark-archive)"
elif [ "$HAVE_USER" -eq 0 ] || [ "$IS_ROOT" -eq 0 ]; then
    say "no Spark class archive: it is built as the service user, which needs root and the user"
elif ! host_knows_service_user; then
    say "no Spark class archive: this host has no user $SERVICE_USER (only $ROOT/etc/passwd has);" \
        "on the installed host: runuser -u $SERVICE_USER -- $PREFIX/bin/python -m reconciler.pipeline.sparkcds"
elif [ "$(java_major)" -lt 17 ] 2>/dev/null; then
    say "no Spark class archive: no Java 17"
else
    install -d -m 0755 "$ARCHIVES"
    chown "$SVC_UID:$SVC_GID" "$ARCHIVES"
    have=$(as_service "$VENV/bin/python" -I -c \
        'from reconciler.pipeline.sparkcds import java_options as j, archive_path as a; print(a() if j() else "")')
    if [ -n "$have" ]; then
        say "Spark class archive found: $have"
    else
        if ! step "building Spark's class archive as $SERVICE_USER (30 s on a quiet 2-core machine, 90 s or more on a busy one)" \
                as_service "$VENV/bin/python" -I -m reconciler.pipeline.sparkcds; then
            say "no class archive (the daemon starts Spark without it, slower)"
        fi
        have=$(as_service "$VENV/bin/python" -I -c \
            'from reconciler.pipeline.sparkcds import java_options as j, archive_path as a; print(a() if j() else "")')
    fi
    # those of an older java, pyspark or user, and what a JVM that failed wrote as it exited
    for old in "$ARCHIVES"/spark-*.jsa "$ARCHIVES"/.spark-*.jsa-*; do
        if [ -e "$old" ] && [ "$old" != "$have" ]; then
            rm -f "$old"
        fi
    done
fi

# --------------------------------------------------------------- the command on PATH
mkdir -p "$(dirname "$ROOT$WRAPPER")"
cat > "$BUILD/reconciler" <<EOF
#!/bin/sh
# stream-reconciler's command line on a service host, run as the service user (written by
# scripts/install.sh): the database and the state directory are that user's, and a command
# run as root would leave root-owned files there. As root through runuser, as anyone else
# through sudo (who may need a sudoers rule for it: docs/operations.md, "Running as a service").
if [ "\$(id -un)" = $SERVICE_USER ]; then
    exec $PREFIX/bin/reconciler "\$@"
elif [ "\$(id -u)" -eq 0 ]; then
    exec runuser -u $SERVICE_USER -- $PREFIX/bin/reconciler "\$@"
else
    exec sudo -u $SERVICE_USER -- $PREFIX/bin/reconciler "\$@"
fi
EOF
install -m 0755 "$BUILD/reconciler" "$ROOT$WRAPPER"

# --------------------------------------------------------------- the operators
# An operator writes specs and markers (the group owns the watched directory, setgid) and runs
# `reconciler` as the service user through the wrapper's sudo: a rule for exactly that command.
if [ ${#OPERATORS[@]} -gt 0 ]; then
    if ! command -v visudo >/dev/null 2>&1; then
        apt_install sudo
    fi
    rule="$BUILD/sudoers"
    # the operators named before stay: an upgrade that names one more does not drop the others
    kept=$(awk -v u="ALL=($SERVICE_USER)" '$2 == u { print $1 }' "$ROOT$SUDOERS" 2>/dev/null || true)
    mapfile -t OPERATORS < <(printf '%s\n' ${kept:+$kept} "${OPERATORS[@]}" | awk 'NF && !seen[$0]++')
    {
        echo "# Written by scripts/install.sh --operator: these users run stream-reconciler's command"
        echo "# line as the service user (/usr/local/bin/reconciler does, through sudo), nothing else."
        for op in "${OPERATORS[@]}"; do
            echo "$op ALL=($SERVICE_USER) NOPASSWD: $PREFIX/bin/reconciler"
        done
    } > "$rule"
    visudo -c -q -f "$rule" >/dev/null || die "the sudoers rule for --operator did not pass visudo -c: $(visudo -c -f "$rule" 2>&1 | tail -n 1)"
    install -D -m 0440 "$rule" "$ROOT$SUDOERS"
    for op in "${OPERATORS[@]}"; do
        usermod ${ROOT:+--prefix "$ROOT"} -a -G "$SERVICE_USER" "$op"
        say "operator $op: in the group $SERVICE_USER (writes specs; from $op's next login on), runs \`reconciler\` as $SERVICE_USER through sudo ($ROOT$SUDOERS)"
    done
fi

# --------------------------------------------------------------- the unit
install -D -m 0644 systemd/$SERVICE.service "$UNIT"
if [ "$SPECS" != "$DEFAULT_SPECS" ] || [ -n "$SEGMENTS" ]; then
    mkdir -p "$(dirname "$DROPIN")"
    cat > "$DROPIN" <<EOF
# Written by scripts/install.sh: the directories the daemon writes besides its state directory
# (the unit's own list is replaced: ProtectSystem=strict leaves every other path read-only).
[Service]
ReadWritePaths=
ReadWritePaths=$STATE $SPECS${SEGMENTS:+ $SEGMENTS}
EOF
    chmod 0644 "$DROPIN"
else
    rm -rf "$(dirname "$DROPIN")"
fi

# --------------------------------------------------------------- the config repo's pull timer
# The daemon only reads the checkout; changes arrive by `git pull`, run as the service user so
# that what it writes stays the daemon's (the checkout is made the user's: root's .git would
# refuse it). Operators push to the config repo; a local edit would stop the fast-forward.
PULL_TIMER=
if [ -n "$REPO" ]; then
    if [ -z "$ROOT" ] && ! command -v git >/dev/null 2>&1; then
        apt_install git
    fi
    if [ "$IS_ROOT" -eq 1 ] && [ "$HAVE_USER" -eq 1 ]; then
        chown -R "$SVC_UID:$SVC_GID" "$ROOT$REPO"
        chmod g+rwxs "$ROOT$SPECS"  # chown clears the setgid bit
        say "made the checkout $ROOT$REPO $SERVICE_USER's: the pull timer runs git as that user"
    fi
    write_pull_units "$REPO"
    PULL_TIMER=$PULL_UNIT.timer
    say "the pull timer $ROOT$UNIT_DIR/$PULL_TIMER: git pull --ff-only in $ROOT$REPO as $SERVICE_USER every $PULL_EVERY (systemctl list-timers $PULL_TIMER; journalctl -u $PULL_UNIT)"
fi

if [ "$NO_SYSTEMCTL" -eq 1 ]; then
    say "unit installed, not enabled (--no-systemctl): systemctl enable --now $SERVICE${PULL_TIMER:+ $PULL_TIMER}"
elif systemd_running; then
    systemctl daemon-reload
    systemctl enable "$SERVICE.service" >/dev/null 2>&1
    [ -z "$PULL_TIMER" ] || systemctl enable --now "$PULL_TIMER" >/dev/null 2>&1
    if [ "$NO_START" -eq 1 ]; then
        say "unit installed and enabled, not started (--no-start)"
    elif [ "$UPGRADE" -eq 1 ]; then
        systemctl try-restart "$SERVICE.service"
        say "unit enabled; restarted if it was running"
    else
        systemctl start "$SERVICE.service"
        say "unit enabled and started: systemctl status $SERVICE; journalctl -u $SERVICE -f"
    fi
else
    systemctl --root="${ROOT:-/}" enable "$SERVICE.service" ${PULL_TIMER:+"$PULL_TIMER"} >/dev/null 2>&1
    say "unit installed and enabled; systemd does not run here, so nothing was started"
fi

if [ "$UPGRADE" -eq 1 ]; then
    say "upgraded stream-reconciler ${old_version:-?} -> $new_version"
else
    say "installed stream-reconciler $new_version"
fi
say_how_specs_arrive
