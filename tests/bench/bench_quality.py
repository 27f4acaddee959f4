"""`make bench-quality`: does recall find what was asked? Governed recall in each mode beside
a plain BM25 and a plain dense retriever over the same texts, in one run.

Prints, never asserts (docs/benchmarks.md). The synthetic conversations of
tests/bench/quality (seeded), or with --friendsqa DIR the episodes of a FriendsQA checkout
(real dialogue, questions written by people; quality/friendsqa.py), are loaded into a
fresh database (DBNAME, dropped and created on the server of DATABASE_URL or the local one,
migrated) through the governed write path: one subject and one run per conversation, each
turn proposed by the agent as an episodic record (content {"speaker", "text"}, valid from
when it was said) and committed by the committer. The records are projected into Qdrant
Edge (a temp dir) by the product's Projector, then every question is asked through
`memfabric.recall.recall` as the agent in each mode (limit 10, modes interleaved question by
question). The baselines rank the same texts within the question's conversation, as recall
does within the subject: Okapi BM25 (k1 1.2, b 0.75, English stop words, no stemming) over
every string value, as the database's search text holds them, and exact cosine over the
same MiniLM vectors of what the projector embeds (text_of); their fusions include the shape of
governed hybrid's (RRF of each list's top 50, the BM25 list without the turns that match the
question only by their speaker's name). `text` and `hybrid` are asked a
second time with the deployment's lexical candidate bounds off (recall_lexical_top and
recall_lexical_bound 0), in the same rotation, so quality with and without the bounds is
printed side by side with the number of answers that differ; --lexical-top sets the bound
of the bounded modes. With a graph server (NEO4J_URI, or the local Bolt server of `make
graph-up`), the records are also projected into the graph (this tenant's nodes only: the
rest of the graph is left alone) and `hybrid+graph` (hybrid with expand {"hops": 2}) is
asked too; the synthetic set's multi-hop questions (two records linked by a declared
entity) are then summed up apart from the rest. `hybrid+neighbours` is hybrid recall with the
request's `neighbours` option (--neighbours, default 1x3: one turn each side of each of the
first 3 records served; a list measures several settings side by side): its top 10 are
scored as every mode's, and the evidence among every record it served (neighbours
included) is printed beside them with the records returned, and beside plain hybrid asked
for as many records as the default setting can serve at most (`hybrid limit 16`).
What fusion could reach at best is printed last: `text` and `semantic` are asked once more
at limit 50 (kept out of every other table), and for each depth d (10, 20, 50) the oracle
recall@10 of fusing the two lists cut at d (the evidence in their union, capped at the 10
records a list holds: what no fusion of those lists can beat) and of the union of each
list's top 5, each against the best single retriever.
BENCH_QUALITY_DB names the database (default memfabric_bench_quality), dropped at the end
unless --keep.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from bench_projection import call, connect
from bench_write import machine
from benchlib import create_logins
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from quality import friendsqa
from quality.generate import Dataset, Question, Turn, generate
from quality.metrics import (
    BM25,
    dense_rank,
    ndcg_at,
    oracle_recall,
    percentile,
    recall_at,
    reciprocal_rank,
    rrf,
    tokens,
    with_neighbours,
)

from memfabric import db
from memfabric.broker import LocalBroker
from memfabric.embedding import (
    Embedder,
    embed_query,
    embedder_from_settings,
    text_of,
)
from memfabric.graph import GraphStore
from memfabric.projector import Projector
from memfabric.recall import find_graph, recall
from memfabric.vectors import EdgeVectorStore

DBNAME = os.environ.get("BENCH_QUALITY_DB", "memfabric_bench_quality")
TENANT, AGENT, COMMITTER = "benchq", "benchq-agt-001", "benchq-agt-010"
TOOLS, TIERS = ["tool:memory-propose", "tool:memory-recall"], ["episodic"]
SCOPE = {"tiers": TIERS, "visibility": ["subject"]}
GROUPS = ("committer", "orchestrator", "admin", "projector")
LOGINS = {"benchq_agent": None, **{f"benchq_{g}": f"fabric_{g}" for g in GROUPS}}
MODES, K, BATCH, WARMUP = ("text", "semantic", "hybrid"), 10, 100, 5
# The lexical modes once more with the candidate bounds off (recall_lexical_top and
# recall_lexical_bound 0), in the same rotation: quality with and without the bounds.
UNBOUNDED = ("text unbounded", "hybrid unbounded")
NO_BOUNDS = Jsonb({"recall_lexical_top": 0, "recall_lexical_bound": 0})
# Depths of the lists fused by the RRF references (k 60): 10, and recall's vector depth 4 x 10.
RRF_DEPTHS = (10, 40)
# Fusion weights of the legs (BM25, dense), RRF of top 10 each: a learned-free weighting,
# measured on the synthetic set only. With k 60 and lists of 10, a ratio of weights above
# 70/61 (1.15) puts every record of one list above every record found by the other alone.
WEIGHTED = {
    f"RRF(BM25 x{w:g}, dense x{2 - w:g}) of top 10": (w, 2 - w) for w in (0.94, 0.97, 1.03, 1.06)
}
# Governed hybrid's fusion since 0.13: RRF (k 60) of each list's top 50, the lexical list
# without the turns that match the question only by their speaker's name (their vector
# holds the name already: fabric._fused_lexical)
FUSED_DEPTH = 50
FUSED = f"RRF(BM25 less the name alone, dense) of top {FUSED_DEPTH}"
# the fused top 10 with the same-session neighbours of its first NEIGHBOUR_TOP
NEIGHBOUR_TOP = 3
NEIGHBOURS = f"RRF of top 10 + same-session neighbours of the first {NEIGHBOUR_TOP}"
OPEN_RUN = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, '12 hours'::interval)"
KINDS = ("fact", "current", "before", "list", "third_party", "multi_hop", "temporal",
         *friendsqa.KINDS)  # fmt: skip
# The held half of the temporal questions' phrasings: scored only for the temporal goal,
# apart from every other figure (quality/generate.py)
HELD = "temporal_held"
# hybrid recall that also walks the graph (asked only when a graph server answers)
GRAPH_MODE, EXPAND = "hybrid+graph", {"hops": 2}
# hybrid recall narrowed to the valid time the question names (recall(..., temporal=True)),
# relative to the end of the question's conversation
TIME_MODE = "hybrid+time"
# hybrid recall with the neighbour expansion (the request's `neighbours`): the turns next to
# its first hits in the same conversation, served after the limit records; scored as the
# evidence among every record served (neighbours included) beside recall@10 of its top 10
NEIGHBOUR_MODE = "hybrid+neighbours"
NEIGHBOURS_DEFAULT = "1x3"  # turns each side x first records expanded (--neighbours)
NEIGHBOUR_SETTINGS: dict[str, dict[str, int]] = {}  # mode name -> the request's option
# plain hybrid asked for as many records as the default setting can serve at most
# (10 + 2 x turns x of): the same budget of records spent on more hits instead
BUDGET: dict[str, int] = {}  # mode name -> its limit
# What fusion could reach at best: the single legs asked again, ORACLE_DEPTHS[-1] deep, for
# the oracle of fusing their lists (report_oracle); kept out of every other table
ORACLE_DEPTHS = (10, 20, 50)
DEEP = {f"{mode} limit {ORACLE_DEPTHS[-1]}": mode for mode in ("text", "semantic")}

Ranked = list[str]


def content(t: Turn) -> dict[str, Any]:
    """A turn as a record's content: its speaker (if any: stage directions have none), text
    and the entities it declares (if any)."""
    out: dict[str, Any] = {"speaker": t.speaker, "text": t.text} if t.speaker else {"text": t.text}
    if t.entities:
        out["entities"] = [{"type": kind, "name": name} for kind, name in t.entities]
    return out


def words(t: Turn) -> str:
    """Every string value of the content, as the database's search text holds them."""
    c = content(t)
    names = [e["name"] for e in c.get("entities", ())]
    return "\n".join([v for v in c.values() if isinstance(v, str)] + names)


