"""Lexical recall that answers questions: any-term matching ranked by BM25 over statistics
kept per (tenant, scope_key), hybrid fusion over the union, bad input that is served or
refused cleanly, and governance that no retriever can get around."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode
from memfabric import db as mfdb
from memfabric.recall import recall

pytestmark = pytest.mark.rollback

QUESTION = "Which currency did the customer ask for when we sent the invoices?"


def ask(fabric: Fabric, query: Any, **request: Any) -> dict[str, Any]:
    run = fabric.open_run()
    body = {"run_id": str(run), "tiers": ["episodic"], **request}
    if query is not None:
        body["query"] = query
    return fabric.recall("mf_agent_a", body)


def ids(answer: dict[str, Any]) -> list[str]:
    return [r["memory_id"] for r in answer["records"]]


def recall_events(fabric: Fabric) -> int:
    return fabric.count("events", "event_type LIKE 'memory.recall.%'")


def raw_scores(fabric: Fabric, keys: list[str], query: str) -> list[tuple[str, float]]:
    """BM25 as the retrieval function computes it for exactly these scope keys."""
    with fabric.su() as su:
        rows = su.execute(
            "SELECT memory_id::text, score FROM fabric._recall_candidates('acme', %s, "
            "ARRAY['episodic'], now(), 0, '{}', %s, NULL, NULL, 50)",
            (keys, query),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


# --- any-term matching, BM25 ------------------------------------------------------------


def test_a_question_finds_a_record_that_shares_only_some_of_its_words(fabric: Fabric) -> None:
    run = fabric.open_run()
    wanted = fabric.form(run, "asked for invoices in EUR")
    fabric.form(run, "the weather was sunny on the trip")
    answer = ask(fabric, QUESTION)
    assert answer["status"] == "served"
    assert answer["mode_served"] == "text"
    assert ids(answer) == [wanted]
    assert answer["records"][0]["retrieval"] == {"lexical": 1}
    assert answer["records"][0]["score"] == 1.0


def test_rarer_terms_weigh_more_than_common_ones(fabric: Fabric) -> None:
    run = fabric.open_run()
    for n in range(6):
        fabric.form(run, f"invoice reminder number {n}")
    rare = fabric.form(run, "the customer prefers EUR", confidence=0.5)
    common = fabric.form(run, "an invoice was sent", confidence=0.99)
    answer = ask(fabric, "invoice in EUR")
    assert ids(answer)[0] == rare
    assert common in ids(answer)
    # Ranks, not statistics: scores fall with rank and the best is 1.
    scores = [r["score"] for r in answer["records"]]
    assert scores[0] == 1.0 and scores == sorted(scores, reverse=True)
    assert [r["retrieval"]["lexical"] for r in answer["records"]] == list(range(1, len(scores) + 1))


@pytest.mark.clone
def test_term_frequency_saturates_and_long_records_are_normalised(fabric: Fabric) -> None:
    run = fabric.open_run()
    short = fabric.form(run, "refund approved", confidence=0.5)
    long = fabric.form(
        run,
        "refund " + " ".join(f"filler{n}" for n in range(60)),
        confidence=0.99,
    )
    answer = ask(fabric, "was the refund approved")
    assert ids(answer)[:2] == [short, long]
    keys = ["subject:user-8842"]
    repeated = fabric.form(run, "refund " * 40)
    once = fabric.form(run, "refund")
    scores = dict(raw_scores(fabric, keys, "refund"))
    # Forty occurrences are worth less than 2.2 times one (k1 = 1.2 saturates tf).
    assert scores[once] < scores[repeated] < 2.2 * scores[once]


@pytest.mark.clone
def test_the_limit_cuts_the_ranking_after_it_is_ordered(fabric: Fabric) -> None:
    """More candidates than the limit: the answer for limit k is the first k of the whole
    ranking, by score, then confidence (the candidates are scored and sorted as narrow
    rows and only the winners read whole: the cut must come after the full order)."""
    run = fabric.open_run()
    best = fabric.form(run, "refund approved today", confidence=0.2)
    for n, confidence in enumerate([0.3, 0.9, 0.5, 0.95, 0.4, 0.7, 0.6, 0.8]):
        fabric.form(run, f"refund noted {n} extra words here", confidence=confidence)
    whole = ids(ask(fabric, "refund approved", limit=50))
    assert len(whole) == 9 and whole[0] == best
    for k in (1, 2, 3, 5):
        assert ids(ask(fabric, "refund approved", limit=k)) == whole[:k]
    with fabric.su() as su:
        rows = su.execute(
            "SELECT r.record ->> 'confidence' FROM fabric._recall_candidates('acme', "
            "ARRAY['subject:user-8842'], ARRAY['episodic'], now(), 0, '{}', 'refund noted', "
            "NULL, NULL, 3) r"
        ).fetchall()
    assert [r[0] for r in rows] == ["0.95", "0.9", "0.8"]


def test_english_is_the_default_configuration_and_stop_words_match_nothing(
    fabric: Fabric,
) -> None:
    with fabric.su() as su:
        row = su.execute("SELECT text_search_config::text FROM fabric.deployment_settings")
        assert row.fetchone() == ("english",)
    run = fabric.open_run()
    fabric.form(run, "the invoices are in the drawer")
    before = recall_events(fabric)
    answer = ask(fabric, "the of and is in")
    assert answer["status"] == "served"
    assert answer["records"] == []
    assert recall_events(fabric) == before + 1
    # Stemming: the question's "invoicing" meets the record's "invoices".
    assert len(ask(fabric, "invoicing")["records"]) == 1


# --- statistics never cross a scope ---------------------------------------------------------


@pytest.mark.clone
def test_another_subjects_records_change_neither_order_nor_scores(fabric: Fabric) -> None:
    run = fabric.open_run()
    banana = fabric.form(run, "banana smoothie recipe", confidence=0.9)
    cherry = fabric.form(run, "cherry smoothie recipe", confidence=0.8)
    keys = ["subject:user-8842", "session:sess-1f9c", "agent:com-agt-003", "tenant"]
    before = ask(fabric, "banana or cherry")
    before_raw = raw_scores(fabric, keys, "banana cherry")
    assert ids(before) == [banana, cherry]

    # Another subject fills its memory with bananas: under global statistics banana would
    # become the common term and cherry would overtake it.
    other = fabric.open_run(subject="user-0001", session="sess-other")
    for n in range(12):
        fabric.commit(
            fabric.propose("mf_agent_a", episode(f"banana bread batch {n}"), other)["proposal_id"]
        )
    assert fabric.count("search_stats", "scope_key = 'subject:user-0001'") > 0

    after = ask(fabric, "banana or cherry")
    assert ids(after) == ids(before)
    assert [r["score"] for r in after["records"]] == [r["score"] for r in before["records"]]
    assert raw_scores(fabric, keys, "banana cherry") == before_raw
    assert [banana, cherry] == [m for m, _ in before_raw]


def erase_by_hand(fabric: Fabric, memory_id: Any) -> None:
    """What erasure does to a record, written as the owner under an approval id."""
    approval = uuid.uuid4()
    conn = fabric.owner()
    conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(approval),))
    conn.execute(
        "UPDATE fabric.memory_records SET content = NULL, subject_id = NULL, session_id = NULL,"
        " agent_id = NULL, consolidation_state = 'tombstoned', erased_at = now(),"
        " erasure_approval_id = %s WHERE memory_id = %s",
        (approval, memory_id),
    )


@pytest.mark.clone
def test_erasure_leaves_no_lexeme_of_the_erased_scope(fabric: Fabric) -> None:
    run = fabric.open_run(subject="user-gone", session=None)
    memory_id = fabric.form(run, "canarylexeme lives here")
    assert fabric.count("search_stats", "lexeme = 'canarylexem'") == 1
    erase_by_hand(fabric, memory_id)
    assert fabric.count("search_stats", "lexeme = 'canarylexem'") == 0
    assert fabric.count("search_stats", "scope_key = 'subject:user-gone'") == 0


@pytest.mark.clone
def test_compaction_keeps_the_statistics_exact(fabric: Fabric) -> None:
    run = fabric.open_run()
    for n in range(5):
        fabric.form(run, f"parcel {n} delivered")
    keys = ["subject:user-8842"]
    before = raw_scores(fabric, keys, "parcel delivered")
    deltas = fabric.count("search_stats", "scope_key = 'subject:user-8842' AND lexeme = ''")
    assert deltas == 5  # one delta per commit: nothing updated in place
    result = (
        fabric.session("mf_committer")
        .execute("SELECT fabric_api.compact_search_stats(100)")
        .fetchone()
    )
    assert result is not None and result[0]["scopes"] >= 1
    assert fabric.count("search_stats", "scope_key = 'subject:user-8842' AND lexeme = ''") == 1
    assert raw_scores(fabric, keys, "parcel delivered") == before


@pytest.mark.clone
def test_two_commits_in_one_scope_do_not_wait_for_each_other(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", episode("shared words alpha"), run)["proposal_id"]
    second = fabric.propose("mf_agent_a", episode("shared words beta"), run)["proposal_id"]
    one = fabric.connect("mf_committer", autocommit=False)
    two = fabric.connect("mf_committer2", autocommit=False)
    one.execute("SELECT fabric_api.commit(%s)", (first,))
    two.execute("SET lock_timeout = '2s'")
    two.execute("SELECT fabric_api.commit(%s)", (second,))  # would time out if serialized
    one.commit()
    two.commit()
    assert fabric.count("search_stats", "lexeme = 'share'") == 2


def test_empty_statistics_never_fail_recall(fabric: Fabric) -> None:
    run = fabric.open_run()
    wanted = fabric.form(run, "asked for invoices in EUR")
    with fabric.su() as su:
        su.execute("DELETE FROM fabric.search_stats")
    answer = ask(fabric, QUESTION)
    assert answer["status"] == "served"
    assert ids(answer) == [wanted]


# --- the configuration and the reindex ---------------------------------------------------------


@pytest.mark.clone
def test_changing_the_configuration_then_reindexing_rebuilds_text_and_statistics(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    memory_id = fabric.form(run, "the invoices")
    fabric.session("mf_admin").execute(
        'SELECT fabric_api.configure_deployment(\'{"text_search_config": "simple"}\')'
    )
    # `memfabric db reindex-text`: the migration role, as the owner.
    result = mfdb.reindex_text(fabric.url)
    assert result == {"text_search_config": "simple", "records_reindexed": 1}
    with fabric.su() as su:
        (tsv,) = su.execute(
            "SELECT search_tsv::text FROM fabric.memory_records WHERE memory_id = %s",
            (memory_id,),
        ).fetchone()  # type: ignore[misc]
    assert tsv == "'invoices':2 'the':1"
    assert fabric.count("search_stats", "lexeme = 'the'") == 1
    assert fabric.count("search_stats", "lexeme = 'invoic'") == 0
    assert ids(ask(fabric, "the")) == [memory_id]


def stored_lengths(fabric: Fabric) -> list[tuple[str, int, int]]:
    """(memory_id, stored search_length, fabric._search_length(search_tsv)) of every record."""
    with fabric.su() as su:
        rows = su.execute(
            "SELECT memory_id::text, search_length, fabric._search_length(search_tsv)::integer"
            " FROM fabric.memory_records ORDER BY memory_id"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def scope_lengths(fabric: Fabric) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Per scope: the statistics' summed length, and the records' stored lengths summed."""
    with fabric.su() as su:
        stats = su.execute(
            "SELECT scope_key, sum(length)::bigint FROM fabric.search_stats WHERE lexeme = ''"
            " GROUP BY scope_key HAVING sum(docs) > 0 ORDER BY scope_key"
        ).fetchall()
        stored = su.execute(
            "SELECT scope_key, sum(search_length)::bigint FROM fabric.memory_records"
            " WHERE search_tsv IS NOT NULL AND scope_key IS NOT NULL"
            " GROUP BY scope_key ORDER BY scope_key"
        ).fetchall()
    return [(r[0], r[1]) for r in stats], [(r[0], r[1]) for r in stored]


