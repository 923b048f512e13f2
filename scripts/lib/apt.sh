# apt_install PACKAGE...: install Debian packages, once per script run and only when called
# (callers check first what is missing). Sourced by scripts/setup.sh and scripts/install.sh;
# needs `say` defined by the caller. Runs as root, or through sudo when there is one.
# apt-get's output goes to the caller's step log (scripts/lib/steps.sh).

if [ "$(type -t step)" != function ]; then
    # shellcheck source=scripts/lib/steps.sh
    source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
fi

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi

APT_UPDATED=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "${0##*/}: apt-get is not available; install these packages by hand: $*" >&2
        exit 1
    fi
    if [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; then
        echo "${0##*/}: need root (or sudo) to install: $*" >&2
        exit 1
    fi
    # Do not let package scripts start system services (we run private instances);
    # only while we install, and only if no policy is in place already.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        added_policy=1
    fi
    local rc=0
    if [ "$APT_UPDATED" -eq 0 ]; then
        # A failed update (one unreachable mirror) still leaves lists the install may use.
        step "apt-get update" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || true
        APT_UPDATED=1
    fi
    step "apt-get install $*" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "$@" || rc=$?
    if [ "$added_policy" -eq 1 ]; then
        "${SUDO[@]}" rm -f "$policy"
    fi
    return "$rc"
}

# java_major: the major version of the `java` on PATH (0 without one).
java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); if (v[1] == "1") print v[2]; else print v[1]; exit }'
}
