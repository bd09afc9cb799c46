# The two commands a new machine needs: `make serve` and `make test`.
# Both create or refresh ./.venv first (scripts/setup-venv.sh).
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup test-deps serve test test-slow lint bench

setup:
	@scripts/setup-venv.sh

# The system packages the tests drive (libopus, espeak-ng, sox, chromium, haproxy, node).
test-deps:
	@scripts/setup-test-deps.sh

serve: setup
	$(BIN)/duplex-actors serve $(ARGS)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

# The system packages (apt: mostly waiting on the network) go in beside the venv and lint (CPU).
test:
	@$(MAKE) --no-print-directory -j2 test-deps lint
	scripts/run-tests.sh $(ARGS)

# Opt-in: the slow checks too (GPU-only tests still need -m gpu on a CUDA machine).
test-slow: setup test-deps
	$(BIN)/python -m pytest -m "slow or not slow and not gpu" $(ARGS)

bench: setup
	$(BIN)/python bench/engine.py