@pytest.mark.clone
def test_the_stored_search_length_is_always_what_the_search_text_counts(fabric: Fabric) -> None:
    run = fabric.open_run()
    texts = ["the invoices", "invoices invoices in EUR EUR EUR", "parcel", "a an the of"]
    formed = [fabric.form(run, t) for t in texts]
    other = fabric.form(fabric.open_run(subject="user-gone", session=None), "erase me soon")
    after_insert = stored_lengths(fabric)
    assert len(after_insert) == 5
    assert all(length == counted for _, length, counted in after_insert)
    assert {m: n for m, n, _ in after_insert}[formed[1]] == 5  # "in" is a stop word
    assert {m: n for m, n, _ in after_insert}[formed[3]] == 0  # stop words only
    stats, stored = scope_lengths(fabric)
    assert stats == stored

    # erasure takes the search text, and the length with it
    erase_by_hand(fabric, other)
    after_erasure = stored_lengths(fabric)
    assert all(length == counted for _, length, counted in after_erasure)
    assert {m: n for m, n, _ in after_erasure}[other] == 0
    stats, stored = scope_lengths(fabric)
    assert stats == stored

    # the reindex after a configuration change re-counts it (stop words now count)
    fabric.session("mf_admin").execute(
        'SELECT fabric_api.configure_deployment(\'{"text_search_config": "simple"}\')'
    )
    mfdb.reindex_text(fabric.url)
    after_reindex = stored_lengths(fabric)
    assert all(length == counted for _, length, counted in after_reindex)
    assert {m: n for m, n, _ in after_reindex}[formed[0]] == 2
    assert {m: n for m, n, _ in after_reindex}[formed[3]] == 4
    stats, stored = scope_lengths(fabric)
    assert stats == stored


