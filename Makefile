# Every target CI calls is here; .ci/run calls `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test unit lint proto proto-check bench install clean fuzz

$(STAMP): pyproject.toml deploy/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c deploy/constraints.txt -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

## make run: a local cluster of 3 brokers + a proxy, with a live view (Ctrl-C stops it).
## Another address: make run LISTEN=127.0.0.1:9081 (port 0: any free one, printed).
LISTEN ?= 127.0.0.1:8081
run: $(STAMP)
	$(BIN)/popgate up --brokers 3 --listen $(LISTEN) --data-dir ./data

## make test: install everything the tests need, then lint and run the whole suite, a test file per worker at a
## time (TEST_WORKERS=1: one process, in order). Most of the suite waits on processes it started, so three workers
## on two cores take about 80 % of the time two do (docs/ARCHITECTURE.md, section 6).
TEST_WORKERS ?= 3
test: $(STAMP)
	./deploy/install-test-deps.sh $(VENV)
	$(MAKE) lint
	$(BIN)/python proto/generate.py --check
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests

## make unit: the fast inner loop: pure tests, no sockets (tests/unit/conftest.py refuses them), no processes.
unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

## make fuzz: hypothesis against every RPC of the broker and the proxy, 420 cases each (30 RPCs and streams: >= 12,000).
fuzz: $(STAMP)
	POPGATE_FUZZ_EXAMPLES=420 $(BIN)/python -m pytest -s -q --timeout 900 tests/integration/broker/test_fuzz.py tests/integration/proxy/test_fuzz.py

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy broker proxy sdk spark_metrics proto/popgate_contract proto/popgate_process
	$(BIN)/lint-imports --no-cache

proto: $(STAMP)
	$(BIN)/python proto/generate.py

bench: $(STAMP)
	$(BIN)/python -m bench.broker_bench
	$(BIN)/python -m bench.proxy_bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
