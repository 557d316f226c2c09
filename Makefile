# One Makefile for people and CI: `make demo`, `make test`, `make lint`, `make bench`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint format bench bench-peers soak mcp-servers all clean

# pip 25.1 is the first to install PEP 735 dependency groups (`--group`).
$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade 'pip>=25.1'

# The core install alone, as a user gets it: `make demo` needs no extra.
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# The extras the tests exercise, and the `dev` dependency group (test tools, linters,
# the benchmarks and the peer frameworks, whose smoke test runs with the tests).
DEV_EXTRAS := postgres,openai,anthropic,mcp,web,otel
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[$(DEV_EXTRAS)]' --group dev
	touch $@ $(VENV)/.base

demo: $(VENV)/.base  ## run the offline demo on the embedded SQLite store
	$(BIN)/tether demo

# Two test processes: most tests wait on the subprocesses they start, so two keep a
# 2-core machine busy; each test has its own schema, folders and ports. TEST_JOBS=0 runs
# them in this process (for a debugger).
TEST_JOBS ?= 2
test: $(VENV)/.dev  ## run every test tier (PostgreSQL ones need TETHER_TEST_PG_URL)
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist worksteal

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: $(VENV)/.dev
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

bench: $(VENV)/.dev  ## benchmarks, printed side by side with their floors
	$(BIN)/python benchmarks/run_all.py

soak: $(VENV)/.dev  ## a long task killed at random and resumed (SOAK_ARGS="--full --store postgres")
	$(BIN)/python benchmarks/soak.py $(SOAK_ARGS)

bench-peers: $(VENV)/.dev  ## tether, LangGraph and DBOS on the same agent loop (PEERS_ARGS="--n 100,1000,2000")
	$(BIN)/python benchmarks/peers/run.py $(PEERS_ARGS)

# Real third-party MCP servers for tests/integration/test_mcp_real_servers.py, pinned
# (tests/mcp_servers/), each kind in a place of its own so their dependencies never meet
# tether's. The tests find them here, or where TETHER_MCP_SERVERS says.
MCP_SERVERS := .mcp-servers
$(MCP_SERVERS)/.ready: tests/mcp_servers/requirements.txt tests/mcp_servers/package.json tests/mcp_servers/package-lock.json
	rm -rf $(MCP_SERVERS)
	$(PY) -m venv $(MCP_SERVERS)/py
	$(MCP_SERVERS)/py/bin/pip install -q -r tests/mcp_servers/requirements.txt
	mkdir -p $(MCP_SERVERS)/npm
	cp tests/mcp_servers/package.json tests/mcp_servers/package-lock.json $(MCP_SERVERS)/npm/
	npm ci --prefix $(MCP_SERVERS)/npm --no-audit --no-fund --loglevel=error
	touch $@

mcp-servers: $(MCP_SERVERS)/.ready  ## the third-party MCP servers the MCP tests run against

all: lint test

clean:
	rm -rf $(VENV) $(MCP_SERVERS) .pytest_cache .mypy_cache .ruff_cache build *.egg-info src/*.egg-info