@pytest.mark.clone
def test_no_one_sets_the_search_length(fabric: Fabric) -> None:
    run = fabric.open_run()
    memory_id = fabric.form(run, "asked for invoices in EUR")
    conn = fabric.owner(actor=None)
    for change in ("search_length = 1000", "search_length = search_length + 1"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                f"UPDATE fabric.memory_records SET {change} WHERE memory_id = %s",  # noqa: S608
                (memory_id,),
            )
        assert info.value.sqlstate == "MF001"
    assert stored_lengths(fabric) == [(memory_id, 3, 3)]
    stats, stored = scope_lengths(fabric)
    assert stats == stored == [("subject:user-8842", 3)]


@pytest.mark.clone
def test_search_text_can_only_become_what_the_content_derives(fabric: Fabric) -> None:
    run = fabric.open_run()
    memory_id = fabric.form(run, "asked for invoices in EUR")
    conn = fabric.owner(actor=None)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "UPDATE fabric.memory_records SET search_tsv = to_tsvector('simple', 'forged')"
            " WHERE memory_id = %s",
            (memory_id,),
        )
    assert info.value.sqlstate == "MF001"
    assert fabric.count("search_stats", "lexeme = 'forged'") == 0


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   \t\n ",
        "\u0001\u0007 invoices \u001b\u007f",
        "счета в евро",
        "請求書はユーロで",
        "فواتير باليورو",
        "' | ! & <-> :* \\ '' (",
        "x" * 1000,
        "invoices " * 111,
    ],
    ids=[
        "empty",
        "whitespace",
        "control",
        "cyrillic",
        "japanese",
        "arabic",
        "syntax",
        "long",
        "many",
    ],
)
def test_bad_queries_are_served_with_one_audit_event(fabric: Fabric, query: str) -> None:
    run = fabric.open_run()
    fabric.form(run, "asked for invoices in EUR")
    other = fabric.open_run(subject="user-0001", session="sess-other")
    secret = str(
        fabric.commit(
            fabric.propose("mf_agent_a", episode(f"{query} invoices secret"), other)["proposal_id"]
        )["memory_id"]
    )
    before = recall_events(fabric)
    answer = ask(fabric, query)
    assert answer["status"] == "served"
    assert secret not in ids(answer)
    assert all(r["scope"]["subject_id"] in ("user-8842", None) for r in answer["records"])
    assert recall_events(fabric) == before + 1


