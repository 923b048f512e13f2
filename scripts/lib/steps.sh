# step WHAT CMD...: one line on the terminal (`say WHAT`), CMD's own output (pip's warnings,
# apt-get's progress, the Spark JVM's hundreds of "[cds] Skipping" lines) appended to
# $STEP_LOG instead; when CMD fails, an error naming the log and its last lines.
# Returns CMD's exit code, so the caller decides whether a failure is fatal.
# Sourced by scripts/setup.sh and scripts/install.sh; needs `say` defined by the caller,
# and STEP_LOG set (step_log_start sets it and starts the file).

STEP_LOG=${STEP_LOG:-}
STEP_TAIL=20  # lines of the log shown when a step fails

# step_log_start PATH: this run's log (the last run's is replaced: it holds one run).
step_log_start() {
    STEP_LOG=$1
    mkdir -p "$(dirname "$STEP_LOG")"
    printf '%s: %s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${0##*/}" "${*:2}" >"$STEP_LOG"
}

step() {
    local what=$1 rc=0
    shift
    say "$what"
    if [ -z "$STEP_LOG" ]; then  # no log to keep it in: the output as it comes
        "$@" || rc=$?
        return "$rc"
    fi
    printf '\n==> %s\n$ %s\n' "$what" "$*" >>"$STEP_LOG"
    "$@" >>"$STEP_LOG" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "${0##*/}: failed (exit $rc): $what; its output is in $STEP_LOG, which ends:" >&2
        tail -n "$STEP_TAIL" "$STEP_LOG" | sed 's/^/    /' >&2
    fi
    return "$rc"
}
