# Salience: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MLFLOW_URI ?= $(or $(MLFLOW_TRACKING_URI),sqlite:///mlflow.db)
UI_PORT ?= 5000
# test processes (pytest-xdist); 0 runs the suite in the pytest process itself
TEST_WORKERS ?= 2

.PHONY: venv demo test test-all ui bench clean clean-runs

$(STAMP): requirements/cpu.txt requirements/text.txt pyproject.toml requirements/fbgemm-gpu-shim/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements/cpu.txt
	$(PY) -m pip install --quiet -r requirements/text.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/salience demo

test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-all: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "slow or not slow"

ui: venv
	$(VENV)/bin/mlflow ui --backend-store-uri "$(MLFLOW_URI)" --host 127.0.0.1 --port $(UI_PORT)

bench: venv
	$(VENV)/bin/salience bench train_throughput
	$(VENV)/bin/salience bench quality

# caches and build outputs only (prepared-data caches, the peers' venv, tool caches); runs stay
clean:
	rm -rf .cache .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# every run, checkpoint and the local MLflow store: asked for by name, never by `make clean`
clean-runs:
	rm -rf runs mlflow.db mlruns