class Primed:
    """The deployment's embedder answering from vectors it has already computed (the
    baseline's), so the projector does not embed the same texts twice; identical results
    either way (its contract is the embedder's)."""

    def __init__(self, inner: Embedder, known: dict[str, list[float]]) -> None:
        self.inner, self.known = inner, known
        self.model, self.version, self.dims = inner.model, inner.version, inner.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.known]
        self.known.update(zip(missing, self.inner.embed(missing), strict=True))
        return [self.known[t] for t in texts]


def fresh_database(url: str) -> str:
    """DBNAME dropped, created and migrated on the server of `url`; its URL."""
    with connect(url) as su:
        name = sql.Identifier(DBNAME)
        su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        su.execute(sql.SQL("CREATE DATABASE {}").format(name))
    qurl = make_conninfo(url, dbname=DBNAME)
    db.migrate(qurl)
    return qurl


def setup(url: str) -> None:
    """Logins (cluster-wide, idempotent), the tenant and the two agents."""
    with connect(url) as su:
        create_logins(su, LOGINS)
    with connect(url, "benchq_admin") as admin:
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        profile = Jsonb({"propose_scope": SCOPE, "recall_scope": SCOPE})
        call(admin, register, AGENT, "benchq_agent", profile, TOOLS)
        call(admin, register, COMMITTER, "benchq_committer", Jsonb({}), [])
        call(admin, "SELECT fabric_api.create_tenant(%s)", TENANT)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, AGENT, TOOLS)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, COMMITTER, [])


