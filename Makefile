# phantom: two commands do everything on a fresh machine.
#   make book   set up, run the CPU-scale experiments, build the HTML book   (_build/html/index.html)
#   make test   set up, pass the whole test suite (unit, lab smoke, verl on CPU, strict book build, browser)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,lab,verl,trl,book
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1
export WANDB_MODE := disabled

.PHONY: setup test test-fast book book-quick jupyter lint bench clean help

help:
	@sed -n 2,3p Makefile

## Only the browser test needs Debian's chromium (an apt install on a fresh machine): the book targets
## skip it (a target-specific value reaches the `setup` prerequisite).
SETUP_BROWSER ?= 1
book book-quick: SETUP_BROWSER = 0

setup:
	@PHANTOM_SETUP_BROWSER=$(SETUP_BROWSER) scripts/setup_env.sh "$(PYTHON)" "$(VENV)" "$(EXTRAS)"

## Full test suite (CI runs exactly this). The book part builds the quick profile into _build/test
## (tests/test_book_browser.py) and leaves page screenshots in _build/screens/. Two pytest workers, one
## test file each at a time (--dist loadfile keeps a file's session fixtures in one process): the verl
## runs and the book build wait on subprocesses much of the time, so the suite takes ~0.8x as long on
## 2 cores (benchmarks/results_book.md). TEST_JOBS=0 runs it in this process, one test at a time.
TEST_JOBS ?= 2
test: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile) $(PYTEST_ARGS)

## Unit tests only (no lab runs, no verl, no book build).
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

## The book with the full CPU-lab profile -> _build/html/index.html (vendors JS, runs the lab sweeps
## the chapters need, executes every chapter with papermill, strict jupyter-book build).
book: setup
	$(BIN)/phantom book build --profile full

## The same code path with fewer lab steps and seeds (what the tests build).
book-quick: setup
	$(BIN)/phantom book build --profile quick

## JupyterLab on the chapters and notebooks: jupytext opens the MyST / py:percent sources as notebooks
## (chapters pair with git-ignored .ipynb under book/_build/lab, see book/jupytext.toml); ipywidgets
## controls run in the live kernel. book/_lab/overrides.json makes .md files open as notebooks.
jupyter: setup
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp book/_lab/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	$(BIN)/jupyter lab --notebook-dir=. --ServerApp.allow_root=True

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts

bench: setup
	$(BIN)/python benchmarks/bench_advantages.py
	$(BIN)/python benchmarks/bench_lab.py

clean:
	rm -rf _build .pytest_cache .ruff_cache