def test_other_scripts_are_found_in_their_own_words(fabric: Fabric) -> None:
    run = fabric.open_run()
    wanted = fabric.form(run, "клиент просил счета в евро")
    fabric.form(run, "asked for invoices in EUR")
    assert ids(ask(fabric, "какие счета?")) == [wanted]


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ('"query": "' + "x" * 1001 + '"', "query"),
        ('"limit": 100000000000000000000', "limit"),
        ('"limit": 1e300', "limit"),
        ('"limit": 5000', "limit"),
        ('"filters": {"min_confidence": 1e-400}', "min_confidence"),
        ('"correlation_id": "has a space"', "correlation_id"),
        ('"correlation_id": "' + "x" * 201 + '"', "correlation_id"),
        ('"correlation_id": "ctl\\u0007"', "correlation_id"),
        ('"causation_id": 17', "causation_id"),
        ('"causation_id": "tab\\there"', "causation_id"),
        ('"mode": "hybrid", "query": "  "', "query"),
        (
            '"candidates": [{"memory_id": "' + str(uuid.uuid4()) + '", "score": 1e400}]',
            "candidates",
        ),
    ],
    ids=lambda v: v[:24],
)
def test_malformed_requests_are_22023_naming_the_field_and_write_nothing(
    fabric: Fabric, fragment: str, field: str
) -> None:
    run = fabric.open_run()
    counts = fabric.counts()
    conn = fabric.connect("mf_agent_a")
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT fabric_api.recall(%s::jsonb)",
            ('{"run_id": "' + str(run) + '", "tiers": ["episodic"], ' + fragment + "}",),
        )
    assert info.value.sqlstate == "22023", info.value
    assert field in info.value.diag.message_primary
    assert info.value.diag.message_hint
    for echoed in ("100000000000000000000", "1e300", "1e400", "1e-400", "has a space", "x" * 201):
        assert echoed not in str(info.value)
    assert fabric.counts() == counts


def test_valid_correlation_ids_are_kept(fabric: Fabric) -> None:
    answer = ask(fabric, "invoices", correlation_id="corr-9d4a", causation_id="evt-7b1f")
    assert answer["status"] == "served"
    (event,) = fabric.events("event_type = 'memory.recall.served'")
    assert (event["correlation_id"], event["causation_id"]) == ("corr-9d4a", "evt-7b1f")


# --- fusion and governance --------------------------------------------------------------------


def test_hybrid_fuses_the_union_and_says_which_retriever_found_what(fabric: Fabric) -> None:
    run = fabric.open_run()
    both = fabric.form(run, "asked for invoices in EUR")
    lexical_only = fabric.form(run, "invoices are due monthly")
    vector_only = fabric.form(run, "wants to be billed in euros")
    answer = fabric.recall(
        "mf_agent_a",
        {
            "run_id": str(fabric.open_run()),
            "tiers": ["episodic"],
            "mode": "hybrid",
            "query": "invoices currency",
            "candidates": [
                {"memory_id": vector_only, "score": 0.9},
                {"memory_id": both, "score": 0.8},
            ],
        },
    )
    assert answer["mode_served"] == "hybrid"
    got = {r["memory_id"]: r for r in answer["records"]}
    assert set(got) == {both, lexical_only, vector_only}
    assert ids(answer)[0] == both
    assert set(got[both]["retrieval"]) == {"lexical", "vector"}
    assert got[lexical_only]["retrieval"].keys() == {"lexical"}
    assert got[vector_only]["retrieval"] == {"vector": 1}
    assert all(0 < r["score"] <= 1 for r in answer["records"])


