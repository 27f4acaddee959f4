"""The FriendsQA reader of the quality benchmark (tests/bench/quality/friendsqa.py), on a
scene written here in FriendsQA's format: episodes become conversations of their scenes in
order, answers point at the turns they name, and the transcripts read as written text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.quality.friendsqa import load, written


def scene(title: str, utterances: list[tuple[list[str], str]], qas: list[Any]) -> Any:
    us = [{"uid": i, "speakers": s, "utterance": u} for i, (s, u) in enumerate(utterances)]
    return {"title": title, "paragraphs": [{"utterances:": us, "qas": qas}]}


def qa(qid: str, question: str, *utterance_ids: int) -> dict[str, Any]:
    answers = [{"answer_text": "x", "utterance_id": u, "inner_start": 0, "inner_end": 0,
                "is_speaker": False} for u in utterance_ids]  # fmt: skip
    return {"id": qid, "question": question, "answers": answers}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    dev = [
        scene("s09_e02_c02", [(["Ann Lee"], "I 'm gon na be late .")],
              [qa("s09_e02_c02_Why", "Why is Ann late ?", 0)]),
        scene("s09_e02_c01", [
            (["#NOTE#"], "[ Scene : the café . ]"),
            (["Ann Lee", "Bo Park"], "We do n't know !"),
            (["Bo Park"], "It 's $ 5 , ( maybe ) ."),
        ], [qa("s09_e02_c01_Where", "Where are they ?", 0),
            qa("s09_e02_c01_Who_Paraphrased", "Who said it 's $ 5 ?", 2, 2, 1)]),
    ]  # fmt: skip
    tst = [scene("s09_e01_c01", [(["Bo Park"], "Hi .")], [qa("s09_e01_c01_What", "What ?", 0)])]
    (tmp_path / "dat").mkdir()
    (tmp_path / "dat" / "friendsqa_dev.json").write_text(json.dumps({"data": dev}))
    (tmp_path / "dat" / "friendsqa_tst.json").write_text(json.dumps({"data": tst}))
    return tmp_path


def test_episodes_are_conversations_of_their_scenes_in_order(checkout: Path) -> None:
    data = load(checkout)
    assert [c.conversation_id for c in data.conversations] == ["s09_e01", "s09_e02"]
    e2 = data.conversations[1]
    assert [(t.speaker, t.text) for t in e2.turns] == [
        ("", "[Scene: the café.]"),
        ("Ann Lee and Bo Park", "We don't know!"),
        ("Bo Park", "It's $5, (maybe)."),
        ("Ann Lee", "I'm gonna be late."),
    ]
    assert [t.turn_id for t in e2.turns] == [f"s09_e02-t{i:04d}" for i in range(4)]
    assert all(a.at < b.at for a, b in zip(e2.turns, e2.turns[1:], strict=False))
    assert e2.speakers == ("Ann Lee", "Ann Lee and Bo Park", "Bo Park")
    assert [c.conversation_id for c in load(checkout, episodes=1).conversations] == ["s09_e01"]


def test_questions_point_at_the_turns_their_answers_name(checkout: Path) -> None:
    questions = {q.question_id: q for q in load(checkout).questions}
    assert questions["s09_e02_c01_Where"].evidence == ("s09_e02-t0000",)
    # answers in a later scene point past the earlier scenes' turns; duplicates count once
    assert questions["s09_e02_c02_Why"].evidence == ("s09_e02-t0003",)
    who = questions["s09_e02_c01_Who_Paraphrased"]
    assert who.evidence == ("s09_e02-t0001", "s09_e02-t0002")
    assert (who.kind, who.text) == ("paraphrased", "Who said it's $5?")
    assert questions["s09_e01_c01_What"].kind == "what"


def test_a_missing_checkout_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"friendsqa_dev\.json not found"):
        load(tmp_path)


def test_written_text() -> None:
    assert written("I ca n't , I wo n't ; we 're gon na wan na go .") == (
        "I can't, I won't; we're gonna wanna go."
    )
