"""WF-OS-MEMORY-CONSOLIDATE as an importable n8n workflow (n8n/wf-os-memory-consolidate.json):
its structure, that every SQL call it makes exists and is executable by the login its
credential stands for, and that it runs like the fabric's own worker.

n8n itself is not installed here: `run_workflow` plays the workflow the way n8n runs it
(the nodes in their connection order; a Postgres node once per input item, or once with
`executeOnce`; `alwaysOutputData` and `onError`), its JavaScript (Code nodes and the `={{ }}`
parameter expressions) run by Node.js, its SQL by the credential's login. docs/consolidation.md
describes the manual check in a real n8n.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from conftest import Fabric

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "n8n" / "wf-os-memory-consolidate.json"
# credential id -> (the fixture's login, the group role the deployment's login belongs to)
CREDENTIALS = {
    "memfabric-os-agt-011": ("mf_consolidator", "fabric_consolidator"),
    "memfabric-os-agt-010": ("mf_committer", "fabric_committer"),
}
# The order of the integration guide's workflow, as the worker runs it: start the run, resume
# what waits for an approval, read the candidates, file (scope validation), commit (policy
# gate, commit), persist the Outcome Envelope.
CALLS = [
    "start_workflow_run",
    "awaiting_recommendations",
    "commit_recommendation",
    "consolidation_candidates",
    "recommend",
    "commit_recommendation",
    "record_consolidation_outcome",
]
CALL = re.compile(r"\bfabric_api\.(\w+)\s*\(")

# n8n's Code nodes are JavaScript: the tests run them with the machine's Node.js (a real
# runtime, as n8n's own), never skip without it.
NODE = shutil.which("node")


def workflow() -> dict[str, Any]:
    return json.loads(WORKFLOW.read_text())  # type: ignore[no-any-return]


def chain(wf: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes from the trigger, along each node's single main connection."""
    by_name = {n["name"]: n for n in wf["nodes"]}
    [trigger] = [n for n in wf["nodes"] if n["type"].endswith("Trigger")]
    nodes, name = [], trigger["name"]
    while name is not None:
        assert name not in [n["name"] for n in nodes], f"a cycle at {name}"
        nodes.append(by_name[name])
        outs = wf["connections"].get(name, {}).get("main", [])
        assert len(outs) <= 1 and all(len(o) == 1 for o in outs), name
        name = outs[0][0]["node"] if outs else None
    return nodes


def calls(wf: dict[str, Any]) -> list[str]:
    return [
        fn
        for n in chain(wf)
        if n["type"] == "n8n-nodes-base.postgres"
        for fn in CALL.findall(n["parameters"]["query"])
    ]


def test_the_workflow_is_a_scheduled_chain_of_the_guides_steps() -> None:
    wf = workflow()
    assert wf["name"] == "WF-OS-MEMORY-CONSOLIDATE"
    names = [n["name"] for n in wf["nodes"]]
    assert len(names) == len(set(names))
    assert len({n["id"] for n in wf["nodes"]}) == len(names)
    triggers = [n for n in wf["nodes"] if n["type"].endswith("Trigger")]
    assert [t["type"] for t in triggers] == ["n8n-nodes-base.scheduleTrigger"]
    ordered = chain(wf)
    assert ordered[0]["name"] == triggers[0]["name"]
    assert sorted(n["name"] for n in ordered) == sorted(names)  # nothing unconnected
    for source, outs in wf["connections"].items():
        assert source in names
        assert all(t["node"] in names for o in outs["main"] for t in o)
    assert calls(wf) == CALLS
    for n in ordered:
        if n["type"] != "n8n-nodes-base.postgres":
            continue
        params = n["parameters"]
        assert params["operation"] == "executeQuery", n["name"]
        assert n["credentials"]["postgres"]["id"] in CREDENTIALS, n["name"]
        # values reach SQL only as query parameters, never spliced into the text
        assert "{{" not in params["query"] and "$json" not in params["query"], n["name"]
        used = {int(k) for k in re.findall(r"\$(\d+)", params["query"])}
        assert used == set(range(1, len(used) + 1)), n["name"]


def test_the_worker_calls_the_same_functions() -> None:
    worker = (ROOT / "py" / "memfabric" / "consolidate.py").read_text()
    worker_calls = set(re.findall(r'"fabric_api\.(\w+)"', worker))
    assert set(CALLS) <= worker_calls, set(CALLS) - worker_calls


def test_every_sql_call_exists_and_its_login_may_execute_it(fabric: Fabric) -> None:
    su = fabric.su()
    for n in chain(workflow()):
        if n["type"] != "n8n-nodes-base.postgres":
            continue
        login, group = CREDENTIALS[n["credentials"]["postgres"]["id"]]
        for fn in CALL.findall(n["parameters"]["query"]):
            oids = su.execute(
                "SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'fabric_api'::regnamespace "
                "AND p.proname = %s",
                (fn,),
            ).fetchall()
            assert oids, f"fabric_api.{fn} does not exist"
            for who in (login, group):
                allowed = su.execute(
                    "SELECT bool_or(has_function_privilege(%s, p.oid, 'EXECUTE')) "
                    "FROM pg_proc p WHERE p.pronamespace = 'fabric_api'::regnamespace "
                    "AND p.proname = %s",
                    (who, fn),
                ).fetchone()
                assert allowed == (True,), f"{who} may not execute fabric_api.{fn}"
        # and the statement itself is valid SQL for that login (prepared, not run)
        with fabric.acting(login) as conn:
            statement = n["parameters"]["query"].rstrip(";")
            conn.execute(f"PREPARE n8n_check AS {statement}")  # type: ignore[arg-type]
            conn.execute("DEALLOCATE n8n_check")


