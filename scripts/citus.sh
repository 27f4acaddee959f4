#!/usr/bin/env bash
# A local Citus cluster for the scale-out tests: a coordinator and two workers on 127.0.0.1.
#
#   CITUS_SRC=<citus source tarball> scripts/citus.sh build   build Citus once into .local/pg17-citus
#   CITUS_SRC=<...> scripts/citus.sh up     build if needed, initdb if needed, start the three
#                                           nodes, create database memfabric on each, join them
#   scripts/citus.sh down     stop the three nodes
#   scripts/citus.sh clean    stop them and remove their data (another CITUS_PORT, a fresh start)
#   scripts/citus.sh status   which nodes run (exit 0 when all three do, 3 otherwise)
#   scripts/citus.sh url      the coordinator's URL
#   scripts/citus.sh ports    the three ports, coordinator first
#
# Citus is a test dependency (AGPL-3.0): never shipped, never copied into this repository.
# The source tarball (tag v14.x of citusdata/citus) is named by CITUS_SRC; without it, and
# with no cached build, `up` refuses in one line. A user's own cluster (Citus packages or
# the citusdata/citus image) needs none of this: DATABASE_URL at its coordinator.
#
# Build: a COPY of .local/pg17 (relocatable; .local/pg17 itself is never written) into
# .local/pg17-citus, the zstd, lz4 and Kerberos headers from Debian's -dev packages fetched
# with a private APT_CONFIG (the machine's apt setup is not touched) and unpacked into
# .local/citus-deps, then configure/make/make install. Stamped with the tarball's name.
#
# Nodes: data in .local/citus/{coordinator,worker1,worker2}, ports CITUS_PORT (54339),
# +1, +2, logs in .local/log/citus-*.log, trust auth on loopback, superuser postgres,
# shared_preload_libraries = 'citus'. Works as root through the wrap/ wrappers.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
BASE_PG="$LOCAL/pg17"
PREFIX="$LOCAL/pg17-citus"
STAMP="$PREFIX/.citus-installed"
DEPS="$LOCAL/citus-deps"
BIN="$PREFIX/bin"
WRAP="$PREFIX/wrap"
CLUSTER="$LOCAL/citus"
LOGDIR="$LOCAL/log"
PORT="${CITUS_PORT:-54339}"
NODES=(coordinator worker1 worker2)
DB=memfabric
BOOKWORM='deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main'
DEV_PKGS=(libzstd-dev liblz4-dev libkrb5-dev krb5-multidev comerr-dev)

log() { printf '[citus] %s\n' "$*"; }
die() { printf '[citus] ERROR: %s\n' "$*" >&2; exit 1; }

port_of() { # node index -> port
    echo $(( PORT + $1 ))
}

built() { [ -f "$STAMP" ] && [ -x "$BIN/postgres" ] && [ -f "$("$BIN/pg_config" --pkglibdir)/citus.so" ]; }

need_source() {
    if [ -z "${CITUS_SRC:-}" ]; then
        die "CITUS_SRC is not set: make citus-up CITUS_SRC=<citus-14.x source tarball> (or point DATABASE_URL at a Citus 13+/14 coordinator installed from Citus's packages or image)"
    fi
    [ -f "$CITUS_SRC" ] ||
        die "CITUS_SRC=$CITUS_SRC does not exist: give a citus-14.x source tarball (or point DATABASE_URL at a Citus coordinator installed from Citus's packages or image)"
}

