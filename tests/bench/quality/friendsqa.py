"""FriendsQA as a conversational-memory set: real dialogue, questions written by people.

FriendsQA (Emory NLP, Apache-2.0; https://github.com/emorynlp/FriendsQA) asks questions
about scenes of the first four seasons of the TV show Friends, transcribed utterance by
utterance with their speakers; each answer names the utterance it was found in. The
repository must be checked out beforehand (`git clone` it anywhere): nothing is downloaded
at run time. Its development and test files are read (17 episodes); the training file's
earlier episodes are not.

To make it a memory set, each episode is one conversation: its scenes in order, one turn per
utterance, so a question asked about one scene must be found among the few hundred turns of
its episode, as a question asked of an agent must be found among a subject's memories. A
turn's evidence is the set of utterances its question's answers name. Stage directions
(speaker `#NOTE#`, "[ Scene : Central Perk ... ]") are kept as turns without a speaker: they
hold the answers to many `where` questions. Utterances of several speakers at once name them
all ("Monica and Rachel"). The transcripts are tokenized ("do n't", "gon na"); the tokens are
joined back as written text. Episodes carry no dates: turns are given one minute apart from
a fixed day per episode, which no question depends on.

Kinds are the question's form (what, who, when, where, why, how); FriendsQA also rewrites
many questions in other words, the `paraphrased` kind here.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .generate import Conversation, Dataset, Question, Turn

FILES = ("friendsqa_dev.json", "friendsqa_tst.json")
NOTE = "#NOTE#"
KINDS = ("what", "who", "when", "where", "why", "how", "paraphrased")

# Tokenized text back to written text: "do n't" -> "don't", "gon na" -> "gonna", " ," -> ","
_JOIN = [
    (re.compile(r" (n't|'s|'re|'m|'ll|'ve|'d)\b", re.I), r"\1"),
    (re.compile(r"\b(gon|wan|got) (na|ta)\b", re.I), r"\1\2"),
    (re.compile(r" ([,.;:!?%)\]])"), r"\1"),
    (re.compile(r"([(\[$]) "), r"\1"),
    (re.compile(r"\s+"), " "),
]


def written(tokens: str) -> str:
    text = tokens
    for pattern, repl in _JOIN:
        text = pattern.sub(repl, text)
    return text.strip()


def _speaker(names: list[str]) -> str:
    names = [n for n in names if n != NOTE]
    return " and ".join(names)


def load(root: Path | str, episodes: int | None = None) -> Dataset:
    """The FriendsQA checkout at `root` as a Dataset, episodes in broadcast order (the first
    `episodes` of them if given)."""
    root = Path(root)
    scenes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name in FILES:
        path = root / "dat" / name
        if not path.exists():
            raise SystemExit(f"{path} not found: check out https://github.com/emorynlp/FriendsQA"
                             " and pass its directory")  # fmt: skip
        for scene in json.loads(path.read_text())["data"]:
            episode, _, number = scene["title"].rpartition("_")
            scenes[episode].append({"number": int(number.lstrip("c")), **scene})
    conversations, questions = [], []
    for e, episode in enumerate(sorted(scenes)[:episodes]):
        day = datetime(2024, 1, 1, 20, tzinfo=UTC) + timedelta(days=7 * e)
        turns: list[Turn] = []
        for scene in sorted(scenes[episode], key=lambda s: s["number"]):
            for paragraph in scene["paragraphs"]:
                first = len(turns)
                for u in paragraph["utterances:"]:
                    turns.append(Turn(
                        turn_id=f"{episode}-t{len(turns):04d}",
                        speaker=_speaker(u["speakers"]),
                        text=written(u["utterance"]),
                        at=day + timedelta(minutes=len(turns)),
                        session=scene["number"],
                    ))  # fmt: skip
                for qa in paragraph["qas"]:
                    evidence = sorted({turns[first + a["utterance_id"]].turn_id
                                       for a in qa["answers"]})  # fmt: skip
                    form = qa["id"].split("_")[3].lower()
                    kind = "paraphrased" if qa["id"].endswith("_Paraphrased") else form
                    questions.append(Question(
                        question_id=qa["id"], conversation_id=episode,
                        text=written(qa["question"]), evidence=tuple(evidence), kind=kind,
                    ))  # fmt: skip
        speakers = tuple(sorted({t.speaker for t in turns if t.speaker}))
        conversations.append(Conversation(episode, speakers, tuple(turns)))
    return Dataset(seed=0, conversations=tuple(conversations), questions=tuple(questions))
