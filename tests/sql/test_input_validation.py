"""Input that rounds or slips into range is refused where it enters, with a message naming
the field, a hint, no echo of the value, and nothing written.

Numbers are judged on the JSON text, not on the double a reader would round it to;
timestamps on what they say, not on the instant PostgreSQL would roll them into;
identifiers on their code points, not on the database's locale.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

CANARY = "canary7q"
FORMAT_CHARACTERS = {
    "rlo": "\u202e",  # right-to-left override
    "lri": "\u2066",  # left-to-right isolate
    "zwsp": "\u200b",  # zero-width space
    "zwj": "\u200d",  # zero-width joiner
    "lrm": "\u200e",  # left-to-right mark
    "bom": "\ufeff",  # byte order mark
    "shy": "\u00ad",  # soft hyphen
    "tag": "\U000e0041",  # tag latin capital letter a
    "nbsp": "\u00a0",  # no-break space (a separator)
    "ideographic-space": "\u3000",
    "line-separator": "\u2028",
    "private-use": "\ue000",
    "unassigned": "\u0378",
    "not-nfc": "e\u0301",  # e + combining acute: NFC is U+00E9
}


def refused(fabric: Fabric, send: Callable[[], Any], sqlstate: str) -> psycopg.Error:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        send()
    error = info.value
    assert error.sqlstate == sqlstate, (error.sqlstate, str(error))
    assert fabric.counts() == before, "a refused input wrote a row"
    assert error.diag.message_hint, "no hint"
    for text in (
        str(error),
        error.diag.message_primary,
        error.diag.message_detail,
        error.diag.message_hint,
        error.diag.context,
    ):
        assert CANARY not in (text or ""), "the error echoes the client's value"
    return error


def propose_text(fabric: Fabric, run: uuid.UUID, text: str) -> Any:
    row = (
        fabric.session("mf_agent_a")
        .execute("SELECT fabric_api.propose(%s::jsonb, %s)", (text, run))
        .fetchone()
    )
    return None if row is None else row[0]


def with_raw_number(field: str, number: str) -> str:
    marker = "__N_" + uuid.uuid4().hex + "__"
    text = json.dumps(episode(content={"text": CANARY}) | {field: marker})
    return text.replace(f'"{marker}"', number)


# --- confidence: the JSON text, not the parsed double -------------------------------------


@pytest.mark.parametrize(
    "number",
    [
        "1.0000000000000000001",  # reads as 1.0
        "0.99999999999999999999",  # reads as 1.0
        "1e-400",  # reads as 0.0
        "-1e-400",  # reads as -0.0
        "0.1234567890123456789",  # not the decimal of any double
        "1e400",  # no double at all
    ],
)
def test_a_confidence_that_a_double_would_round_is_refused(fabric: Fabric, number: str) -> None:
    run = fabric.open_run()
    text = with_raw_number("confidence", number)
    error = refused(fabric, lambda: propose_text(fabric, run, text), "22023")
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith("confidence ")
    assert number not in str(error)


@pytest.mark.parametrize("number", ["0", "1", "1.0", "0.9", "0.90", "1e0", "5e-324", "0.3"])
def test_a_confidence_that_is_exactly_a_double_in_range_is_accepted(
    fabric: Fabric, number: str
) -> None:
    result = propose_text(fabric, fabric.open_run(), with_raw_number("confidence", number))
    assert result["status"] == "validated", result


# --- timestamps: what the text says -------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-07-02T24:00:00Z",  # PostgreSQL reads it as the next midnight
        "2026-06-30T23:59:60Z",  # a leap second, read as the next minute
        "2026-06-30T23:59:60.5+02:00",
        "9999-12-31T23:00:00-05:00",  # year 10000 in UTC
        "1899-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
        "1900-01-01T00:30:00+01:00",  # 1899 in UTC
    ],
)
@pytest.mark.parametrize("field", ["valid_from", "valid_until"])
def test_timestamps_that_roll_over_or_leave_1900_to_9999_are_refused(
    fabric: Fabric, field: str, stamp: str
) -> None:
    run = fabric.open_run()
    validity = {"valid_from": "1950-01-01T00:00:00Z", "valid_until": None, field: stamp}
    env = episode(content={"text": CANARY}, validity_interval=validity)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22007")
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith(f"validity_interval.{field} ")
    assert stamp not in str(error)


@pytest.mark.parametrize(
    "stamp", ["1900-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2026-07-02T23:59:59+14:00"]
)
def test_timestamps_at_the_ends_of_the_range_are_accepted(fabric: Fabric, stamp: str) -> None:
    validity = {"valid_from": stamp, "valid_until": None}
    result = fabric.propose("mf_agent_a", episode(validity_interval=validity), fabric.open_run())
    assert result["status"] == "validated", result


# --- identifiers: printable, NFC, no format characters, in every API ----------------------

IDENT_FIELDS = [
    ("provenance", "source_event_id"),
    ("provenance", "correlation_id"),
    ("provenance", "causation_id"),
    ("scope", "subject_id"),
    ("business_instance_id",),
    ("compliance_labels",),
    ("version",),
]


@pytest.mark.parametrize("char", FORMAT_CHARACTERS.values(), ids=FORMAT_CHARACTERS.keys())
@pytest.mark.parametrize("path", IDENT_FIELDS, ids=[".".join(p) for p in IDENT_FIELDS])
def test_an_envelope_identifier_with_a_format_character_is_refused(
    fabric: Fabric, path: tuple[str, ...], char: str
) -> None:
    run = fabric.open_run()
    value: Any = "user-8842" + char + CANARY
    env = episode(content={"text": CANARY})
    if path == ("compliance_labels",):
        env["compliance_labels"] = ["pii", value]
    elif len(path) == 1:
        env[path[0]] = value
    else:
        env[path[0]] = {**env[path[0]], path[1]: value}
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith(".".join(path))


@pytest.mark.parametrize("char", FORMAT_CHARACTERS.values(), ids=FORMAT_CHARACTERS.keys())
@pytest.mark.parametrize("argument", ["subject_id", "session_id"])
def test_open_run_refuses_format_characters(fabric: Fabric, argument: str, char: str) -> None:
    ids = {"subject_id": "user-8842", "session_id": "sess-1f9c"}
    ids[argument] = "user" + char + CANARY
    conn = fabric.connect("mf_orchestrator")
    error = refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.open_run('acme', 'com-agt-003', %s, %s, %s)",
            (ids["subject_id"], ids["session_id"], ["tool:memory-propose"]),
        ),
        "22023",
    )
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith(argument)


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\ufeff", "e\u0301"])
def test_register_agent_refuses_format_characters(fabric: Fabric, char: str) -> None:
    conn = fabric.connect("mf_admin")
    error = refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.register_agent(%s, 'mf_stranger', '{}', '{}')",
            ("new-agt" + char + CANARY,),
        ),
        "22023",
    )
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith("agent_id")
    row = fabric.session().execute("SELECT count(*) FROM fabric.agents WHERE login = 'mf_stranger'")
    assert row.fetchone() == (0,)


def test_subject_erasure_refuses_format_characters(fabric: Fabric) -> None:
    conn = fabric.connect("mf_committer")
    before = fabric.count("approvals")
    refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.request_subject_erasure('acme', %s, 'gdpr')",
            ("user-8842\u202e" + CANARY,),
        ),
        "22023",
    )
    assert fabric.count("approvals") == before


def test_configure_instance_refuses_format_characters(fabric: Fabric) -> None:
    conn = fabric.connect("mf_admin")
    before = fabric.count("instance_config")
    refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.configure_instance('acme', %s, '{}')", ("inst\u200b" + CANARY,)
        ),
        "22023",
    )
    assert fabric.count("instance_config") == before


def test_the_domain_refuses_format_characters_below_the_api(fabric: Fabric) -> None:
    """The rule is the fabric.ident domain's, so no write path can skip it."""
    su = fabric.su()
    for char in FORMAT_CHARACTERS.values():
        with pytest.raises(psycopg.errors.CheckViolation):
            su.execute("SELECT %s::fabric.ident", ("a" + char + "b",))
    for good in ["user-8842", "Zoë", "用户-8842", "emoji-\U0001f600", "a" * 200]:
        assert su.execute("SELECT %s::fabric.ident", (good,)).fetchone() == (good,)