def test_the_fused_lexical_list_does_not_vote_for_a_speakers_name_alone(fabric: Fabric) -> None:
    """A turn's vector is its transcript line, its speaker's name included, so in hybrid
    recall the lexical list leaves out a turn that matches the question only by that name:
    the vector list alone may still bring it. A match in the words counts, whoever spoke;
    text recall is unchanged."""
    run = fabric.open_run()

    def turn(speaker: str, text: str) -> str:
        return fabric.form(run, content={"speaker": speaker, "text": text})

    reply = turn("Hannah", "Right?!")  # matches 'hannah' in its speaker alone
    moved = turn("Hannah", "The movers came, I live in Lisbon now.")  # 'hannah' and 'live'
    told = turn("Tom", "Hannah said she loves her new place.")  # 'hannah' in the words
    question = "Where does Hannah live?"
    hybrid = ask(fabric, question, mode="hybrid", candidates=[])
    lexical = {r["memory_id"]: r["retrieval"].get("lexical") for r in hybrid["records"]}
    assert set(lexical) == {moved, told} and lexical[moved] == 1
    voted = ask(fabric, question, mode="hybrid", candidates=[{"memory_id": reply, "score": 0.9}])
    found = {r["memory_id"]: r["retrieval"] for r in voted["records"]}
    assert found[reply] == {"vector": 1}  # found by its vector, not by its name
    assert set(ids(ask(fabric, question))) == {reply, moved, told}  # text recall: the name counts


@pytest.mark.parametrize(
    ("embedder", "vector_only", "lexical_only"),
    [("e5", 0.6, 0.4), ("minilm", 0.5, 0.5)],  # 1.2 / 61 and 0.8 / 61 over 2 / 61; equal
)
def test_the_lexical_list_weighs_less_beside_e5s_stronger_dense_list(
    fabric: Fabric, embedder: str, vector_only: float, lexical_only: float
) -> None:
    """With e5 (the default of a new deployment) hybrid fuses the lexical list at 2/3 the
    weight of the vector list (0.8 against 1.2: the dense leg is the stronger one there), so
    the vector list's first record outranks the lexical list's first; with MiniLM both weigh
    1. A record first in both lists still scores 1, and semantic recall is not weighted."""
    run = fabric.open_run()
    by_words = fabric.form(run, "zebra crossing on the left")  # the query's word
    by_vector = fabric.form(run, "a striped animal walks by")
    first_in_both = fabric.form(run, "zebra at the zoo")
    fabric.connect("mf_admin").execute(
        "SELECT fabric_api.configure_deployment(%s)", (Jsonb({"embedder": embedder}),)
    )
    one_each = ask(fabric, "zebra", mode="hybrid", limit=10,
                   candidates=[{"memory_id": by_vector, "score": 0.9}])  # fmt: skip
    scores = {r["memory_id"]: r["score"] for r in one_each["records"]}
    assert {r["memory_id"]: r["retrieval"] for r in one_each["records"]}[by_vector] == {"vector": 1}
    lexical_first = ids(ask(fabric, "zebra", limit=10))[0]
    assert scores[by_vector] == pytest.approx(vector_only, abs=1e-6)
    assert scores[lexical_first] == pytest.approx(lexical_only, abs=1e-6)
    if embedder == "e5":
        assert ids(one_each)[0] == by_vector
    both = ask(fabric, "zebra", mode="hybrid", limit=10,
               candidates=[{"memory_id": lexical_first, "score": 0.9}])  # fmt: skip
    assert both["records"][0]["memory_id"] == lexical_first
    assert both["records"][0]["score"] == pytest.approx(1.0, abs=1e-6)
    assert by_words in ids(both) and first_in_both in ids(both)
    semantic = ask(fabric, "zebra", mode="semantic", candidates=[{"memory_id": by_vector,
                                                                  "score": 0.9}])  # fmt: skip
    assert [(r["memory_id"], r["score"]) for r in semantic["records"]] == [(by_vector, 1.0)]


