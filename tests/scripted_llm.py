"""A TEST DOUBLE: a scripted OpenAI-compatible chat endpoint, a real HTTP server on loopback
that answers `/v1/chat/completions` from a fixture instead of a model.

It stands in for a model so the tests can say exactly what "the model" answers (good,
adversarial, malformed, slow) and assert what the fabric does with it. It knows the prompts
of memfabric.formation only as far as a fixture needs:

- a stage is the request's `response_format.json_schema.name` (generate, critique, revise);
- a rule `{"stage", "contains", "answer" | "raw", "delay"}` answers the first request of that
  stage whose user prompt contains `contains` (the episode's text): `answer` is an object sent
  as JSON (an assertion may name `"target_key": k` instead of a handle: the double writes the
  handle the prompt shows for key k, as an oracle would), `raw` is sent as is (malformed
  JSON, truncated answers), `delay` seconds are waited first;
- without a rule, generate answers no assertions, critique supports every draft, and revise
  repeats the drafts it was given (the oracle's ceiling: what generate said is proposed).

`requests` keeps every request body, so a test can check what a model was shown.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]


def _handle_for(prompt: str, key: str) -> str:
    found = re.search(r"^(A\d+): key=" + re.escape(key) + r" ", prompt, re.M)
    return found.group(1) if found else ""


def _resolve(answer: Json, prompt: str) -> Json:
    answer = json.loads(json.dumps(answer))
    for a in answer.get("assertions", []):
        if "target_key" in a:
            a["target"] = _handle_for(prompt, a.pop("target_key"))
    return answer


def _default(stage: str, prompt: str) -> Json:
    if stage == "critique":
        drafts = re.findall(r"^(D\d+): ", prompt, re.M)
        return {"verdicts": [{"draft": d, "supported": True, "note": ""} for d in drafts]}
    if stage == "revise":
        block = prompt.split("Drafts that E1 supports:\n", 1)[1].split("\n\nCritique notes:", 1)[0]
        return {"assertions": [json.loads(line) for line in block.splitlines() if line.strip()]}
    return {"assertions": []}


class ScriptedLLM:
    """The test double's state: its rules, its URL, what it was asked."""

    def __init__(self, rules: list[Json] | None = None) -> None:
        self.rules = list(rules or [])
        self.requests: list[Json] = []
        self.url = ""
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def script(self, rules: list[Json]) -> None:
        """Answer from these rules from now on."""
        with self._lock:
            self.rules, self._used = list(rules), set()

    def answer(self, body: Json) -> tuple[str, float]:
        stage = body["response_format"]["json_schema"]["name"]
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        with self._lock:
            self.requests.append(body)
            for i, rule in enumerate(self.rules):
                if i in self._used or rule.get("stage", "generate") != stage:
                    continue
                if rule.get("contains", "") not in prompt:
                    continue
                if not rule.get("repeat"):
                    self._used.add(i)
                if "raw" in rule:
                    return str(rule["raw"]), float(rule.get("delay", 0))
                return json.dumps(_resolve(rule["answer"], prompt)), float(rule.get("delay", 0))
        return json.dumps(_default(stage, prompt)), 0.0


@contextmanager
def scripted_llm(rules: list[Json] | None = None) -> Iterator[ScriptedLLM]:
    """Serve the test double on 127.0.0.1 (a free port) for the block."""
    double = ScriptedLLM(rules)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content, delay = double.answer(body)
            time.sleep(delay)
            reply = json.dumps(
                {
                    "id": "scripted",
                    "object": "chat.completion",
                    "model": "scripted-oracle",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(json.dumps(body["messages"])) // 4,
                        "completion_tokens": len(content) // 4,
                    },
                }
            ).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (a timeout under test)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    double.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