# --- playing the workflow -----------------------------------------------------------------

HARNESS = r"""
const data = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const $ = (name) => ({ first: () => ({ json: data.nodes[name][0] }),
                       all: () => data.nodes[name].map((json) => ({ json })) });
const $input = { all: () => data.input.map((json) => ({ json })),
                 first: () => ({ json: data.input[0] }) };
const $json = data.json;
let out;
if (data.kind === 'code') {
  out = (new Function('$', '$input', '$json', data.source))($, $input, $json)
    .map((item) => item.json);
} else {
  out = (new Function('$', '$input', '$json', 'return (' + data.source + ');'))($, $input, $json);
}
process.stdout.write(JSON.stringify(out));
"""


def js(kind: str, source: str, input_: list[Any], nodes: dict[str, Any], item: Any = None) -> Any:
    payload = json.dumps(
        {"kind": kind, "source": source, "input": input_, "nodes": nodes, "json": item},
        default=str,
    )
    assert NODE is not None, "these tests run n8n's Code nodes with Node.js: apt-get install nodejs"
    done = subprocess.run(
        [NODE, "-e", HARNESS], input=payload, capture_output=True, text=True, check=False,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def expression(value: str) -> str:
    m = re.fullmatch(r"=\{\{(.*)\}\}", value, re.DOTALL)
    assert m, value
    return m.group(1).strip()


def run_workflow(fabric: Fabric, tenant: str) -> dict[str, list[Any]]:
    """Play the workflow once; every node's output items, by node name."""
    out: dict[str, list[Any]] = {}
    items: list[Any] = []
    for n in chain(workflow()):
        kind, params = n["type"], n["parameters"]
        if kind.endswith("scheduleTrigger"):
            result: list[Any] = [{}]
        elif kind == "n8n-nodes-base.set":
            result = [{a["name"]: tenant for a in params["assignments"]["assignments"]}]
        elif kind == "n8n-nodes-base.code":
            result = js("code", params["jsCode"], items, out)
        else:
            login, _group = CREDENTIALS[n["credentials"]["postgres"]["id"]]
            query = re.sub(r"\$(\d+)", r"%(p\1)s", params["query"])
            source = expression(params["options"]["queryReplacement"])
            result = []
            with fabric.connect(login) as conn:
                conn.row_factory = dict_row  # type: ignore[assignment]
                for item in items[:1] if n.get("executeOnce") else items:
                    values = js("expr", source, items, out, item)
                    args = {f"p{i}": v for i, v in enumerate(values, 1)}
                    try:
                        rows = conn.execute(query, args).fetchall()  # type: ignore[call-overload]
                    except psycopg.Error as exc:
                        if n.get("onError") != "continueRegularOutput":
                            raise
                        rows = [{"error": f"{exc.sqlstate} {exc.diag.message_primary}"}]
                    result += [json.loads(json.dumps(r, default=str)) for r in rows]
        if not result and n.get("alwaysOutputData"):
            result = [{}]
        out[n["name"]] = items = result
        if not items:
            break
    return out


@pytest.mark.clone  # the workflow's logins commit on their own connections, as in n8n
def test_the_workflow_consolidates_like_the_worker_and_records_its_envelope(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    for i in range(3):
        fabric.form(run, content={"key": "invoice.currency", "value": "EUR", "n": i})
    fabric.form(run, content={"key": "invoice.currency", "value": "USD"})  # uncorroborated

    first = run_workflow(fabric, "acme")
    workflow_event_id = first["Start workflow run"][0]["workflow_event_id"]
    [committed] = first["os-agt-002 gate, os-agt-010 commit"]
    assert committed["result"]["status"] == "committed", committed
    rows = (
        fabric.su()
        .execute(
            "SELECT tier, consolidation_state, formation_method, source_event_id::text, content "
            "FROM fabric.memory_records WHERE formation_method = 'consolidation'"
        )
        .fetchall()
    )
    assert rows == [
        ("semantic", "consolidated", "consolidation", workflow_event_id,
         {"key": "invoice.currency", "value": "EUR"}),
    ]  # fmt: skip
    [outcome] = first["Persist Outcome Envelope"]
    assert outcome["outcome"]["status"] == "recorded"
    envelope = (
        fabric.su()
        .execute(
            "SELECT envelope FROM fabric.consolidation_outcomes WHERE workflow_event_id = %s",
            (workflow_event_id,),
        )
        .fetchone()[0]
    )  # type: ignore[index]
    assert envelope["workflow"] == "WF-OS-MEMORY-CONSOLIDATE"
    assert envelope["counts"] == {
        "candidates": 4, "recommended": 1, "committed": 1, "rejected": 0,
        "awaiting_approval": 0, "refused": 0,
    }  # fmt: skip
    assert "EUR" not in json.dumps(envelope)  # ids and counts, never content
    assert len(fabric.events("event_type = 'memory.record.consolidated'")) == 1

    # A second run forms nothing new (the assertion is live) and still records its envelope.
    second = run_workflow(fabric, "acme")
    assert second["os-agt-002 gate, os-agt-010 commit"] == [{}]
    assert fabric.count("memory_records", "formation_method = 'consolidation'") == 1
    assert second["Persist Outcome Envelope"][0]["outcome"]["status"] == "recorded"
    assert fabric.count("consolidation_outcomes") == 2


@pytest.mark.clone
def test_the_workflow_refuses_a_tenant_its_logins_cannot_act_in(fabric: Fabric) -> None:
    """The database, not the workflow, decides: an unknown tenant stops the run at its first
    step and nothing is written."""
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as caught:
        run_workflow(fabric, "no-such-tenant")
    assert caught.value.sqlstate is not None
    assert fabric.counts() == before