def load(url: str, data: Dataset) -> tuple[dict[str, uuid.UUID], dict[str, str]]:
    """Every turn proposed and committed; the run per conversation and turn id per record."""
    runs = {}
    with connect(url, "benchq_orchestrator") as orch:
        for c in data.conversations:
            cid = c.conversation_id
            runs[cid] = call(orch, OPEN_RUN, TENANT, AGENT, f"subject-{cid}", f"sess-{cid}", TOOLS)
    with connect(url, "benchq_agent") as agent, connect(url, "benchq_committer") as committer:
        for c in data.conversations:
            for k in range(0, len(c.turns), BATCH):
                chunk = c.turns[k : k + BATCH]
                params = [(Jsonb({
                    "tier": "episodic", "scope": {"tenant_id": TENANT, "visibility": "subject"},
                    "content": content(t),
                    "provenance": {"source_event_id": t.turn_id, "correlation_id":
                                   c.conversation_id, "causation_id": t.turn_id,
                                   "formation_method": "extraction"},
                    "confidence": 0.9,
                    "validity_interval": {"valid_from": t.at.isoformat(), "valid_until": None},
                }), runs[c.conversation_id]) for t in chunk]  # fmt: skip
                with agent.transaction(), agent.cursor() as cur:
                    cur.executemany("SELECT fabric_api.propose(%s, %s)", params)
                done = call(committer, "SELECT fabric_api.commit_pending(%s)", len(chunk))
                if (done["committed"], done["rejected"]) != (len(chunk), 0):
                    raise SystemExit(f"{len(chunk)} turns proposed, commit_pending: {done}")
    with connect(url) as su:
        rows = su.execute("SELECT memory_id::text, source_event_id FROM fabric.memory_records"
                          " WHERE tenant_id = %s", (TENANT,)).fetchall()  # fmt: skip
    return runs, dict(rows)


def baselines(
    data: Dataset,
    known: dict[str, list[float]],
    emb: Embedder,
    also: dict[str, Embedder],
    kind: str,
) -> tuple[dict[str, dict[str, Ranked]], dict[str, list[float]]]:
    """BM25, dense and their reciprocal rank fusion per question, over each conversation's
    turns; time per question of each (the dense query embedding batched, not timed). `emb`
    is the deployment's embedder (`kind`), `also` more embedders ranked the same way (dense
    and RRF rows of their own, the governed fusion's shape among them) beside it."""
    fused = {d: f"RRF(BM25, dense) of top {d}" for d in RRF_DEPTHS}
    out: dict[str, dict[str, Ranked]] = {"BM25": {}, "dense": {}, **{f: {} for f in fused.values()}}
    out |= {name: {} for name in (FUSED, *WEIGHTED, NEIGHBOURS)}
    for name in also:
        out |= {f"dense ({name})": {}}
        out |= {f"RRF(BM25, dense ({name})) of top {d}": {} for d in RRF_DEPTHS}
        out |= {also_fused(name): {}}
    took: dict[str, list[float]] = {name: [] for name in out}
    by_conv: dict[str, list[Question]] = defaultdict(list)
    for q in data.questions:
        by_conv[q.conversation_id].append(q)
    for c in data.conversations:
        ids = [t.turn_id for t in c.turns]
        # the turns just before and after each one in its session (a bounded expansion)
        near: dict[str, list[str]] = {
            t.turn_id: [u.turn_id for u in c.turns[max(0, i - 1) : i + 2]
                        if u is not t and u.session == t.session]
            for i, t in enumerate(c.turns)
        }  # fmt: skip
        # dense reads what the projector embeds (text_of: the turn's text); BM25 every string
        # value, as the database's search text does (the speaker's name too)
        texts = [text_of(content(t)) for t in c.turns]
        t = time.perf_counter()
        known.update(zip(texts, emb.embed(texts), strict=True))
        EMBED_RATE[kind] = EMBED_RATE.get(kind, 0.0) + time.perf_counter() - t
        bm25 = BM25([words(t) for t in c.turns])
        # each turn's words but its speaker's name (a turn without a speaker: all its words)
        said = {t.turn_id: set(tokens(words(t) if not t.speaker else
                                      words(replace(t, speaker="")))) for t in c.turns}  # fmt: skip
        vectors = np.asarray([known[t] for t in texts], dtype=np.float32)
        qs = by_conv[c.conversation_id]
        for q, qv in zip(qs, queries(emb, [q.text for q in qs], kind), strict=True):
            t0 = time.perf_counter()
            deep = [ids[i] for i in bm25.rank(q.text, max(*RRF_DEPTHS, FUSED_DEPTH))]
            lexical = deep[: max(RRF_DEPTHS)]
            t1 = time.perf_counter()
            dense = [ids[i] for i in dense_rank(vectors, qv, max(*RRF_DEPTHS, FUSED_DEPTH))]
            t2 = time.perf_counter()
            took["BM25"].append(t1 - t0)
            took["dense"].append(t2 - t1)
            out["BM25"][q.question_id], out["dense"][q.question_id] = lexical[:K], dense[:K]
            for depth, name in fused.items():
                t3 = time.perf_counter()
                out[name][q.question_id] = rrf([lexical[:depth], dense[:depth]], K)
                took[name].append(t2 - t0 + time.perf_counter() - t3)
            t3 = time.perf_counter()
            words_asked = set(tokens(q.text))
            worded = [d for d in deep if said[d] & words_asked]
            out[FUSED][q.question_id] = rrf([worded[:FUSED_DEPTH], dense[:FUSED_DEPTH]], K)
            took[FUSED].append(t2 - t0 + time.perf_counter() - t3)
            for name, weights in WEIGHTED.items():
                t3 = time.perf_counter()
                out[name][q.question_id] = rrf([lexical[:K], dense[:K]], K, weights=weights)
                took[name].append(t2 - t0 + time.perf_counter() - t3)
            t3 = time.perf_counter()
            top10 = rrf([lexical[:K], dense[:K]], K)
            out[NEIGHBOURS][q.question_id] = with_neighbours(top10, near, K, NEIGHBOUR_TOP)
            took[NEIGHBOURS].append(t2 - t0 + time.perf_counter() - t3)
        for name, other in also.items():
            t = time.perf_counter()
            vecs = np.asarray(other.embed(texts), dtype=np.float32)
            EMBED_RATE[name] = EMBED_RATE.get(name, 0.0) + time.perf_counter() - t
            for q, qv in zip(qs, queries(other, [q.text for q in qs], name), strict=True):
                t0 = time.perf_counter()
                deep = [ids[i] for i in bm25.rank(q.text, max(*RRF_DEPTHS, FUSED_DEPTH))]
                lexical = deep[: max(RRF_DEPTHS)]
                dense = [ids[i] for i in dense_rank(vecs, qv, max(*RRF_DEPTHS, FUSED_DEPTH))]
                took[f"dense ({name})"].append(time.perf_counter() - t0)
                out[f"dense ({name})"][q.question_id] = dense[:K]
                for depth in RRF_DEPTHS:
                    fused_name = f"RRF(BM25, dense ({name})) of top {depth}"
                    out[fused_name][q.question_id] = rrf([lexical[:depth], dense[:depth]], K)
                    took[fused_name].append(time.perf_counter() - t0)
                words_asked = set(tokens(q.text))
                worded = [d for d in deep if said[d] & words_asked]
                shaped = rrf([worded[:FUSED_DEPTH], dense[:FUSED_DEPTH]], K)
                out[also_fused(name)][q.question_id] = shaped
                took[also_fused(name)].append(time.perf_counter() - t0)
    return out, took


