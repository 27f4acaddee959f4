"""Retrieval metrics over ranked ids, and the two plain baselines the governed recall is
compared with: Okapi BM25 with an English stop-word list, and exact cosine over embeddings.

Relevance is binary: a turn is evidence for a question or it is not.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

# A common English stop-word list (the usual function words and contraction stems).
STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "aren",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "cannot",
        "could",
        "couldn",
        "d",
        "did",
        "didn",
        "do",
        "does",
        "doesn",
        "doing",
        "don",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "hadn",
        "has",
        "hasn",
        "have",
        "haven",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "isn",
        "it",
        "its",
        "itself",
        "just",
        "ll",
        "m",
        "me",
        "more",
        "most",
        "mustn",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "o",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "ought",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "re",
        "s",
        "same",
        "shan",
        "she",
        "should",
        "shouldn",
        "so",
        "some",
        "such",
        "t",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "ve",
        "very",
        "was",
        "wasn",
        "we",
        "were",
        "weren",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "won",
        "would",
        "wouldn",
        "y",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)
_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    """Lower-cased alphanumeric runs, stop words removed; no stemming."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


class BM25:
    """Okapi BM25 (k1, b) with the non-negative idf ln(1 + (N - df + 0.5) / (df + 0.5))."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.docs = [Counter(tokens(t)) for t in texts]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lengths) / max(len(self.docs), 1) or 1.0
        df: Counter[str] = Counter(term for d in self.docs for term in d)
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = [t for t in set(tokens(query)) if t in self.idf]
        out = []
        for doc, length in zip(self.docs, self.lengths, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / self.avg)
            out.append(sum(self.idf[t] * doc[t] * (self.k1 + 1) / (doc[t] + norm)
                           for t in terms if t in doc))  # fmt: skip
        return out

    def rank(self, query: str, k: int) -> list[int]:
        """Indices of the k best documents; documents that match no term are not returned."""
        s = self.scores(query)
        ranked = sorted(range(len(s)), key=lambda i: (-s[i], i))
        return [i for i in ranked[:k] if s[i] > 0]


def dense_rank(doc_vectors: np.ndarray, query_vector: Sequence[float], k: int) -> list[int]:
    """Exact cosine (the vectors are unit length): indices of the k nearest documents."""
    sims = doc_vectors @ np.asarray(query_vector, dtype=np.float32)
    order = np.lexsort((np.arange(len(sims)), -sims))  # ties: lower index first
    return [int(i) for i in order[:k]]


def rrf(
    rankings: Sequence[Sequence[str]],
    k: int,
    c: int = 60,
    weights: Sequence[float] | None = None,
) -> list[str]:
    """Reciprocal rank fusion: each id scores the sum of weight / (c + rank) over the lists
    it is in (every weight 1 unless given); the k best, ties by id."""
    score: dict[str, float] = {}
    for n, ranking in enumerate(rankings):
        w = 1.0 if weights is None else weights[n]
        for rank, doc in enumerate(ranking, 1):
            score[doc] = score.get(doc, 0.0) + w / (c + rank)
    return sorted(score, key=lambda d: (-score[d], d))[:k]


def with_neighbours(
    ranked: Sequence[str], neighbours: dict[str, Sequence[str]], k: int, top: int = 3
) -> list[str]:
    """`ranked` with the neighbours of each of its first `top` (the turns just before and
    after it in the same session) placed right after it, cut at k: a bounded expansion."""
    out: list[str] = []
    for rank, doc in enumerate(ranked):
        for d in (doc, *(neighbours.get(doc, ()) if rank < top else ())):
            if d not in out:
                out.append(d)
    return out[:k]


def recall_at(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Share of the evidence found in the first k."""
    return len(set(ranked[:k]) & set(evidence)) / len(evidence)


def oracle_recall(
    lists: Sequence[Sequence[str]], evidence: Sequence[str], depth: int, k: int
) -> float:
    """The best recall@k that any k records chosen from the union of `lists`, each cut at
    `depth`, could give (recall_at's definition): the share of the evidence in that union,
    capped at the k records a list holds. What no fusion of those lists can beat."""
    pool = set().union(*(ranked[:depth] for ranked in lists))
    return min(len(pool & set(evidence)), k) / len(evidence)


def reciprocal_rank(ranked: Sequence[str], evidence: Sequence[str]) -> float:
    """1 / rank of the first evidence returned, 0 if none is."""
    wanted = set(evidence)
    return next((1 / i for i, r in enumerate(ranked, 1) if r in wanted), 0.0)


def ndcg_at(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Binary-relevance nDCG@k: DCG of the ranking over DCG of the ideal one."""
    wanted = set(evidence)
    dcg = sum(1 / math.log2(i + 1) for i, r in enumerate(ranked[:k], 1) if r in wanted)
    ideal = sum(1 / math.log2(i + 1) for i in range(1, min(len(wanted), k) + 1))
    return dcg / ideal


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty sequence."""
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))
