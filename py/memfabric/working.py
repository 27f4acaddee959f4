"""The working tier: hot, per-run state in Redis (the session buffer, dedup windows and
idempotency keys of the agent-facing surfaces). It is never a source of truth: every key
has a TTL, recall never reads it, and the only way from here into durable memory is the
explicit hand-off (`handoff`, one call of fabric_api.handoff).

Keys are tenant-first, `mf:{tenant}:...`, and a tenant's workers connect as a Redis ACL user
that can touch only `mf:{tenant}:*` (`grant_tenant`). A subject appears in a key only as the
keyed segment the database gives for the run (`run_ref`, fabric_api.working_key: an HMAC
under the subject's key), so a subject erasure finds its keys without Redis ever holding the
subject id, and once the erasure destroyed the key nothing links them to the subject.

That user writes only with SETEX/PSETEX, so it cannot make a key without a TTL
(`TENANT_COMMANDS`); the admin's `cap_ttls` bounds how long a TTL may be.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import redis
from psycopg.types.json import Jsonb

from memfabric.call import fabric_call
from memfabric.settings import Settings

Json = dict[str, Any]
T = TypeVar("T")

TURN_TTL = 6 * 3600  # a session buffer outlives any run it serves, then goes
DEDUP_TTL = 15 * 60
IDEMPOTENCY_TTL = 24 * 3600
MAX_TURNS = 200
# The session buffer's key suffix: a JSON array written whole. (Up to 0.11 the buffer was a
# list under `turns`, which a tenant's user can no longer write; such keys expire unread.)
BUFFER = "buffer"
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")  # fabric.tenant_ident: no glob characters
_SUBJECT_KEY = re.compile(r"^(w-[0-9a-f]{32}|anon)$")  # fabric._working_key
_LEGACY_SUBJECT_KEY = re.compile(r"^s-[0-9a-f]{32}$")  # fabric._working_subject_key (0.11)
# What a tenant's worker may run: data commands on its own keys, nothing administrative,
# nothing that lists keys (SCAN and KEYS ignore key patterns). The only commands that write
# a key are SETEX and PSETEX, which always give it a TTL: a Redis ACL cannot tell SET … EX
# from a plain SET (nor RPUSH followed by EXPIRE from RPUSH alone), and a script runs with
# its caller's ACL, so no other command that creates a key, or PERSIST, is granted. Every
# value is therefore a string written whole (the session buffer is a JSON array), under
# WATCH/MULTI where it must not overwrite (first_seen, remember_response, append_turn).
TENANT_COMMANDS = [
    *("get", "setex", "psetex", "del", "unlink", "exists", "ttl", "pttl"),
    *("multi", "exec", "discard", "watch", "unwatch"),
    *("ping", "echo", "client|setname"),
]


class WorkingTierUnavailable(Exception):
    """Redis cannot be reached: the working tier is degraded, durable memory is not."""

    def __init__(self, detail: str):
        super().__init__(
            f"the working tier (Redis) is unavailable ({detail}); "
            "propose, commit and recall do not depend on it"
        )


@dataclass(frozen=True)
class RunRef:
    """The run whose working state this is (what the orchestrator opened). `subject_key` is
    the run's key segment as the database gives it (`run_ref`); a run with a subject needs
    it, a run without one is `anon`."""

    tenant_id: str
    run_id: str
    subject_id: str | None = None
    session_id: str | None = None
    subject_key: str | None = None


def run_ref(conn: psycopg.Connection[Any], run_id: str) -> RunRef:
    """The agent's open run with its working-tier key segment (fabric_api.working_key on
    the agent's own connection): w- and 32 hex keyed by the subject's key, or anon."""
    answer: Json = fabric_call(conn, "fabric_api.working_key", run_id)
    return RunRef(answer["tenant_id"], str(answer["run_id"]), subject_key=answer["subject_key"])


def _subject_segment(run: RunRef) -> str:
    if run.subject_key is not None:
        if not _SUBJECT_KEY.match(run.subject_key):
            raise ValueError("a run's subject key is w- and 32 hex digits, or anon")
        return run.subject_key
    if run.subject_id is None:
        return "anon"
    raise ValueError(
        "a run with a subject names its keys by the database's keyed segment: "
        "take the RunRef from working.run_ref(conn, run_id)"
    )


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def _tenant(tenant_id: str) -> str:
    if not _TENANT.match(tenant_id):
        raise ValueError("tenant ids are lowercase slugs ([a-z0-9][a-z0-9_-]*)")
    return tenant_id


def _atomically(client: redis.Redis, fn: Callable[[Any], T], *watched: str) -> T:
    """`fn(pipe)` under WATCH of `watched` (it reads, then queues its writes after
    `pipe.multi()`), run again if a watched key moved before its EXEC; what `fn` returned."""
    result: T = client.transaction(fn, *watched, value_from_callable=True)  # type: ignore[arg-type,assignment]
    return result


@contextmanager
def _available() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise WorkingTierUnavailable(type(exc).__name__) from exc


def default_url() -> str | None:
    """REDIS_URL, else the local server of scripts/redis.sh when it was started here."""
    settings = Settings.from_env()
    if settings.redis_url:
        return settings.redis_url
    pw = settings.redis_dir / "admin.password"
    if pw.is_file():
        return f"redis://default:{pw.read_text().strip()}@127.0.0.1:{settings.redis_port}/0"
    return None


def connect(url: str, timeout: float = 2.0) -> redis.Redis:
    """A client that fails fast (a down Redis must not stall a run)."""
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def check_uri(conn: psycopg.Connection[Any], tenant_id: str, url: str) -> None:
    """The database's air-gapped rule for this Redis URI (23514 when not local)."""
    fabric_call(conn, "fabric_api.check_working_uri", tenant_id, url)


