"""The retrieval-quality benchmark's generator and metrics (tests/bench/quality): the data is
the same for a seed, every question points at turns that exist, and the metrics agree with
values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.quality.generate import TEMPORAL_DEV, TEMPORAL_HELD, Question, generate
from bench.quality.metrics import (
    BM25,
    dense_rank,
    ndcg_at,
    oracle_recall,
    recall_at,
    reciprocal_rank,
    rrf,
    tokens,
    with_neighbours,
)
from memfabric.timeparse import parse_time


def test_same_seed_same_data_other_seed_other_data() -> None:
    a, b = generate(seed=3, conversations=2), generate(seed=3, conversations=2)
    assert a == b
    assert generate(seed=4, conversations=2) != a


def test_a_smaller_run_is_a_prefix_of_a_larger_one() -> None:
    small, large = generate(seed=3, conversations=1), generate(seed=3, conversations=2)
    assert small.conversations == large.conversations[:1]
    first = [q for q in large.questions if q.conversation_id == "conv-00"]
    assert list(small.questions) == first


def test_every_evidence_id_is_a_turn_of_the_questions_conversation() -> None:
    data = generate(seed=11, conversations=3)
    turns = {c.conversation_id: {t.turn_id for t in c.turns} for c in data.conversations}
    assert data.questions
    for q in data.questions:
        assert q.evidence, q
        assert set(q.evidence) <= turns[q.conversation_id], q


def test_default_size_and_what_it_covers() -> None:
    data = generate()
    assert sum(len(c.turns) for c in data.conversations) >= 3000
    assert len(data.questions) >= 500
    assert {q.kind for q in data.questions} == {
        "fact",
        "current",
        "before",
        "list",
        "third_party",
        "multi_hop",
        "temporal",
        "temporal_held",
    }
    for c in data.conversations:
        assert len(set(c.speakers)) == 3
        assert len({t.session for t in c.turns}) > 5
        assert [t.at for t in c.turns] == sorted(t.at for t in c.turns)


def test_before_questions_point_at_an_earlier_statement_of_the_same_speaker() -> None:
    """A 'before' question's evidence is said by the person asked about, and earlier than
    the evidence of a 'current' question about them."""
    data = generate(seed=5, conversations=2)
    turn = {t.turn_id: t for c in data.conversations for t in c.turns}
    speakers = {c.conversation_id: c.speakers for c in data.conversations}

    def about(q: Question) -> str:
        return next(s for s in speakers[q.conversation_id] if s.lower() in q.text.lower())

    befores = [q for q in data.questions if q.kind == "before"]
    assert befores
    for q in befores:
        said = turn[q.evidence[0]]
        assert said.speaker == about(q), q
        assert any(said.at < turn[c.evidence[0]].at for c in data.questions
                   if c.kind == "current" and about(c) == said.speaker), q  # fmt: skip


def test_question_sample_is_seeded_and_a_subset() -> None:
    full = generate(seed=2, conversations=2)
    part = generate(seed=2, conversations=2, questions=17)
    assert len(part.questions) == 17
    assert set(part.questions) <= set(full.questions)
    assert part == generate(seed=2, conversations=2, questions=17)


def test_recall_at_k() -> None:
    ranked = ["a", "b", "c", "d"]
    assert recall_at(ranked, ["b", "x"], 1) == 0.0
    assert recall_at(ranked, ["b", "x"], 2) == 0.5
    assert recall_at(ranked, ["d", "a"], 4) == 1.0
    assert recall_at([], ["a"], 10) == 0.0


def test_reciprocal_rank() -> None:
    assert reciprocal_rank(["a", "b", "c"], ["c", "b"]) == 0.5
    assert reciprocal_rank(["a", "b", "c"], ["a"]) == 1.0
    assert reciprocal_rank(["a", "b"], ["z"]) == 0.0


def test_ndcg_by_hand() -> None:
    # Evidence {b, d}; ranking a b c d: DCG = 1/log2(3) + 1/log2(5); ideal = 1 + 1/log2(3).
    got = ndcg_at(["a", "b", "c", "d"], ["b", "d"], 10)
    assert got == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3)))
    assert ndcg_at(["b", "d", "a"], ["d", "b"], 10) == pytest.approx(1.0)
    # Only the first k count, and the ideal is capped at k.
    assert ndcg_at(["a", "b"], ["b"], 1) == 0.0
    assert ndcg_at(["x"], ["x", "y", "z"], 1) == pytest.approx(1.0)


def test_tokens_drop_stop_words_and_punctuation() -> None:
    assert tokens("What's Tom's current JOB?") == ["tom", "current", "job"]


def test_bm25_by_hand() -> None:
    docs = ["tom nurse", "maria pilot pilot", "tom tom chef"]
    bm = BM25(docs, k1=1.2, b=0.75)
    # "pilot": df 1 of N 3 -> idf ln(1 + 2.5/1.5); doc 1 has tf 2, length 3, avg 8/3.
    idf = math.log(1 + 2.5 / 1.5)
    norm = 1.2 * (1 - 0.75 + 0.75 * 3 / (8 / 3))
    assert bm.scores("pilot") == pytest.approx([0.0, idf * 2 * 2.2 / (2 + norm), 0.0])
    assert bm.rank("who is the pilot?", 10) == [1]
    # "tom" in two docs (df 2): doc 0 (length 2, tf 1) against doc 2 (length 3, tf 2).
    s = bm.scores("tom")
    idf_tom = math.log(1 + 1.5 / 2.5)
    n0, n2 = (1.2 * (1 - 0.75 + 0.75 * n / (8 / 3)) for n in (2, 3))
    assert s == pytest.approx([idf_tom * 2.2 / (1 + n0), 0.0, idf_tom * 2 * 2.2 / (2 + n2)])
    assert bm.rank("tom", 10) == [2, 0]
    assert bm.rank("the of and", 10) == []


def test_dense_rank_is_exact_cosine_with_stable_ties() -> None:
    v = np.asarray([[1, 0], [0, 1], [0.6, 0.8], [1, 0]], dtype=np.float32)
    assert dense_rank(v, [1.0, 0.0], 3) == [0, 3, 2]
    assert dense_rank(v, [0.0, 1.0], 2) == [1, 2]


def test_rrf_by_hand() -> None:
    # a: 1/61 + 1/63; b: 1/62 + 1/61; c: 1/63; d: 1/62. So b > a > d > c.
    assert rrf([["a", "b", "c"], ["b", "d", "a"]], 10) == ["b", "a", "d", "c"]
    assert rrf([["a", "b", "c"], ["b", "d", "a"]], 2) == ["b", "a"]
    assert rrf([["x"], ["y"]], 10) == ["x", "y"]  # a tie: by id


def test_multi_hop_questions_need_two_turns_linked_by_a_declared_entity() -> None:
    data = generate(seed=3, conversations=2)
    turn = {t.turn_id: t for c in data.conversations for t in c.turns}
    hops = [q for q in data.questions if q.kind == "multi_hop"]
    assert len(hops) == 8
    for q in hops:
        first, second = (turn[e] for e in q.evidence)
        shared = set(first.entities) & set(second.entities)
        assert len(shared) == 1, q  # the link
        (link,) = shared
        assert link[1] not in q.text, q  # the question never names the entity between them


def test_temporal_questions_name_the_month_their_evidence_was_said_in() -> None:
    """Each names one month (absolute, or relative to the conversation's end), its evidence
    was said in it, and the held phrasings share no template with the developed ones."""
    data = generate()
    turns = {t.turn_id: t for c in data.conversations for t in c.turns}
    ends = {c.conversation_id: c.turns[-1].at for c in data.conversations}
    temporal = [q for q in data.questions if q.kind in ("temporal", "temporal_held")]
    assert {q.kind for q in temporal} == {"temporal", "temporal_held"}
    for q in temporal:
        (evidence,) = q.evidence
        window = parse_time(q.text, ends[q.conversation_id])
        assert window is not None and window.since is not None and window.until is not None
        assert window.since <= turns[evidence].at < window.until, q
        assert turns[evidence].speaker in q.text
    assert not set(TEMPORAL_DEV) & set(TEMPORAL_HELD)


def test_weighted_rrf_and_neighbours_by_hand() -> None:
    # a: 2 / 61; b: 1 / 61 + 2 / 62; c: 1 / 62
    assert rrf([["b", "c"], ["a", "b"]], 3, weights=(1.0, 2.0)) == ["b", "a", "c"]
    near = {"a": ["a0", "a1"], "b": ["b0"], "c": ["c0"]}
    assert with_neighbours(["a", "b", "c"], near, 5, top=2) == ["a", "a0", "a1", "b", "b0"]
    assert with_neighbours(["a", "a0", "c"], near, 10, top=1) == ["a", "a0", "a1", "c"]


def test_oracle_recall_is_the_evidence_in_the_union_capped_at_k() -> None:
    lexical, dense = ["a", "b", "c", "d"], ["c", "e", "f", "g"]
    # depth 2: {a, b, c, e} holds a and e of {a, e, g, z}
    assert oracle_recall([lexical, dense], ["a", "e", "g", "z"], 2, 10) == 0.5
    # depth 4 finds g too; a record in both lists counts once
    assert oracle_recall([lexical, dense], ["a", "e", "g", "z"], 4, 10) == 0.75
    assert oracle_recall([lexical, dense], ["c"], 1, 10) == 1.0
    # 3 of the evidence in the union, but a list of 2 can hold only 2 of them
    assert oracle_recall([lexical, dense], ["a", "b", "e"], 4, 2) == pytest.approx(2 / 3)
    # never below what either list's own first k give, never above 1
    for depth, k in ((1, 1), (2, 2), (4, 3), (4, 8)):
        for evidence in (["a"], ["d", "g"], ["b", "f", "x"]):
            best = max(recall_at(r[:depth], evidence, k) for r in (lexical, dense))
            assert best <= oracle_recall([lexical, dense], evidence, depth, k) <= 1.0
    assert oracle_recall([[], []], ["a"], 10, 10) == 0.0