def test_fused_lists_fifty_deep_still_return_only_readable_records_within_the_limit(
    fabric: Fabric,
) -> None:
    """Each list is taken 50 deep before the fusion cuts the answer to its limit: a deeper
    list widens nothing. Vector candidates of another subject and of a visibility the run
    did not ask for, or below the request's confidence, ranked anywhere in the 50 (and found
    by the lexical list too), are never returned; the answer holds at most
    `limit` records, says it was truncated, and its one audit event names exactly them."""
    run = fabric.open_run()
    mine = [fabric.form(run, f"invoice {n} paid in EUR") for n in range(30)]
    other = fabric.open_run(subject="user-0001", session="sess-other")
    theirs = [
        str(fabric.commit(fabric.propose("mf_agent_a", episode(f"invoice {n} in EUR"), other)[
            "proposal_id"])["memory_id"])
        for n in range(10)
    ]  # fmt: skip
    private = [
        fabric.form(run, f"invoice {n} EUR", scope={"tenant_id": "acme", "visibility": "agent"})
        for n in range(10)
    ]
    doubtful = [fabric.form(run, f"invoice {n} EUR maybe", confidence=0.3) for n in range(5)]
    foreign = [*theirs, *private, *doubtful]  # the last below the request's min_confidence
    candidates = [
        {"memory_id": m, "score": 1 - i / 100}
        for i, m in enumerate(
            [x for pair in zip(foreign, mine, strict=False) for x in pair] + mine[len(foreign) :]
        )
    ]
    request = {"run_id": str(fabric.open_run()), "tiers": ["episodic"], "mode": "hybrid",
               "query": "invoice EUR", "limit": 7, "candidates": candidates,
               "scope": {"visibility": ["subject"]},
               "filters": {"min_confidence": 0.5}}  # fmt: skip
    before = fabric.counts()
    events = recall_events(fabric)
    answer = fabric.recall("mf_agent_a", request)
    assert answer["status"] == "served" and answer["truncated"] is True
    assert len(ids(answer)) == 7 and set(ids(answer)) <= set(mine)
    assert recall_events(fabric) == events + 1  # its audit event, and nothing else written
    assert fabric.counts() == {**before, "events": before["events"] + 1}
    (event,) = fabric.events("event_type = 'memory.recall.served'")[-1:]
    assert event["payload"]["memory_ids"] == ids(answer)


def test_no_retriever_returns_a_hit_outside_the_resolved_scope(fabric: Fabric) -> None:
    run = fabric.open_run()
    mine = fabric.form(run, "invoices in EUR")
    other = fabric.open_run(subject="user-0001", session="sess-other")
    theirs = str(
        fabric.commit(
            fabric.propose("mf_agent_a", episode("invoices in EUR"), other)["proposal_id"]
        )["memory_id"]
    )
    private = fabric.form(
        run, "invoices in EUR private", scope={"tenant_id": "acme", "visibility": "agent"}
    )
    for mode in ("text", "semantic", "hybrid"):
        request: dict[str, Any] = {
            "run_id": str(fabric.open_run()),
            "tiers": ["episodic"],
            "mode": mode,
            "query": "invoices EUR",
            "scope": {"visibility": ["subject"]},
        }
        if mode != "text":
            request["candidates"] = [
                {"memory_id": theirs, "score": 0.99},  # a vector-only hit of another subject
                {"memory_id": private, "score": 0.98},  # a visibility not requested
                {"memory_id": mine, "score": 0.5},
            ]
        answer = fabric.recall("mf_agent_a", request)
        assert ids(answer) == [mine], mode
        assert answer["mode_served"] == mode


def test_a_tier_without_a_vector_collection_is_served_lexically(fabric: Fabric) -> None:
    with fabric.su() as su:
        su.execute(
            "UPDATE fabric.agents SET memory_profile = jsonb_set(memory_profile,"
            ' \'{recall_scope,tiers}\', \'["episodic", "semantic", "relational"]\')'
            " WHERE agent_id = 'com-agt-003'"
        )
    run = fabric.open_run()
    sources = [fabric.form(run, "met the logistics partner"), fabric.form(run, "call notes")]
    edge = fabric.form(
        run,
        "",
        tier="semantic",
        content={"key": "customer.partner", "value": "customer works with Acme Logistics"},
        derived_from=sources,
    )
    committer = fabric.connect("mf_committer")
    (approval,) = committer.execute(
        "SELECT fabric_api.request_approval(%s, 'promote', '{\"tier\": \"relational\"}', 'needed')",
        (edge,),
    ).fetchone()  # type: ignore[misc]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval["approval_id"],)
    )
    committer.execute(
        "SELECT fabric_api.promote(%s, 'relational', %s, NULL)", (edge, approval["approval_id"])
    )
    for mode in ("semantic", "hybrid"):
        request: dict[str, Any] = {
            "run_id": str(fabric.open_run()),
            "tiers": ["episodic", "relational"],
            "mode": mode,
            "query": "who does the customer work with",
        }
        resolved = fabric.recall("mf_agent_a", request)
        assert resolved["status"] == "resolved"
        assert resolved["filter"]["tiers"] == ["episodic"]  # what the broker searches
        assert resolved["tiers_served_lexically"] == ["relational"]
        assert resolved["tiers_denied"] == []
        answer = fabric.recall("mf_agent_a", {**request, "candidates": []})
        assert answer["status"] == "served"
        assert answer["tiers_served_lexically"] == ["relational"]
        assert answer["tiers_denied"] == []
        assert ids(answer) == [edge]
        assert answer["records"][0]["retrieval"] == {"lexical": 1}


def test_every_answer_says_which_mode_served_it(fabric: Fabric) -> None:
    assert ask(fabric, None)["mode_served"] == "text"
    denied = fabric.recall(
        "mf_agent_a",
        {
            "run_id": str(fabric.open_run()),
            "tiers": ["relational"],
            "mode": "semantic",
            "query": "x",
        },
    )
    assert denied["status"] == "denied" and denied["mode_served"] == "semantic"