def test_the_identifier_reader_accepts_exactly_what_the_domain_accepts(fabric: Fabric) -> None:
    """fabric._ident answers printable ASCII without the domain cast: every ASCII code point,
    alone, inside an identifier and at the length limits, is judged as the domain judges it
    (and p_max still shortens the rule)."""
    su = fabric.su()
    values = [chr(c) for c in range(1, 128)]
    values += [f"a{chr(c)}b" for c in range(1, 128)]
    values += ["", "a" * 200, "a" * 201, "~" * 200, "!" * 201, "e\u0301", "user-8842\u200b"]

    def domain_accepts(value: str) -> bool:
        try:
            su.execute("SELECT %s::fabric.ident", (value,))
        except psycopg.errors.CheckViolation:
            return False
        return True

    def reader_accepts(value: str, p_max: int = 200) -> bool:
        try:
            row = su.execute("SELECT fabric._ident(%s, 'x', %s)", (value, p_max)).fetchone()
        except psycopg.errors.InvalidParameterValue:
            return False
        assert row == (value,)
        return True

    for value in values:
        assert reader_accepts(value) == domain_accepts(value), repr(value)
    assert reader_accepts("a" * 64, 64) and not reader_accepts("a" * 65, 64)
    assert sum(map(reader_accepts, values)) == 94 * 2 + 2  # printable ASCII; a*200, ~*200


