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

up: install
	$(BIN)/gpu-share up

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest
