"""The Citus cluster the tests of tests/citus run against (`make test-citus`).

MEMFABRIC_CITUS_URL names the coordinator (scripts/citus.sh url); without it the tests of
tests/citus are skipped. The session makes a fresh database on every node of that cluster
(Citus works per database), joins the nodes in it, migrates it, and seeds the same small
world as the single-node suite: tenants, the logins of tests/conftest.py, their agents.
Tenants are chosen by where their shard lives, so that two of them share a worker and two
do not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from conftest import LOGINS
from memfabric import db as mfdb

CITUS_URL = os.environ.get("MEMFABRIC_CITUS_URL", "")
DATABASE = "mf_citus"

# Tenant ids the fixture picks from, by the worker their shard lands on.
CANDIDATES = [f"t{n:02d}" for n in range(40)]


def _url(base: str, **params: Any) -> str:
    return make_conninfo("", **{**conninfo_to_dict(base), **params})


@dataclass
class Cluster:
    """A migrated fabric on the cluster: the coordinator's URL of the test database, the
    workers (host, port), and the tenants: `same` two tenants on one worker, `apart` two on
    different workers (its first is `same`'s first)."""

    url: str
    workers: list[tuple[str, int]]
    placement: dict[str, tuple[str, int]] = field(default_factory=dict)
    same: tuple[str, str] = ("", "")
    apart: tuple[str, str] = ("", "")

    @property
    def tenants(self) -> list[str]:
        return sorted({*self.same, *self.apart})

    def connect(self, login: str | None = None, autocommit: bool = True) -> psycopg.Connection[Any]:
        url = self.url if login is None else _url(self.url, user=login)
        return psycopg.connect(url, autocommit=autocommit)

    def worker(self, host: str, port: int) -> psycopg.Connection[Any]:
        return psycopg.connect(_url(self.url, host=host, port=port), autocommit=True)

    def rows(self, query: Any, *args: Any) -> list[tuple[Any, ...]]:
        """What a query reads as the superuser on the coordinator (past every policy): how
        the tests look at the state a call left."""
        with self.connect() as su:
            return su.execute(query, args).fetchall()

    def relay(self) -> int:
        """The relay of the delegated calls' events into the outbox (fabric_api.relay_events,
        as an admin: what `memfabric serve` runs before each read); how many it moved."""
        with self.connect("mf_admin") as conn:
            row = conn.execute("SELECT fabric_api.relay_events()").fetchone()
        assert row is not None
        return int(row[0])

    def row(self, query: Any, *args: Any) -> tuple[Any, ...]:
        """The one row a query reads as the superuser; none fails the test."""
        with self.connect() as su:
            got = su.execute(query, args).fetchone()
        assert got is not None, query
        return got


def _nodes(base: str) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    with psycopg.connect(base, autocommit=True) as c:
        rows = c.execute(
            "SELECT nodename, nodeport, groupid FROM pg_dist_node "
            "WHERE noderole = 'primary' ORDER BY groupid"
        ).fetchall()
    if not rows or rows[0][2] != 0:
        pytest.fail(f"{base} is not a Citus coordinator with its workers (pg_dist_node)")
    return (rows[0][0], rows[0][1]), [(h, p) for h, p, _ in rows[1:]]


def _on_node(url: str, statements: list[Any]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for statement in statements:
            c.execute(statement)


def _fresh_database(base: str, coordinator: tuple[str, int], workers: list[tuple[str, int]]) -> str:
    for host, port in [coordinator, *workers]:
        admin = _url(base, host=host, port=port, dbname="postgres")
        _on_node(
            admin,
            [
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)),
                sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)),
            ],
        )
        _on_node(_url(admin, dbname=DATABASE), ["CREATE EXTENSION citus"])
    url = _url(base, host=coordinator[0], port=coordinator[1], dbname=DATABASE)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT citus_set_coordinator_host(%s, %s)", coordinator)
        for host, port in workers:
            c.execute("SELECT citus_add_node(%s, %s)", (host, port))
    return url


def _logins(url: str, coordinator: tuple[str, int], workers: list[tuple[str, int]]) -> None:
    """The test logins and their group roles on every node: roles are per node, and a login
    that existed before this database is not one Citus propagates from here."""
    statements: list[Any] = ["SET citus.enable_create_role_propagation TO off"]
    for login, (_agent, groups, *_rest) in LOGINS.items():
        statements.append(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {}) "
                "THEN CREATE ROLE {} LOGIN; END IF; END $$"
            ).format(sql.Literal(login), sql.Identifier(login))
        )
        for group in groups:
            statements.append(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
            )
    for host, port in [coordinator, *workers]:
        _on_node(_url(url, host=host, port=port), statements)


def _pick_tenants(cluster: Cluster) -> None:
    with cluster.connect() as c:
        for tenant in CANDIDATES:
            row = c.execute(
                "SELECT n.nodename, n.nodeport FROM pg_dist_shard s "
                "JOIN pg_dist_placement p USING (shardid) "
                "JOIN pg_dist_node n USING (groupid) "
                "WHERE s.shardid = get_shard_id_for_distribution_column("
                "'fabric.memory_records', %s::text)",
                (tenant,),
            ).fetchone()
            assert row is not None
            cluster.placement[tenant] = (row[0], row[1])
    first = CANDIDATES[0]
    mate = next(t for t in CANDIDATES[1:] if cluster.placement[t] == cluster.placement[first])
    other = next(t for t in CANDIDATES[1:] if cluster.placement[t] != cluster.placement[first])
    cluster.same, cluster.apart = (first, mate), (first, other)


def _seed(cluster: Cluster) -> None:
    with cluster.connect("mf_admin") as admin:
        for tenant in cluster.tenants:
            admin.execute("SELECT fabric_api.create_tenant(%s)", (tenant,))
        for login, (agent_id, _g, profile, tools, _tenants) in LOGINS.items():
            if agent_id is None:
                continue
            admin.execute(
                "SELECT fabric_api.register_agent(%s, %s, %s, %s)",
                (agent_id, login, Jsonb(profile), tools),
            )
            for tenant in cluster.tenants:
                admin.execute(
                    "SELECT fabric_api.enable_agent(%s, %s, %s)", (tenant, agent_id, tools)
                )
    cluster.relay()  # enable_agent is delegated: its events, into the outbox


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not CITUS_URL:
        pytest.skip("MEMFABRIC_CITUS_URL is not set: `make test-citus` starts a cluster")
    coordinator, workers = _nodes(CITUS_URL)
    if len(workers) < 2:
        pytest.fail("the Citus tests need two workers (scripts/citus.sh up starts them)")
    url = _fresh_database(CITUS_URL, coordinator, workers)
    mfdb.migrate(url)
    _logins(url, coordinator, workers)
    made = Cluster(url=url, workers=workers)
    _pick_tenants(made)
    _seed(made)
    yield made


def new_tenant(c: Cluster, prefix: str = "lone") -> str:
    """A tenant of its own, its agents enabled as in `_seed` (a test that damages its chain
    or moves its shard keeps that to itself)."""
    import uuid

    tenant = f"{prefix}{uuid.uuid4().hex[:8]}"
    with c.connect("mf_admin") as admin:
        admin.execute("SELECT fabric_api.create_tenant(%s)", (tenant,))
        for agent_id, _g, _p, tools, _t in LOGINS.values():
            if agent_id is not None:
                admin.execute(
                    "SELECT fabric_api.enable_agent(%s, %s, %s)", (tenant, agent_id, tools)
                )
    c.relay()
    return tenant