def test_the_recall_request_fast_path_accepts_nothing_the_full_check_refuses(
    fabric: Fabric,
) -> None:
    """fabric._recall_request_problem answers the common request by one expression before
    its full check; a `scope` of {} (valid, and outside that path) sends the same request
    through the full check alone: both must give the same verdict, for valid requests and
    for each way of breaking one."""
    import random

    su = fabric.su()
    run = str(uuid.uuid4())
    absent = object()
    fields: dict[str, list[Any]] = {
        "run_id": [run, run.upper(), "{" + run + "}", run.replace("-", ""), "x", 1, None],
        "tiers": [
            absent,
            [],
            ["episodic"],
            ["semantic", "episodic"],
            ["nope"],
            [1],
            "episodic",
            {"a": 1},
        ],
        "query": [absent, None, "", " \t", "hi there", "a" * 1000, "a" * 1001, 5, ["q"]],
        "mode": [absent, "text", "semantic", "hybrid", "fuzzy", 1, None],
        "limit": [absent, 1, 8, 0, -1, 1.5, 2147483647, 2147483648, "3", None, True],
        "allow_partial": [absent, True, False, "yes", None],
        "requesting_agent": [absent, "agt-1", 1, None],
        "correlation_id": [absent, "c-1"],
    }
    valid = {"run_id": run, "query": "hi there", "mode": "hybrid", "limit": 8}
    requests = []
    for key, values in fields.items():  # each field's values on a valid request
        for value in values:
            requests.append({**valid, key: value})
    rng = random.Random(7)
    for _ in range(400):  # and random mixes
        requests.append({k: rng.choice(v) for k, v in fields.items()})
    requests = [{k: v for k, v in r.items() if v is not absent} for r in requests]

    def problem(request: dict[str, Any]) -> str | None:
        row = su.execute("SELECT fabric._recall_request_problem(%s)", (Jsonb(request),)).fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    verdicts = []
    for request in requests:
        fast = problem(request)
        assert fast == problem({**request, "scope": {}}), request
        verdicts.append(fast is None)
    assert any(verdicts) and not all(verdicts)  # both kinds were tried


# --- versions, business instances ---------------------------------------------------------