fetch_headers() {
    # Debian's -dev packages, binary, through a private apt configuration.
    [ -f "$DEPS/.fetched" ] && return 0
    command -v apt-get >/dev/null || die "apt-get is needed to fetch the zstd, lz4 and Kerberos headers"
    local a="$TMP/apt" deb
    mkdir -p "$a/etc/sources.list.d" "$a/etc/preferences.d" "$a/lists/partial" \
             "$a/cache/archives/partial" "$a/state" "$a/debs"
    : >"$a/state/status"
    echo "$BOOKWORM" >"$a/etc/sources.list"
    cat >"$a/apt.conf" <<EOF
Dir::Etc::SourceList "$a/etc/sources.list";
Dir::Etc::SourceParts "$a/etc/sources.list.d";
Dir::Etc::Preferences "$a/etc/preferences.d";
Dir::Etc::PreferencesParts "$a/etc/preferences.d";
Dir::State "$a/state";
Dir::State::Lists "$a/lists";
Dir::State::status "$a/state/status";
Dir::Cache "$a/cache";
APT::Sandbox::User "$(id -un)";
EOF
    log "fetching ${DEV_PKGS[*]} from Debian bookworm (private APT_CONFIG)"
    if ! { APT_CONFIG="$a/apt.conf" apt-get update -q &&
           (cd "$a/debs" && APT_CONFIG="$a/apt.conf" apt-get download "${DEV_PKGS[@]}"); \
         } >"$TMP/apt.log" 2>&1; then
        tail -10 "$TMP/apt.log" >&2; die "could not fetch ${DEV_PKGS[*]}"
    fi
    rm -rf "$DEPS"
    mkdir -p "$DEPS"
    for deb in "$a"/debs/*.deb; do dpkg-deb -x "$deb" "$DEPS"; done
    # The -dev packages' lib*.so symlinks point at the runtime libraries, which the machine
    # has (PostgreSQL itself links them): point them there.
    local so target
    for so in "$DEPS"/usr/lib/x86_64-linux-gnu/*.so; do
        [ -L "$so" ] || continue
        target="$(basename "$(readlink "$so")")"
        if [ ! -e "$(dirname "$so")/$target" ] && [ -e "/usr/lib/x86_64-linux-gnu/$target" ]; then
            ln -sf "/usr/lib/x86_64-linux-gnu/$target" "$so"
        fi
    done
    touch "$DEPS/.fetched"
}

cmd_build() {
    need_source
    local want
    want="$(basename "$CITUS_SRC")"
    if built && [ "$(sed -n 1p "$STAMP")" = "$want" ]; then
        log "already built ($want) in $PREFIX"
        return 0
    fi
    [ -x "$BASE_PG/bin/pg_config" ] || "$ROOT/scripts/install-postgres.sh"
    mkdir -p "$LOCAL"
    exec 9>"$LOCAL/.citus-build.lock"
    flock 9
    if built && [ "$(sed -n 1p "$STAMP")" = "$want" ]; then return 0; fi
    local start stage
    start=$(date +%s)
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/citus-build.XXXXXX")"
    stage="$LOCAL/pg17-citus.new"
    STAGE="$stage"
    trap 'rm -rf "$TMP" "$STAGE"' EXIT
    fetch_headers
    rm -rf "$stage"
    log "copying $BASE_PG to $stage"
    cp -a "$(readlink -f "$BASE_PG")/." "$stage/"
    rm -f "$stage/.installed"
    mkdir -p "$TMP/src"
    tar -xzf "$CITUS_SRC" -C "$TMP/src" --strip-components=1
    log "building $want (configure, make -j$(nproc), install; a few minutes)"
    (
        cd "$TMP/src"
        ./configure PG_CONFIG="$stage/bin/pg_config" --without-libcurl \
            CPPFLAGS="-I$DEPS/usr/include -I$DEPS/usr/include/mit-krb5" \
            LDFLAGS="-L$DEPS/usr/lib/x86_64-linux-gnu"
        make -j"$(nproc)"
        make install
    ) >"$TMP/build.log" 2>&1 || { tail -30 "$TMP/build.log" >&2; die "building Citus failed"; }
    [ -f "$("$stage/bin/pg_config" --pkglibdir)/citus.so" ] || die "citus.so missing after install"
    printf '%s\nbuilt %s\n' "$want" "$(date -u +%FT%TZ)" >"$stage/.citus-installed"
    rm -rf "$PREFIX"
    mv "$stage" "$PREFIX"
    log "built in $PREFIX in $(( $(date +%s) - start ))s"
}

psql_() { # port, then psql arguments
    local p="$1"; shift
    PGOPTIONS="-c client_min_messages=warning" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$p" -U postgres "$@"
}

node_running() { [ -f "$CLUSTER/$1/PG_VERSION" ] && "$WRAP/pg_ctl" -D "$CLUSTER/$1" status >/dev/null 2>&1; }

init_node() {
    local data="$CLUSTER/$1" new="$CLUSTER/$1.new"
    rm -rf "$new"
    mkdir -p "$CLUSTER"
    "$WRAP/initdb" -D "$new" --auth=trust -U postgres --encoding=UTF8 --locale=C \
        >"$LOGDIR/citus-initdb.log" 2>&1 || { cat "$LOGDIR/citus-initdb.log" >&2; die "initdb $1 failed"; }
    cat >"$new/pg_hba.conf" <<'EOF'
# memfabric Citus test cluster: trust on loopback and the unix socket only (scripts/citus.sh)
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
host    all       all   ::1/128       trust
EOF
    cat >>"$new/postgresql.conf" <<'EOF'

# --- memfabric Citus test cluster (scripts/citus.sh); port and socket dir via pg_ctl -o ---
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
shared_buffers = 128MB
max_connections = 300
max_prepared_transactions = 200
citus.max_client_connections = 250
log_error_verbosity = terse
log_min_error_statement = panic
log_statement = none
logging_collector = off
EOF
    mv "$new" "$data"
}

cmd_up() {
    if ! built; then cmd_build; elif [ -n "${CITUS_SRC:-}" ]; then cmd_build; fi
    mkdir -p "$LOGDIR"
    local i node p sock rp
    sock="$CLUSTER/run"
    if [ $(( ${#sock} + 16 )) -gt 107 ]; then sock=/tmp; fi
    mkdir -p "$CLUSTER" "$sock"
    # The workers are registered by port in the cluster's metadata: a cluster keeps its ports.
    if [ -f "$CLUSTER/port" ] && [ "$(cat "$CLUSTER/port")" != "$PORT" ]; then
        die "this cluster was made with CITUS_PORT=$(cat "$CLUSTER/port"): use it, or citus.sh clean first"
    fi
    echo "$PORT" >"$CLUSTER/port"
    for i in 0 1 2; do
        node="${NODES[$i]}"
        p="$(port_of "$i")"
        [ -f "$CLUSTER/$node/PG_VERSION" ] || init_node "$node"
        if node_running "$node"; then
            rp="$(sed -n 4p "$CLUSTER/$node/postmaster.pid")"
            [ "$rp" = "$p" ] ||
                die "$node already running on port $rp, not $p (citus.sh down first, or CITUS_PORT=$(( rp - i )))"
            log "$node already running on 127.0.0.1:$p"
            continue
        fi
        log "starting $node on 127.0.0.1:$p (log $LOGDIR/citus-$node.log)"
        "$WRAP/pg_ctl" -D "$CLUSTER/$node" -l "$LOGDIR/citus-$node.log" -w -t 60 \
            -o "-p $p -k '$sock'" start >/dev/null ||
            { tail -20 "$LOGDIR/citus-$node.log" >&2; die "$node did not start"; }
    done
    for i in 0 1 2; do
        p="$(port_of "$i")"
        if [ -z "$(psql_ "$p" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
            psql_ "$p" -d postgres -c "CREATE DATABASE $DB"
        fi
        psql_ "$p" -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS citus"
    done
    psql_ "$PORT" -d "$DB" -tAc "SELECT citus_set_coordinator_host('127.0.0.1', $PORT)" >/dev/null
    for i in 1 2; do
        p="$(port_of "$i")"
        psql_ "$PORT" -d "$DB" -tAc "SELECT citus_add_node('127.0.0.1', $p)
            WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodeport = $p)" >/dev/null
    done
    log "$(psql_ "$PORT" -d "$DB" -tAc "SELECT 'Citus ' || extversion FROM pg_extension WHERE extname = 'citus'"), workers: $(psql_ "$PORT" -d "$DB" -tAc "SELECT string_agg(nodename || ':' || nodeport, ' ' ORDER BY nodeport) FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0")"
    echo "postgresql://postgres@127.0.0.1:$PORT/$DB"
}

cmd_down() {
    local node
    [ -x "$WRAP/pg_ctl" ] || { log "not built"; return 0; }
    for node in "${NODES[@]}"; do
        if node_running "$node"; then
            "$WRAP/pg_ctl" -D "$CLUSTER/$node" -m fast -w -t 60 stop >/dev/null
            log "$node stopped"
        fi
    done
}

cmd_clean() {
    cmd_down
    rm -rf "$CLUSTER"
    log "removed $CLUSTER"
}

cmd_status() {
    local node n=0
    for node in "${NODES[@]}"; do
        if [ -x "$WRAP/pg_ctl" ] && node_running "$node"; then
            log "$node running on 127.0.0.1:$(sed -n 4p "$CLUSTER/$node/postmaster.pid")"
            n=$((n + 1))
        else
            log "$node not running"
        fi
    done
    [ "$n" = 3 ] || return 3
}

case "${1:-}" in
    build) cmd_build ;;
    up) cmd_up ;;
    down) cmd_down ;;
    clean) cmd_clean ;;
    status) cmd_status ;;
    url) echo "postgresql://postgres@127.0.0.1:$PORT/$DB" ;;
    ports) echo "$PORT $(port_of 1) $(port_of 2)" ;;
    *) echo "usage: $0 {build|up|down|clean|status|url|ports}" >&2; exit 2 ;;
esac
