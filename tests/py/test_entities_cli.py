"""`memfabric entities`: a same-as merge through the CLI, as through SQL a reviewed proposal:
the consolidator proposes (`merge-propose`), policy lists (`merges`) and decides
(`merge-decide`), the consolidator applies (`merge-apply`). Refusals are the database's, in
one line, and write nothing; `merge-decide` decides merge proposals only."""

from __future__ import annotations

import json
import os
from typing import Any

from typer.testing import CliRunner, Result

from conftest import Fabric, episode
from memfabric.cli import app

FOREIGN = ("DATABASE_URL", "PGPORT", "MEMFABRIC_", "QDRANT_", "NEO4J_", "GRAPH_")
ACME_AG = {"type": "organization", "name": "Acme AG"}
ACME = {"type": "organization", "name": "Acme GmbH"}


def invoke(fabric: Fabric, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(FOREIGN)}
    env.update(DATABASE_URL=fabric.url, MEMFABRIC_CONSOLIDATOR_LOGIN="mf_consolidator")
    env["COLUMNS"] = "200"
    return CliRunner().invoke(app, ["entities", *args], env=env)


def ok(result: Result) -> Any:
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def refused(result: Result, sqlstate: str) -> str:
    """The command failed in one line naming the database's SQLSTATE."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"({sqlstate})" in lines[0], lines[0]
    return lines[0]


def entities(fabric: Fabric) -> dict[str, str]:
    run = fabric.open_run()
    fabric.form(run, envelope=episode(content={"text": "Acme AG", "entities": [ACME_AG]}))
    fabric.form(run, envelope=episode(content={"text": "Acme GmbH", "entities": [ACME]}))
    rows = fabric.session(None).execute(
        "SELECT entity_key, entity_id::text FROM fabric.entities WHERE tenant_id = 'acme'"
    )
    return dict(rows.fetchall())


def merged_into(fabric: Fabric, entity_id: str) -> str | None:
    row = (
        fabric.session(None)
        .execute("SELECT merged_into::text FROM fabric.entities WHERE entity_id = %s", (entity_id,))
        .fetchone()
    )
    assert row is not None
    return row[0]


def test_a_merge_is_proposed_listed_decided_and_applied_through_the_cli(fabric: Fabric) -> None:
    ids = entities(fabric)
    ag, gmbh = ids["name:acme ag"], ids["name:acme gmbh"]
    proposed = ok(
        invoke(fabric, "merge-propose", ag, gmbh, "--tenant", "acme", "--reason", "renamed")
    )
    assert proposed["status"] == "pending"
    approval = proposed["approval_id"]
    assert merged_into(fabric, ag) is None  # a proposal merges nothing

    listed = invoke(fabric, "merges", "--tenant", "acme", "--login", "mf_policy")
    assert listed.exit_code == 0, listed.output
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["approval_id"] == approval and row["status"] == "pending"
    assert (row["entity_id"], row["entity_name"]) == (ag, "Acme AG")
    assert (row["into_entity_id"], row["into_entity_name"]) == (gmbh, "Acme GmbH")
    assert row["reason"] == "renamed"

    # not approved yet: applying it is refused
    refused(invoke(fabric, "merge-apply", approval), "55000")
    decided = ok(
        invoke(
            fabric, "merge-decide", approval, "approved", "--reason", "ok", "--login", "mf_policy"
        )
    )
    assert decided["status"] == "approved"
    applied = ok(invoke(fabric, "merge-apply", approval))
    assert (applied["entity_id"], applied["into_entity_id"]) == (ag, gmbh)
    assert merged_into(fabric, ag) == gmbh
    consumed = invoke(
        fabric, "merges", "--tenant", "acme", "--status", "all", "--login", "mf_policy"
    )
    assert [json.loads(line)["status"] for line in consumed.stdout.splitlines()] == ["consumed"]


def test_merge_commands_refuse_in_one_line_and_write_nothing(fabric: Fabric) -> None:
    ids = entities(fabric)
    ag, gmbh = ids["name:acme ag"], ids["name:acme gmbh"]
    before = (fabric.count("approvals"), fabric.count("events"))
    # an agent is no consolidator, nor policy
    propose = ("merge-propose", ag, gmbh, "--tenant", "acme", "--reason", "renamed")
    refused(invoke(fabric, *propose, "--login", "mf_agent_a"), "42501")
    refused(invoke(fabric, "merges", "--tenant", "acme", "--login", "mf_agent_a"), "42501")
    refused(invoke(fabric, "merge-propose", ag, ag, "--tenant", "acme", "--reason", "x"), "22023")
    refused(
        invoke(fabric, "merges", "--tenant", "acme", "--status", "x", "--login", "mf_policy"),
        "22023",
    )
    assert (fabric.count("approvals"), fabric.count("events")) == before

    # merge-decide decides merge proposals only: an erasure approval is refused, undecided
    run = fabric.open_run()
    record = fabric.form(run)
    erasure = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", record)
    before = (fabric.count("approvals", "status = 'pending'"), fabric.count("events"))
    line = refused(
        invoke(
            fabric,
            "merge-decide",
            str(erasure["approval_id"]),
            "approved",
            "--reason",
            "ok",
            "--login",
            "mf_policy",
        ),
        "55000",
    )
    assert "not an entity merge" in line
    assert (fabric.count("approvals", "status = 'pending'"), fabric.count("events")) == before