@pytest.mark.parametrize(
    "version", ["2147483648.0.0", "1.2147483648.0", "1.0.99999999999999999999999"]
)
def test_a_semver_component_beyond_2_31_is_refused(fabric: Fabric, version: str) -> None:
    run = fabric.open_run()
    env = episode(tier="procedural", version=version)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    assert error.diag.message_primary == "version components must be at most 2147483647"


def test_a_semver_component_of_2_31_minus_1_is_accepted(fabric: Fabric) -> None:
    env = episode(tier="procedural", version="2147483647.2147483647.2147483647-rc.1+b.7")
    assert fabric.propose("mf_agent_a", env, fabric.open_run())["status"] == "validated"


def test_a_business_instance_that_is_not_configured_is_refused(fabric: Fabric) -> None:
    run = fabric.open_run()
    env = episode(business_instance_id="instance-" + CANARY)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith("business_instance_id ")
    # configured in another tenant is still not configured in this one
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('globex', %s, '{}')", ("instance-" + CANARY,)
    )
    refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', %s, '{}')", ("instance-" + CANARY,)
    )
    assert fabric.propose("mf_agent_a", env, run)["status"] == "validated"


# --- numeric overflow on the write path names the field -----------------------------------


@pytest.mark.parametrize(
    "defaults",
    [
        {"min_corroborating_episodes": 99999999999},
        {"min_successful_trajectories": -99999999999},
        {"min_confidence": "x" + CANARY},
    ],
)
def test_pack_defaults_that_overflow_are_refused_without_echo(
    fabric: Fabric, defaults: dict[str, Any]
) -> None:
    conn = fabric.connect("mf_admin")
    before = fabric.count("domain_pack_defaults")
    error = refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.declare_pack_defaults('pack-1', %s)", (Jsonb(defaults),)
        ),
        "22023",
    )
    assert "99999999999" not in str(error)
    assert fabric.count("domain_pack_defaults") == before


def test_an_instance_threshold_that_overflows_is_refused_without_echo(fabric: Fabric) -> None:
    conn = fabric.connect("mf_admin")
    error = refused(
        fabric,
        lambda: conn.execute(
            "SELECT fabric_api.configure_instance('acme', NULL, %s)",
            (Jsonb({"min_corroborating_episodes": 99999999999}),),
        ),
        "22023",
    )
    assert "99999999999" not in str(error)


@pytest.mark.parametrize(
    "confidence", ["1e400", "1.0000000000000000001", "-1e-400", f'"{CANARY}"', '"0.9"']
)
def test_a_recommendation_whose_confidence_is_no_double_is_rejected_at_commit(
    fabric: Fabric, confidence: str
) -> None:
    run = fabric.open_run()
    source = fabric.propose("mf_agent_a", episode(), run)["proposal_id"]
    memory_id = fabric.commit(source)["memory_id"]
    reader = fabric.connect("mf_consolidator")
    workflow = reader.execute("SELECT fabric_api.start_workflow_run('acme')").fetchone()
    assert workflow is not None
    marker = "__C_" + uuid.uuid4().hex + "__"
    text = json.dumps(
        {
            "tenant_id": "acme",
            "kind": "reflection",
            "workflow_event_id": str(workflow[0]),
            "sources": [str(memory_id)],
            "proposal": {"content": {"key": "k", "value": 1}, "confidence": marker},
        }
    ).replace(f'"{marker}"', confidence)
    row = reader.execute("SELECT fabric_api.recommend(%s::jsonb)", (text,)).fetchone()
    assert row is not None
    records = fabric.count("memory_records")
    result = fabric.session("mf_committer").execute(
        "SELECT fabric_api.commit_recommendation(%s)", (row[0]["recommendation_id"],)
    )
    answer = result.fetchone()[0]  # type: ignore[index]
    assert answer["status"] == "rejected" and "confidence" in answer["reason"]
    assert CANARY not in json.dumps(answer)
    assert fabric.count("memory_records") == records