def also_fused(name: str) -> str:
    """The row of governed hybrid's fusion shape over another embedder's dense list."""
    return f"RRF(BM25 less the name alone, dense ({name})) of top {FUSED_DEPTH}"


EMBED_RATE: dict[str, float] = {}  # embedder -> seconds spent embedding the turns
QUERY_TIME: dict[str, list[float]] = defaultdict(list)  # embedder -> seconds per question


def queries(emb: Embedder, texts: Sequence[str], name: str) -> list[list[float]]:
    """Each question embedded alone, as recall embeds it (embed_query: e5's ``query:``
    prefix), timed one by one: the query latency of the embedder."""
    out = []
    for text in texts:
        t = time.perf_counter()
        out.append(embed_query(emb, text))
        QUERY_TIME[name].append(time.perf_counter() - t)
    return out


def governed(
    url: str,
    data: Dataset,
    runs: dict[str, uuid.UUID],
    turn_of: dict[str, str],
    broker: LocalBroker,
    graph: GraphStore | None = None,
) -> tuple[dict[str, dict[str, Ranked]], dict[str, list[float]], dict[str, list[str]]]:
    """Every question through recall() in each mode (and the lexical ones unbounded: the
    deployment's bounds switched off around the call; hybrid+graph with a graph), modes
    rotating question by question."""
    names = (
        *MODES,
        *UNBOUNDED,
        TIME_MODE,
        *NEIGHBOUR_SETTINGS,
        *BUDGET,
        *DEEP,
        *((GRAPH_MODE,) if graph is not None else ()),
    )
    walks = Walks(graph) if graph is not None else None
    ends = {c.conversation_id: c.turns[-1].at for c in data.conversations}
    out: dict[str, dict[str, Ranked]] = {m: {} for m in names}
    took: dict[str, list[float]] = {m: [] for m in names}
    errors: dict[str, list[str]] = {m: [] for m in names}
    configure = "SELECT fabric_api.configure_deployment(%s)"
    with connect(url, "benchq_agent") as agent, connect(url, "benchq_admin") as admin:
        bounds = Jsonb({k: v for k, v in call(admin, configure, Jsonb({})).items()
                        if k in ("recall_lexical_top", "recall_lexical_bound")})  # fmt: skip
        for i, q in enumerate(data.questions[:WARMUP] + data.questions):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                mode = (
                    "hybrid"
                    if name in (GRAPH_MODE, TIME_MODE, *NEIGHBOUR_SETTINGS, *BUDGET)
                    else DEEP.get(name, name.split()[0])
                )
                request = {"run_id": str(runs[q.conversation_id]), "mode": mode,
                           "query": q.text, "tiers": TIERS, "limit": K}  # fmt: skip
                if name == GRAPH_MODE:
                    request["expand"] = EXPAND
                if name in NEIGHBOUR_SETTINGS:
                    request["neighbours"] = NEIGHBOUR_SETTINGS[name]
                if name in BUDGET:
                    request["limit"] = BUDGET[name]
                if name in DEEP:
                    request["limit"] = ORACLE_DEPTHS[-1]
                if name in UNBOUNDED:
                    call(admin, configure, NO_BOUNDS)
                t = time.perf_counter()
                try:
                    now = ends[q.conversation_id]
                    temporal = name == TIME_MODE
                    if walks is not None:
                        walks.last = []
                    answer = recall(agent, request, broker, graph=walks, temporal=temporal, now=now)  # type: ignore[arg-type]
                except Exception as exc:  # recorded, not hidden: a mode that fails counts 0
                    answer = {"status": "error", "records": []}
                    state = getattr(exc, "sqlstate", None)
                    errors[name].append(f"{type(exc).__name__} {state or ''}".strip())
                took_s = time.perf_counter() - t
                if name in UNBOUNDED:
                    call(admin, configure, bounds)
                if i < WARMUP:
                    continue
                if answer["status"] not in ("served", "error"):
                    errors[name].append(f"status {answer['status']}")
                took[name].append(took_s)
                out[name][q.question_id] = [turn_of[r["memory_id"]] for r in answer["records"]]
                if name == GRAPH_MODE and walks is not None:
                    WALKED[q.question_id] = [turn_of[m] for m, _ in walks.last if m in turn_of]
    return out, took, errors