def open_tier(conn: psycopg.Connection[Any], tenant_id: str, url: str | None = None) -> WorkingTier:
    """The tenant's working tier at `url` (default: REDIS_URL or the local server), after
    the database has allowed that URI for the tenant (the air-gapped rule)."""
    url = url or default_url()
    if url is None:
        raise WorkingTierUnavailable("no REDIS_URL and no local server")
    check_uri(conn, tenant_id, url)
    return WorkingTier(connect(url), tenant_id)


class WorkingTier:
    """One tenant's working memory. `client` is that tenant's ACL user (or the admin)."""

    def __init__(self, client: redis.Redis, tenant_id: str):
        self.client = client
        self.tenant_id = _tenant(tenant_id)

    def _key(self, run: RunRef, *parts: str) -> str:
        if run.tenant_id != self.tenant_id:
            raise ValueError("the run belongs to another tenant than this working tier")
        return ":".join(("mf", self.tenant_id, _subject_segment(run), *parts))

    # -- the session buffer -------------------------------------------------------------
    def append_turn(self, run: RunRef, turn: Json, ttl: int = TURN_TTL) -> None:
        """Add one turn (it needs its `event_id`: a turn is something that happened)."""
        if not isinstance(turn.get("event_id"), str):
            raise ValueError("a turn needs its event_id")
        key = self._key(run, "run", run.run_id, BUFFER)

        def append(pipe: Any) -> None:  # read, then write the buffer whole, unless it moved
            held = pipe.get(key)
            turns = [*(json.loads(held) if held else []), turn][-MAX_TURNS:]
            pipe.multi()
            pipe.setex(key, ttl, json.dumps(turns, sort_keys=True))

        with _available():
            _atomically(self.client, append, key)

    def turns(self, run: RunRef) -> list[Json]:
        """The run's recent turns, oldest first ([] once they expired or were flushed)."""
        with _available():
            raw = self.client.get(self._key(run, "run", run.run_id, BUFFER))
        held: list[Json] = json.loads(raw) if raw else []
        return held

    # -- dedup windows ------------------------------------------------------------------
    def first_seen(self, run: RunRef, window: str, token: str, ttl: int = DEDUP_TTL) -> bool:
        """True the first time `token` is seen in `window` within ttl seconds."""
        key = self._key(run, "dedup", _digest(window), _digest(token))

        def claim(pipe: Any) -> bool:  # SET NX EX, in the commands a tenant's user has
            if pipe.exists(key):
                return False
            pipe.multi()
            pipe.setex(key, ttl, b"1")
            return True

        with _available():
            return _atomically(self.client, claim, key)

    # -- idempotency keys of the agent-facing surfaces ----------------------------------
    def remember_response(
        self, run: RunRef, surface: str, key: str, response: Json, ttl: int = IDEMPOTENCY_TTL
    ) -> Json:
        """Store the answer to a request under its idempotency key, unless one is there:
        returns the answer that holds (the first one). Answers carry ids, not content."""
        rkey = self._key(run, "idem", _digest(surface), _digest(key))

        def keep_first(pipe: Any) -> Json:
            held = pipe.get(rkey)
            if held is not None:
                first: Json = json.loads(held)
                return first
            pipe.multi()
            pipe.setex(rkey, ttl, json.dumps(response, sort_keys=True))
            return response

        with _available():
            return _atomically(self.client, keep_first, rkey)

    def response_for(self, run: RunRef, surface: str, key: str) -> Json | None:
        with _available():
            held = self.client.get(self._key(run, "idem", _digest(surface), _digest(key)))
        return None if held is None else json.loads(held)


def session_items(working: WorkingTier, run: RunRef) -> list[Json]:
    """The run's session buffer as handoff items (each turn's event_id, correlation_id,
    causation_id, content and time)."""
    keys = ("event_id", "correlation_id", "causation_id", "content", "occurred_at")
    return [{k: t[k] for k in keys if k in t} for t in working.turns(run)]


