# phantom: two commands do everything on a fresh machine.
#   make book   set up, run the CPU-scale experiments, build the HTML book   (_build/html/index.html)
#   make test   set up, pass the whole test suite (unit, lab smoke, verl on CPU, strict book build, browser)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,lab,verl,book
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1
export WANDB_MODE := disabled

.PHONY: setup test test-fast book book-quick jupyter lint bench clean help

help:
	@sed -n 2,3p Makefile

setup:
	@scripts/setup_env.sh "$(PYTHON)" "$(VENV)" "$(EXTRAS)"

## Full test suite (CI runs exactly this).
test: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## Unit tests only (no lab runs, no verl, no book build).
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

## The book with the full CPU-lab profile.
book: setup
	$(BIN)/phantom book build --profile full

## The same code path with fewer lab steps and seeds (what the tests build).
book-quick: setup
	$(BIN)/phantom book build --profile quick

## JupyterLab on the chapters and notebooks (jupytext pairs the text sources).
jupyter: setup
	$(BIN)/jupyter lab --notebook-dir=. --ServerApp.allow_root=True

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts

bench: setup
	$(BIN)/python benchmarks/bench_advantages.py

clean:
	rm -rf _build .pytest_cache .ruff_cache
