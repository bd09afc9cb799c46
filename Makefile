# The two commands a new machine needs: `make serve` and `make test`.
# Both create or refresh ./.venv first (scripts/setup-venv.sh).
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup serve test test-slow lint bench

setup:
	@scripts/setup-venv.sh

serve: setup
	$(BIN)/duplex-actors serve $(ARGS)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest $(ARGS)

# Opt-in: the slow checks too (GPU-only tests still need -m gpu on a CUDA machine).
test-slow: setup
	$(BIN)/python -m pytest -m "slow or not slow and not gpu" $(ARGS)

bench: setup
	$(BIN)/python bench/engine.py
