# Two commands on a fresh machine (see README): `make up` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: up test install install-dev lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e '.[all]'

install-dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[all,dev]'

# `make up PORT=9090 HOST=0.0.0.0`: only values given on make's command line count, so a
# HOST or PORT the shell happens to export (often meaning something else) is ignored.
UP_ARGS := $(if $(filter command line,$(origin PORT)),--port $(PORT)) \
	$(if $(filter command line,$(origin HOST)),--host $(HOST))

up: install
	$(strip $(BIN)/gpu-share up $(UP_ARGS))

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# One worker per core (`-n auto`), each taking the next test when it is free: much of
# the suite waits on real processes, agents and browsers. On 2 cores the suite took
# 18 min with two workers (2,880 tests) against 25 min with one (2,627 tests).
test: lint
	$(BIN)/pytest -n auto --dist worksteal