def test_without_a_broker_python_recall_defaults_to_text(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.setenv("MEMFABRIC_SOCKET", str(tmp_path / "nobody.sock"))
    run = fabric.open_run()
    wanted = fabric.form(run, "asked for invoices in EUR")
    conn = fabric.connect("mf_agent_a")
    answer = recall(
        conn, {"run_id": str(fabric.open_run()), "tiers": ["episodic"], "query": QUESTION}
    )
    assert answer["status"] == "served"
    assert answer["mode_served"] == "text"
    assert ids(answer) == [wanted]


def test_the_candidate_bound_leaves_out_records_holding_only_common_words(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    commons = [fabric.form(run, f"apple crate {n}") for n in range(4)]
    rare = fabric.form(run, "zebra apple")
    admin = fabric.connect("mf_admin")
    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_bound\": 3}')")
    bounded = ask(fabric, "zebra apple", limit=10)
    assert ids(bounded) == [rare]
    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_bound\": 0}')")
    unbounded = ask(fabric, "zebra apple", limit=10)
    assert ids(unbounded)[0] == rare
    assert set(ids(unbounded)) == {rare, *commons}


@pytest.mark.clone  # recall order breaks ties on recorded_at: one transaction has one now()
def test_the_per_lexeme_bound_keeps_a_common_words_first_holders_in_recall_order(
    fabric: Fabric,
) -> None:
    """recall_lexical_top: a lexeme every record of the scope holds is read by walking the
    scope in recall's order (most confident, then most recent) when that reads fewer records
    than its postings; only its first N holders (N at least the limit asked of the
    retrieval) are candidates, each still scored by BM25. Off (0), every holder is."""
    run = fabric.open_run()
    heavy = fabric.form(run, "apple apple apple apple", confidence=0.5)  # best BM25, last in order
    crates = [fabric.form(run, f"apple crate number {n}", confidence=0.9) for n in range(10)]
    admin = fabric.connect("mf_admin")
    assert ids(ask(fabric, "apple", limit=2))[0] == heavy  # default bound: 11 records, no walk

    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_top\": 1}')")
    bounded = ask(fabric, "apple", limit=2)
    # N = 3 (the limit + 1 the retrieval is asked for); the walk reads 2 N S / df = 6 < 11.
    assert ids(bounded) == [crates[9], crates[8]]
    assert [r["retrieval"] for r in bounded["records"]] == [{"lexical": 1}, {"lexical": 2}]
    # At limit 4 (N 5) apple is walked (10 reads < 11 holders) and crate read from its
    # postings (11 reads would not be < 10): the walk's 5 are among crate's 10, each once.
    mixed = ask(fabric, "apple crate", limit=4)
    assert ids(mixed) == [crates[9], crates[8], crates[7], crates[6]]
    assert mixed["truncated"] is True

    # Another subject's apples change neither the walk (statistics of the resolved scope
    # keys only) nor the answer, and none of them is ever a candidate.
    other = fabric.open_run(subject="user-0001", session="sess-other")
    theirs = {fabric.form(other, "apple apple apple apple apple") for _ in range(5)}
    again = ask(fabric, "apple", limit=2)
    assert ids(again) == ids(bounded)
    assert [r["score"] for r in again["records"]] == [r["score"] for r in bounded["records"]]
    assert not theirs & set(ids(ask(fabric, "apple", limit=50)))

    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_top\": 0}')")
    unbounded = ask(fabric, "apple", limit=2)
    assert ids(unbounded) == [heavy, crates[9]]


def test_the_per_lexeme_bound_is_a_sane_setting(fabric: Fabric) -> None:
    admin = fabric.connect("mf_admin")
    with pytest.raises(psycopg.errors.CheckViolation):
        admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_top\": -1}')")
    admin.rollback()
    with fabric.su() as su:
        (top,) = su.execute("SELECT recall_lexical_top FROM fabric.deployment_settings").fetchone()
    assert top == 50