WALKED: dict[str, Ranked] = {}  # question -> the graph walk's list (hybrid+graph)


class Walks:
    """The graph store, keeping the list each walk answered (memory ids, best first): the
    graph leg alone, for the plain references of its weight (`graph_weights`)."""

    def __init__(self, graph: GraphStore) -> None:
        self.graph, self.last = graph, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)

    def walk(self, *args: Any, **kwargs: Any) -> list[tuple[str, float]]:
        self.last = self.graph.walk(*args, **kwargs)
        return self.last


# Weights of the graph leg beside BM25 and dense (each 1), RRF of top 10 each
GRAPH_WEIGHTS = (0.5, 1.0, 1.5, 2.0)


def graph_weights(
    ranked: dict[str, dict[str, Ranked]], walked: dict[str, Ranked]
) -> dict[str, dict[str, Ranked]]:
    """Plain RRF of BM25, dense and the graph walk's list (top 10 each), the graph weighted
    by each of GRAPH_WEIGHTS; questions the walk did not answer (no seeds) keep BM25 + dense."""
    out: dict[str, dict[str, Ranked]] = {}
    for w in GRAPH_WEIGHTS:
        name = f"RRF(BM25, dense, graph x{w:g}) of top 10"
        out[name] = {}
        for qid, lexical in ranked["BM25"].items():
            lists = [lexical[:K], ranked["dense"][qid][:K], walked.get(qid, [])[:K]]
            out[name][qid] = rrf(lists, K, weights=(1.0, 1.0, w))
    return out


Metric = Callable[[Ranked, Sequence[str]], float]
METRICS: dict[str, Metric] = {
    "recall@5": lambda r, e: recall_at(r, e, 5),
    "recall@10": lambda r, e: recall_at(r, e, 10),
    "MRR@10": lambda r, e: reciprocal_rank(r[:10], e),
    "nDCG@10": lambda r, e: ndcg_at(r, e, 10),
}


def score(ranked: dict[str, Ranked], questions: Sequence[Question], metric: Metric) -> float:
    return sum(metric(ranked[q.question_id], q.evidence) for q in questions) / len(questions)


def ms(xs: Sequence[float]) -> str:
    return f"{percentile(xs, 50) * 1e3:.1f} / {percentile(xs, 95) * 1e3:.1f} ms"


