#!/usr/bin/env bash
# Local PostgreSQL 17 dev server for memfabric (binaries from scripts/install-postgres.sh).
#
#   scripts/db.sh up       install if needed, initdb if needed, start, create db `memfabric`
#   scripts/db.sh down     stop (fast shutdown)
#   scripts/db.sh status   running or not (exit 0 if running, 3 if not)
#   scripts/db.sh url      print the connection URL
#   scripts/db.sh psql ... psql into memfabric (extra args passed through)
#
# Data .local/data, log .local/log/postgres.log, port ${PGPORT:-54329}, TCP on 127.0.0.1
# only, unix socket in .local/run (or /tmp when that path is too long for a socket),
# superuser `postgres`, trust auth on loopback. Works as root: initdb/pg_ctl/postgres run
# through the .local/pg17/wrap/ wrappers (user namespace as "nobody").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
PREFIX="$LOCAL/pg17"
BIN="$PREFIX/bin"
WRAP="$PREFIX/wrap"
DATA="$LOCAL/data"
LOGDIR="$LOCAL/log"
LOG="$LOGDIR/postgres.log"
PORT="${PGPORT:-54329}"
DB=memfabric
URL="postgresql://postgres@127.0.0.1:$PORT/$DB"

# A unix socket path is limited to 107 bytes: <dir>/.s.PGSQL.<port>
SOCKDIR="$LOCAL/run"
if [ $(( ${#SOCKDIR} + ${#PORT} + 10 )) -gt 107 ]; then SOCKDIR=/tmp; fi

log() { printf '[db] %s\n' "$*"; }
die() { printf '[db] ERROR: %s\n' "$*" >&2; exit 1; }

installed() { [ -f "$PREFIX/.installed" ] && [ -x "$BIN/postgres" ] && [ -x "$WRAP/pg_ctl" ]; }

running() {
    installed && [ -f "$DATA/PG_VERSION" ] && "$WRAP/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

# Port the running server listens on (line 4 of postmaster.pid).
running_port() { sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true; }

psql_() {
    "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres "$@"
}

do_initdb() {
    local new="$DATA.new"
    rm -rf "$new"
    mkdir -p "$LOCAL"
    log "initdb $DATA"
    "$WRAP/initdb" -D "$new" --auth=trust -U postgres --encoding=UTF8 --locale=C \
        >"$LOCAL/initdb.log" 2>&1 || { cat "$LOCAL/initdb.log" >&2; die "initdb failed"; }
    cat >"$new/pg_hba.conf" <<'EOF'
# memfabric dev server: trust on loopback and the unix socket only (scripts/db.sh)
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
host    all       all   ::1/128       trust
EOF
    cat >>"$new/postgresql.conf" <<'EOF'

# --- memfabric dev server (scripts/db.sh); port and socket dir are passed by pg_ctl -o ---
listen_addresses = '127.0.0.1'
shared_buffers = 256MB
max_connections = 200
fsync = on
logging_collector = off
EOF
    mv "$new" "$DATA"
}

# Content-safe logging, cluster-wide (SERVER_LOG_SETTINGS in py/memfabric/db.py): no
# statement text and no DETAIL/CONTEXT in the log. The postmaster ignores database settings,
# and it logs a crashed backend's statement ("Failed process was running: ...", a DETAIL)
# unless log_error_verbosity is terse here. Applied on every `up`, so older data dirs get it.
LOG_SETTINGS=(
    "log_error_verbosity=terse"
    "log_min_error_statement=panic"
    "log_statement=none"
    "log_min_duration_statement=-1"
    "log_min_duration_sample=-1"
    "log_transaction_sample_rate=0"
    "debug_print_parse=off"
    "debug_print_rewritten=off"
    "debug_print_plan=off"
)

apply_log_settings() {
    local kv
    for kv in "${LOG_SETTINGS[@]}"; do
        psql_ -d postgres -c "ALTER SYSTEM SET ${kv%%=*} = '${kv#*=}'"
    done
    psql_ -d postgres -tAc "SELECT pg_reload_conf()" >/dev/null
}

cmd_up() {
    if ! installed; then
        "$ROOT/scripts/install-postgres.sh"
    fi
    if [ ! -f "$DATA/PG_VERSION" ]; then
        if [ -e "$DATA" ] && [ -n "$(ls -A "$DATA" 2>/dev/null)" ]; then
            die "$DATA exists but is not a PostgreSQL data dir; move it away"
        fi
        rm -rf "$DATA"
        do_initdb
    fi
    if running; then
        local rp
        rp="$(running_port)"
        if [ -n "$rp" ] && [ "$rp" != "$PORT" ]; then
            die "server already running on port $rp, not $PORT (db.sh down first, or PGPORT=$rp)"
        fi
        log "already running on 127.0.0.1:$PORT"
    else
        mkdir -p "$LOGDIR" "$SOCKDIR"
        log "starting on 127.0.0.1:$PORT (log $LOG)"
        # pg_ctl runs the -o string through /bin/sh: single-quote the socket dir.
        if ! "$WRAP/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
                -o "-p $PORT -k '$SOCKDIR'" start >/dev/null; then
            tail -20 "$LOG" >&2 || true
            die "server did not start"
        fi
    fi
    apply_log_settings
    if [ -z "$(psql_ -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
        log "creating database $DB"
        psql_ -d postgres -c "CREATE DATABASE $DB"
    fi
    echo "$URL"
}

cmd_down() {
    if running; then
        log "stopping"
        "$WRAP/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null
        log "stopped"
    else
        log "not running"
    fi
}

cmd_status() {
    if running; then
        log "running (pid $(sed -n 1p "$DATA/postmaster.pid")) on 127.0.0.1:$(running_port), data $DATA"
        return 0
    fi
    log "not running"
    return 3
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    url) echo "$URL" ;;
    psql) shift; exec "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d "$DB" "$@" ;;
    *) echo "usage: $0 {up|down|status|url|psql [args]}" >&2; exit 2 ;;
esac