def handoff(
    conn: psycopg.Connection[Any],
    run: RunRef,
    items: Sequence[Json] | None = None,
    working: WorkingTier | None = None,
) -> list[Json]:
    """Propose working items as raw episodes (fabric_api.handoff on the agent's own
    connection). Without `items`, the run's session buffer is handed off; each turn's
    event_id, correlation_id, causation_id and content become the item. Once committed,
    each emits memory.record.promoted (from_tier working). An item handed off before
    answers its first proposal (`replayed`), unless that one was rejected: then it is judged
    again."""
    if items is None:
        if working is None:
            raise ValueError("pass the items, or the working tier to read the run's turns from")
        items = session_items(working, run)
    if not items:
        return []
    answers: list[Json] = fabric_call(conn, "fabric_api.handoff", Jsonb(list(items)), run.run_id)
    return answers


# -- administration (the default user of the server) ---------------------------------------
def tenant_user(tenant_id: str) -> str:
    return f"mf-{_tenant(tenant_id)}"


def grant_tenant(admin: redis.Redis, tenant_id: str) -> str:
    """Create or reset the tenant's ACL user (keys `mf:{tenant}:*` only, data commands
    only); returns its new password, which is shown once and not stored by the server."""
    password = secrets.token_hex(24)
    rules = ["reset", "on", "resetpass", f">{password}", "resetkeys", f"~mf:{_tenant(tenant_id)}:*"]
    rules += ["resetchannels", "-@all", *(f"+{c}" for c in TENANT_COMMANDS)]
    with _available():
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", tenant_user(tenant_id), *rules
        )
    return password


def tenant_url(admin_url: str, tenant_id: str, password: str) -> str:
    """The admin URL with the tenant's user and password in place of the admin's."""
    rest = admin_url.split("://", 1)[1].rsplit("@", 1)[-1]
    return f"redis://{tenant_user(tenant_id)}:{password}@{rest}"


def erase_subject(
    admin: redis.Redis, tenant_id: str, subject_key: str, legacy_subject_key: str | None = None
) -> Json:
    """Delete every working key of one subject: those under its keyed segment and, when
    given, those written by 0.11 or earlier under the unkeyed digest (`legacy_subject_key`). Answers
    the count and the keyed pattern only: the unkeyed digest confirms a guessed subject id,
    so it is never part of a receipt."""
    if not re.fullmatch(r"w-[0-9a-f]{32}", subject_key):
        raise ValueError("a subject key is w- and 32 hex digits")
    if legacy_subject_key is not None and not _LEGACY_SUBJECT_KEY.match(legacy_subject_key):
        raise ValueError("a legacy subject key is s- and 32 hex digits")
    tenant = _tenant(tenant_id)
    pattern = f"mf:{tenant}:{subject_key}:*"
    patterns = [pattern] + ([f"mf:{tenant}:{legacy_subject_key}:*"] if legacy_subject_key else [])
    deleted = 0
    with _available():
        for match in patterns:
            batch: list[bytes] = []
            for key in admin.scan_iter(match=match, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += int(admin.unlink(*batch))
                    batch = []
            if batch:
                deleted += int(admin.unlink(*batch))
    return {"working_keys_deleted": deleted, "patterns": [pattern]}


def cap_ttls(admin: redis.Redis, longest: int = IDEMPOTENCY_TTL) -> Json:
    """Bound the TTL of every working key to `longest` seconds (the tier's longest, by
    default): a tenant's user can only write keys with a TTL (SETEX, PSETEX), but an ACL
    cannot bound its length, so an absurd one is cut back here, by the admin. A key without
    a TTL (written by the admin or before these ACLs) gets one too. Answers the counts."""
    seen = capped = 0
    with _available():
        for key in admin.scan_iter(match="mf:*", count=500):
            seen += 1
            ttl = int(admin.ttl(key))
            # -1: no TTL, -2: gone meanwhile; EXPIRE … LT would be Redis 7 only
            if ttl == -1 or ttl > longest:
                capped += int(admin.expire(key, longest))
    return {"working_keys": seen, "ttl_capped": capped, "longest_ttl_s": longest}


def erasure_scope(conn: psycopg.Connection[Any], approval_id: str) -> Json | None:
    """{"tenant_id", "subject_key", "legacy_subject_key"} of a subject erasure (None for
    other approvals), read on the committer's connection before fabric_api.erase runs (the
    erasure destroys the key the segment is made with)."""
    scope: Json | None = fabric_call(conn, "fabric_api.working_erasure_scope", approval_id)
    return scope


def record_erasure(conn: psycopg.Connection[Any], approval_id: str, answer: Json) -> str:
    """Put the working tier's part of an executed subject erasure (count and patterns) on
    the database's audit record; answers the event id."""
    event_id = fabric_call(
        conn,
        "fabric_api.record_working_erasure",
        approval_id,
        answer["working_keys_deleted"],
        answer["patterns"],
    )
    return str(event_id)