@pytest.mark.clone  # one real backend of its own: the kept list lives in its session
def test_hybrids_lexical_list_is_kept_in_the_session_and_every_id_rechecked(
    fabric: Fabric,
) -> None:
    """Hybrid recall's first call computes the lexical list and keeps it in the database
    for the second (a temporary table the agent holds no privilege on); nothing of it is
    answered, so no record is found without the second call's audit event. The second call
    re-checks each kept id against every rule, ranks them as kept, and answers what it
    answers when it computes the list itself. A table of that name the agent made itself
    is never used."""
    run = fabric.open_run()
    recs = [fabric.form(run, f"invoice {i} in EUR" + " currency" * (i % 3)) for i in range(14)]
    other = fabric.form(fabric.open_run(subject="user-1234"), "invoice in EUR, someone else's")
    request = {
        "run_id": str(fabric.open_run()),
        "tiers": ["episodic"],
        "mode": "hybrid",
        "query": "invoices currency EUR",
        "limit": 5,
    }
    second = {**request, "candidates": [{"memory_id": recs[0], "score": 0.5}]}
    conn = fabric.connect(None)  # the superuser, acting as the agent where it calls

    def agent(body: dict[str, Any]) -> dict[str, Any]:
        conn.execute("SET SESSION AUTHORIZATION mf_agent_a")
        try:
            row = conn.execute("SELECT fabric_api.recall(%s)", (Jsonb(body),)).fetchone()
        finally:
            conn.execute("RESET SESSION AUTHORIZATION")
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    def kept() -> list[list[str]]:
        return [
            [str(i) for i in r[0]]
            for r in conn.execute("SELECT ids FROM pg_temp.fabric_lexical_stash").fetchall()
        ]

    resolved = agent(request)
    assert resolved["status"] == "resolved"
    assert not any(r in json.dumps(resolved) for r in [*recs, other])  # no id answered
    (listed,) = kept()
    assert sorted(listed) == sorted(recs)  # every match: the list goes 50 deep at limit 5
    conn.execute("SET SESSION AUTHORIZATION mf_agent_a")
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pg_temp.fabric_lexical_stash")
    finally:
        conn.execute("RESET SESSION AUTHORIZATION")

    # the second call uses what was kept, and re-checks it: another subject's record is
    # never returned; the kept order is the lexical rank
    conn.execute(
        "UPDATE pg_temp.fabric_lexical_stash SET ids = %s::uuid[]", ([other, recs[13], recs[12]],)
    )
    served = agent(second)
    assert served["status"] == "served"
    lexical = {r["memory_id"]: r["retrieval"]["lexical"] for r in served["records"]
               if "lexical" in r["retrieval"]}  # fmt: skip
    assert lexical == {recs[13]: 1, recs[12]: 2}, served
    assert other not in ids(served)
    assert kept() == []  # used once

    # kept or computed again, the same answer
    computed = agent(second)
    agent(request)
    assert len(kept()) == 1
    assert agent(second)["records"] == computed["records"]

    # a read-only transaction keeps nothing (it may not create the table) and still resolves
    ro = fabric.connect(None)
    ro.execute("SET SESSION AUTHORIZATION mf_agent_a")
    ro.execute("BEGIN READ ONLY")
    row = ro.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),)).fetchone()
    ro.execute("ROLLBACK")
    assert row is not None and row[0]["status"] == "resolved"

    # a table of that name the agent made in its own session is left alone
    own = fabric.connect("mf_agent_a")
    own.execute("CREATE TEMPORARY TABLE fabric_lexical_stash (key text, ids uuid[])")
    for body in (request, second):
        answer = own.execute("SELECT fabric_api.recall(%s)", (Jsonb(body),)).fetchone()
        assert answer is not None and answer[0]["status"] in ("resolved", "served")
    assert answer[0]["records"] == computed["records"]
    assert own.execute("SELECT count(*) FROM pg_temp.fabric_lexical_stash").fetchone() == (0,)


@pytest.mark.clone  # recall order breaks ties on recorded_at: one transaction has one now()
def test_every_retrieval_path_builds_the_envelope_record_json_builds(fabric: Fabric) -> None:
    """Recall reads its winners' lineage in its retrieval statements (filter-only, postings,
    the walk of a common lexeme, the re-check of candidates by id) and builds each envelope
    with fabric._record_envelope: the record returned is the one fabric._record_json builds
    from the stored row, lineage included, whichever path found it."""
    run = fabric.open_run()
    sources = sorted([fabric.form(run, "met the logistics partner"), fabric.form(run, "notes")])
    derived = fabric.form(
        run,
        "",
        tier="semantic",
        content={"key": "customer.partner", "value": "logistics logistics by Acme"},
        derived_from=sources,
        confidence=0.99,
    )
    for n in range(10):  # holders of 'logistics' enough to walk it with recall_lexical_top 1
        fabric.form(run, "", tier="semantic", confidence=0.5, derived_from=sources[:1],
                    content={"key": f"customer.k{n}", "value": f"logistics note {n}"})  # fmt: skip
    with fabric.su() as su:
        (reference,) = su.execute(
            "SELECT fabric._record_json(m) FROM fabric.memory_records m WHERE memory_id = %s",
            (derived,),
        ).fetchone()  # type: ignore[misc]
    assert sorted(reference["derived_from"]) == sources

    def found(answer: dict[str, Any]) -> dict[str, Any]:
        (record,) = [r for r in answer["records"] if r["memory_id"] == derived]
        return {k: v for k, v in record.items() if k not in ("score", "retrieval")}

    semantic = {"tiers": ["semantic"]}
    paths = {
        "filter-only": ask(fabric, None, **semantic),
        "postings": ask(fabric, "Acme logistics", **semantic),
        "by id": ask(fabric, None, **semantic, candidates=[{"memory_id": derived, "score": 1}]),
    }
    admin = fabric.connect("mf_admin")
    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_top\": 1}')")
    paths["walk"] = ask(fabric, "logistics", **semantic, limit=1)
    admin.execute("SELECT fabric_api.configure_deployment('{\"recall_lexical_top\": 50}')")
    for path, answer in paths.items():
        assert found(answer) == reference, path
