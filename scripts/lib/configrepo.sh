# The config repo's checkout, for scripts/install.sh: where it is, its pull timer, and what
# the operator is told about how specs arrive in the watched directory. The daemon only
# reads the directory; a newcomer installing without --pull-every was told nothing about
# who puts specs there or who pulls them.
# Sourced by scripts/install.sh, which defines say, ROOT, SPECS, SERVICE_USER, STATE, UNIT_DIR,
# PULL_UNIT, PULL_EVERY and CONF_DIR.

# checkout_of DIR: prints the git checkout holding DIR (DIR or a folder above it, a path of
# the installed host); 1 when there is none.
checkout_of() {
    local dir=$1
    while [ "$dir" != / ] && [ ! -e "$ROOT$dir/.git" ]; do
        dir=$(dirname "$dir")
    done
    [ -e "$ROOT$dir/.git" ] || return 1
    echo "$dir"
}

# write_pull_units REPO: the oneshot service that fast-forwards REPO as the service user, and
# its timer every $PULL_EVERY. UMask 0002 keeps what git writes group-writable (operators
# drop markers beside it).
write_pull_units() {
    cat > "$ROOT$UNIT_DIR/$PULL_UNIT.service" <<EOF
# Written by scripts/install.sh --pull-every: the config repo's checkout, fast-forwarded.
[Unit]
Description=stream-reconciler: pull the config repo's checkout $1 (fast-forward only)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
User=$SERVICE_USER
Group=$SERVICE_USER
UMask=0002
Environment=HOME=$STATE
ExecStart=/usr/bin/git -C $1 pull --ff-only --quiet
EOF
    cat > "$ROOT$UNIT_DIR/$PULL_UNIT.timer" <<EOF
# Written by scripts/install.sh --pull-every $PULL_EVERY
[Unit]
Description=stream-reconciler: pull the config repo's checkout every $PULL_EVERY

[Timer]
OnBootSec=$PULL_EVERY
OnUnitActiveSec=$PULL_EVERY

[Install]
WantedBy=timers.target
EOF
    chmod 0644 "$ROOT$UNIT_DIR/$PULL_UNIT.service" "$ROOT$UNIT_DIR/$PULL_UNIT.timer"
}

# say_how_specs_arrive: the install's last lines. How specs get into the watched directory,
# true to what this host has (a timer, a checkout pulled by hand, or no checkout yet), then
# how many specs are there now.
say_how_specs_arrive() {
    local watched=$ROOT$SPECS repo found
    if [ -f "$ROOT$UNIT_DIR/$PULL_UNIT.timer" ]; then
        repo=$(sed -n 's|^ExecStart=.* -C \([^ ]*\) pull .*|\1|p' "$ROOT$UNIT_DIR/$PULL_UNIT.service" 2>/dev/null)
        say "specs: $watched is watched; $PULL_UNIT.timer pulls the checkout $ROOT${repo:-?} as $SERVICE_USER:" \
            "a change arrives by a push to the config repo"
    elif repo=$(checkout_of "$SPECS"); then
        say "specs: $watched is watched, in the git checkout $ROOT$repo: a change arrives when it is pulled" \
            "(sudo git -C $ROOT$repo pull --ff-only, as its owner), or run this again with --pull-every 1min" \
            "to have a timer pull it as $SERVICE_USER"
    else
        say "specs: $watched is watched (its top level only) and is in no git checkout: put your config repo" \
            "there with git clone URL $watched (while it is empty; for a repo whose spec files sit in a folder" \
            "of it, clone it elsewhere, set specs: in $ROOT$CONF_DIR/config.yaml to that folder and run this" \
            "again), then update it with sudo git -C $watched pull --ff-only, or run this again with --pull-every 1min" \
            "to have a timer pull it"
    fi
    # spec files are <id>.yaml (an id has no dot); markers are <id>.<what>.yaml
    found=$(find "$watched" -maxdepth 1 -type f \( -name '*.yaml' -o -name '*.yml' \) ! -name '*.*.*' 2>/dev/null | wc -l)
    if [ "$found" -eq 0 ]; then
        say "next: put specs in $watched, then \`reconciler status\` (runs as $SERVICE_USER)"
    else
        say "$found spec(s) found in $watched: \`reconciler validate\` checks them, \`reconciler status\` shows them (runs as $SERVICE_USER)"
    fi
}