def report(
    data: Dataset,
    ranked: dict[str, dict[str, Ranked]],
    took: dict[str, list[float]],
    errors: dict[str, list[str]],
) -> None:
    qs = [q for q in data.questions if q.kind != HELD]
    held = [q for q in data.questions if q.kind == HELD]
    print("| retriever | " + " | ".join(METRICS) + " | returned | p50 / p95 | errors |")
    print("|---" * (len(METRICS) + 4) + "|")
    for name, r in ranked.items():
        cells = [f"{score(r, qs, m):.3f}" for m in METRICS.values()]
        returned = sum(len(r[q.question_id]) for q in qs) / len(qs)
        errs = errors.get(name, [])
        what = f"{len(errs)} ({', '.join(sorted(set(errs)))})" if errs else "0"
        label = (f"`{name}`" if name in (*MODES, GRAPH_MODE, TIME_MODE, *NEIGHBOUR_SETTINGS,
                                         *BUDGET) else
                 f"`{name.split()[0]}` {name.split()[1]}" if name in UNBOUNDED
                 else f"plain {name}")  # fmt: skip
        print(f"| {label} | {' | '.join(cells)} | {returned:.1f} | {ms(took[name])} | {what} |")
    print("\nrecall@10 by question kind (questions):\n")
    kinds = [k for k in KINDS if any(q.kind == k for q in qs)]
    counts = {k: sum(q.kind == k for q in qs) for k in kinds}
    print("| retriever | " + " | ".join(f"{k} ({counts[k]})" for k in kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for name, r in ranked.items():
        cells = [f"{score(r, [q for q in qs if q.kind == k], METRICS['recall@10']):.3f}"
                 for k in kinds]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    r10 = {name: score(r, qs, METRICS["recall@10"]) for name, r in ranked.items()}
    best = max(r10["BM25"], r10["dense"])
    print(f"\ntext/BM25 recall@10: {r10['text'] / r10['BM25']:.3f}"
          f" ({r10['text']:.3f} / {r10['BM25']:.3f})")  # fmt: skip
    print(f"hybrid/max(BM25, dense) recall@10: {r10['hybrid'] / best:.3f}"
          f" ({r10['hybrid']:.3f} / {best:.3f})")  # fmt: skip
    legs = max(r10["text"], r10["semantic"])
    print(f"hybrid/max(text, semantic) recall@10: {r10['hybrid'] / legs:.3f}"
          f" ({r10['hybrid']:.3f} / {legs:.3f}: the fused list against its own legs)")  # fmt: skip
    print(f"unbounded: text/BM25 recall@10: {r10['text unbounded'] / r10['BM25']:.3f};"
          f" hybrid/max(BM25, dense): {r10['hybrid unbounded'] / best:.3f}")  # fmt: skip
    for mode in ("text", "hybrid"):
        differ = sum(ranked[mode][q.question_id] != ranked[f"{mode} unbounded"][q.question_id]
                     for q in qs)  # fmt: skip
        print(f"{mode}: answers that differ with and without the bounds: {differ} of {len(qs)}")
    if held:
        print(f"\nrecall@10 on the held temporal phrasings ({len(held)}), for the temporal goal"
              " only:")  # fmt: skip
        for name, r in ranked.items():
            print(f"  {name}: {score(r, held, METRICS['recall@10']):.3f}")
    served = {name: r for name, r in ranked.items() if name in (*NEIGHBOUR_SETTINGS, *BUDGET)}
    if served:
        every: Metric = lambda r, e: recall_at(r, e, len(r))  # noqa: E731
        print("\nneighbours: the evidence among every record served (neighbours included),"
              " against recall@10 of the top 10 alone:")  # fmt: skip
        for name, r in {"hybrid": ranked["hybrid"], **served}.items():
            returned = sum(len(r[q.question_id]) for q in qs) / len(qs)
            print(f"  {name}: served {score(r, qs, every):.3f}; recall@10"
                  f" {score(r, qs, METRICS['recall@10']):.3f}; {returned:.1f} records returned;"
                  f" p50 / p95 {ms(took[name])}")  # fmt: skip
        print("\n| served, by kind | " + " | ".join(f"{k} ({counts[k]})" for k in kinds) + " |")
        print("|---" * (len(kinds) + 1) + "|")
        for name, r in {"hybrid": ranked["hybrid"], **served}.items():
            cells = [f"{score(r, [q for q in qs if q.kind == k], every):.3f}" for k in kinds]
            print(f"| {name} | " + " | ".join(cells) + " |")
    hops = [q for q in qs if q.kind == "multi_hop"]
    rest = [q for q in qs if q.kind != "multi_hop"]
    if hops:
        print(f"\nrecall@10 on the multi-hop questions ({len(hops)}) and on the rest"
              f" ({len(rest)}):")  # fmt: skip
        for name in (*MODES, GRAPH_MODE):
            if name in ranked:
                print(f"  {name}: multi-hop {score(ranked[name], hops, METRICS['recall@10']):.3f};"
                      f" rest {score(ranked[name], rest, METRICS['recall@10']):.3f}")  # fmt: skip


def report_oracle(
    data: Dataset, ranked: dict[str, dict[str, Ranked]], deep: dict[str, dict[str, Ranked]]
) -> None:
    """What fusion could reach at best: for each depth d, the oracle recall@10 of fusing the
    governed `text` and `semantic` lists cut at d (the evidence in the union of the two, capped
    at the 10 records a list holds: no fusion of them, weighted or learned, can place more),
    and of the union of each list's top 5 (a fixed 5 + 5 interleave, which any rank fusion of
    the depth-10 lists can reach); each against the best single retriever. Depth 10 (and 5)
    reads the modes' own answers at limit 10, deeper depths the same modes asked at limit 50."""
    qs = [q for q in data.questions if q.kind != HELD]
    legs = [ranked["text"], ranked["semantic"]]
    deeper = [deep[name] for name in DEEP]
    differ = sum(deep[name][q.question_id][:K] != ranked[mode][q.question_id]
                 for name, mode in DEEP.items() for q in qs)  # fmt: skip
    rows: dict[str, tuple[list[dict[str, Ranked]], int]] = {
        "the top 5 of each (5 + 5)": (legs, 5),
        **{f"depth {d}": (legs if d == K else deeper, d) for d in ORACLE_DEPTHS},
    }
    r10 = {n: score(ranked[n], qs, METRICS["recall@10"]) for n in ("text", "semantic", "hybrid",
                                                                    "BM25", "dense")}  # fmt: skip
    best, plain = max(r10["text"], r10["semantic"]), max(r10["BM25"], r10["dense"])
    print(f"\nwhat fusion could reach at best: the oracle recall@10 of the governed `text` and"
          f" `semantic` lists, {len(qs)} questions (the evidence in the union of the lists cut at"
          f" depth d, capped at {K}); best single retriever max(text, semantic) {best:.3f},"
          f" max(BM25, dense) {plain:.3f}; 1.25x would need {1.25 * best:.3f}:\n")  # fmt: skip
    print(f"| fused lists | oracle recall@{K} | / max(text, semantic) | / max(BM25, dense) |"
          " records in the union (mean) |")  # fmt: skip
    print("|---" * 5 + "|")
    oracles: dict[str, dict[str, float]] = {}
    for row, (lists, depth) in rows.items():
        oracles[row] = {q.question_id: oracle_recall([r[q.question_id] for r in lists],
                                                     q.evidence, depth, K) for q in qs}  # fmt: skip
        mean = sum(oracles[row].values()) / len(qs)
        pool = sum(len(set().union(*(r[q.question_id][:depth] for r in lists)))
                   for q in qs) / len(qs)  # fmt: skip
        print(f"| {row} | {mean:.3f} | {mean / best:.3f} | {mean / plain:.3f} | {pool:.1f} |")
    print(f"| `hybrid` (the fusion recall makes) | {r10['hybrid']:.3f} |"
          f" {r10['hybrid'] / best:.3f} | {r10['hybrid'] / plain:.3f} | {K} |")  # fmt: skip
    kinds = [k for k in KINDS if any(q.kind == k for q in qs)]
    print("\n| oracle recall@10, by kind | " + " | ".join(
        f"{k} ({sum(q.kind == k for q in qs)})" for k in kinds) + " |")  # fmt: skip
    print("|---" * (len(kinds) + 1) + "|")
    for row, got in oracles.items():
        cells = [sum(got[q.question_id] for q in qs if q.kind == k) /
                 sum(q.kind == k for q in qs) for k in kinds]  # fmt: skip
        print(f"| {row} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    print(f"\nthe legs asked at limit {ORACLE_DEPTHS[-1]}: {differ} of {2 * len(qs)} first {K}"
          f" differ from the answers at limit {K}")  # fmt: skip


def project_graph(url: str, projector: Projector) -> GraphStore | None:
    """The tenant's records into the graph of the environment, if a graph server answers:
    this tenant's nodes wiped and written from the snapshot feed (the rest of the graph is
    left alone); the store, or None."""
    graph = find_graph()
    if graph is None:
        return None
    graph.ensure_schema()
    graph.wipe(TENANT)
    projector.graph = graph
    t = time.perf_counter()
    with connect(db.url_for(url, "benchq_projector")) as conn:
        n = 0
        for rows in projector.snapshot(conn):
            mine = [r for r in rows if r["tenant_id"] == TENANT]
            projector.apply_graph(conn, mine)
            n += len(mine)
    print(f"projected {n} records into the graph in {time.perf_counter() - t:.0f} s", flush=True)
    return graph


def sample(data: Dataset, n: int | None, seed: int) -> Dataset:
    """`n` of the data's questions drawn with `seed`, in their order (all if n is None)."""
    if n is None or n >= len(data.questions):
        return data
    keep = set(random.Random(seed).sample(range(len(data.questions)), n))
    questions = tuple(q for i, q in enumerate(data.questions) if i in keep)
    return Dataset(data.seed, data.conversations, questions)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--conversations", type=int, default=None,
                    help="10 by default; FriendsQA: every episode (17)")  # fmt: skip
    ap.add_argument("--turns", type=int, default=300, help="turns per conversation (at least)")
    ap.add_argument("--questions", type=int, default=None, help="a seeded sample (all if unset)")
    ap.add_argument("--quick", action="store_true", help="2 conversations, 60 questions")
    ap.add_argument("--keep", action="store_true", help=f"keep the database {DBNAME}")
    ap.add_argument("--also", default="", help="more embedder kinds as plain dense baselines,"
                    " e.g. minilm-static (memfabric.embedding.embedder_from_settings)")  # fmt: skip
    ap.add_argument("--embedder", default="e5", choices=("e5", "minilm", "minilm-static"),
                    help="the deployment's embedder (default e5, a new deployment's): the"
                    " projector, the questions of the governed modes and the plain dense"
                    " baseline embed with it")  # fmt: skip
    ap.add_argument("--baselines-only", action="store_true", help="the plain retrievers"
                    " only (no database): compare embedders (--also) quickly")  # fmt: skip
    ap.add_argument("--lexical-top", type=int, default=None, help="the deployment's"
                    " recall_lexical_top for the bounded modes (default: its default)")  # fmt: skip
    ap.add_argument("--friendsqa", type=Path, default=None, metavar="DIR", help="a checkout of"
                    " FriendsQA: its episodes and questions instead of the synthetic set"
                    " (--conversations episodes, --questions a seeded sample)")  # fmt: skip
    ap.add_argument("--neighbours", default=NEIGHBOURS_DEFAULT, metavar="TxN[,...]",
                    help="settings of hybrid+neighbours: T turns each side of each of the first"
                    f" N records served (default {NEIGHBOURS_DEFAULT}; '' for none)")  # fmt: skip
    args = ap.parse_args()
    for setting in filter(None, args.neighbours.split(",")):
        turns, of = (int(x) for x in setting.split("x"))
        name = NEIGHBOUR_MODE if setting == NEIGHBOURS_DEFAULT else f"{NEIGHBOUR_MODE} {setting}"
        NEIGHBOUR_SETTINGS[name] = {"turns": turns, "of": of}
        if setting == NEIGHBOURS_DEFAULT:
            BUDGET[f"hybrid limit {K + 2 * turns * of}"] = K + 2 * turns * of
    if args.quick:
        args.conversations, args.questions = 2, args.questions or 60
    t0 = time.perf_counter()
    if args.friendsqa:
        data = sample(friendsqa.load(args.friendsqa, args.conversations), args.questions, args.seed)
        source = f"FriendsQA ({args.friendsqa})"
    else:
        data = generate(args.seed, args.conversations or 10, args.turns, args.questions)
        source = f"the synthetic set, seed {args.seed}"
    n_turns = sum(len(c.turns) for c in data.conversations)
    print(f"{source}: {len(data.conversations)} conversations, {n_turns} turns,"
          f" {len(data.questions)} questions in {time.perf_counter() - t0:.2f} s")  # fmt: skip
    server = db.database_url()
    emb, known = embedder_from_settings(args.embedder), {}
    print("baselines: embedding the turns and questions ...", flush=True)
    also = {k: embedder_from_settings(k) for k in args.also.split(",") if k and k != args.embedder}
    for other in (emb, *also.values()):
        other.embed(["warm up"])  # loads (or derives) its model outside the timing
    ranked, took = baselines(data, known, emb, also, args.embedder)
    if args.baselines_only:
        report_baselines(data, ranked, n_turns)
        return 0
    print(f"fresh database {DBNAME}: migrate ...", flush=True)
    url = fresh_database(server)
    tmp = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    store = EdgeVectorStore(tmp / "edge")
    try:
        setup(url)
        with connect(url, "benchq_admin") as admin:  # the deployment's embedder, as an
            call(admin, "SELECT fabric_api.configure_deployment(%s)",  # operator sets it
                 Jsonb({"embedder": args.embedder}))  # fmt: skip
        t = time.perf_counter()
        runs, turn_of = load(url, data)
        load_s = time.perf_counter() - t
        print(f"loaded {len(turn_of)} records through propose + commit in {load_s:.0f} s",
              flush=True)  # fmt: skip
        store.ensure_collections(emb.model, emb.version, emb.dims)
        projector = Projector(db.url_for(url, "benchq_projector"), Primed(emb, known), store)
        t = time.perf_counter()
        projected = projector.rebuild("qdrant")
        print(f"projected {projected} records into Qdrant Edge in"
              f" {time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
        if args.lexical_top is not None:
            with connect(url, "benchq_admin") as admin:
                call(admin, "SELECT fabric_api.configure_deployment(%s)",
                     Jsonb({"recall_lexical_top": args.lexical_top}))  # fmt: skip
        n_modes = (len(MODES) + len(UNBOUNDED) + 1 + len(NEIGHBOUR_SETTINGS) + len(BUDGET)
                   + len(DEEP))  # fmt: skip
        print(f"asking {len(data.questions)} questions x {n_modes} modes"
              " ...", flush=True)  # fmt: skip
        graph = project_graph(url, projector)
        broker = LocalBroker(store, emb, {})
        print(f"asking {GRAPH_MODE} too" if graph else f"no graph server: no {GRAPH_MODE}",
              flush=True)  # fmt: skip
        got, took_g, errors = governed(url, data, runs, turn_of, broker, graph)
        cpu, pg = machine(url)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if not args.keep:
            with connect(server) as su:
                su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(DBNAME)))  # fmt: skip
    loadavg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {cpu}; {pg}; load average {loadavg}")
    print(f"{source}, {len(data.conversations)} conversations, {n_turns} turns,"
          f" {len(data.questions)} questions; limit {K}; embedder {args.embedder}"
          f" ({emb.model})\n")  # fmt: skip
    if WALKED:
        weighted = graph_weights(ranked, WALKED)
        ranked |= weighted
        took |= {name: [0.0] for name in weighted}
    deep = {name: got.pop(name) for name in DEEP}
    for name in DEEP:
        del took_g[name]
        if errors.pop(name):
            print(f"{name}: errors: the oracle below counts their questions as found nothing")
    report(data, {**got, **ranked}, {**took_g, **took}, errors)
    report_oracle(data, {**got, **ranked}, deep)
    embedding_rates(n_turns)
    return 0


def embedding_rates(n_turns: int) -> None:
    print(f"\nembedding the {n_turns} turns, one batch per conversation; each question alone:")
    for name, sec in EMBED_RATE.items():
        print(f"  {name}: {n_turns / sec:.0f} texts/s; query {ms(QUERY_TIME[name])} p50 / p95")


def report_baselines(data: Dataset, ranked: dict[str, dict[str, Ranked]], n_turns: int) -> None:
    """recall@10 of each plain retriever, overall and by kind, and the embedders' speed."""
    qs = [q for q in data.questions if q.kind != HELD]
    kinds = [k for k in KINDS if any(q.kind == k for q in qs)]
    print("| retriever | recall@10 | MRR@10 | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 3) + "|")
    for name, r in ranked.items():
        cells = [f"{score(r, [q for q in qs if q.kind == k], METRICS['recall@10']):.3f}"
                 for k in kinds]  # fmt: skip
        overall = (
            f"{score(r, qs, METRICS['recall@10']):.3f} | {score(r, qs, METRICS['MRR@10']):.3f}"
        )
        print(f"| {name} | {overall} | " + " | ".join(cells) + " |")
    embedding_rates(n_turns)


if __name__ == "__main__":
    raise SystemExit(main())
