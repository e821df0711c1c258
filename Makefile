# Ember: two commands that work on a fresh machine.
#   make demo   - virtualenv + install + the Yahoo ad-campaign job for about a minute
#   make test   - virtualenv + install + the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all lint bench chaos venv clean browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m ember.runner.spark.json_compile  # compiles the JSON scanner once into numba's cache
	$(PY) -m ember.runner.spark.worker_imports  # Spark's Python workers import pyspark with its bytecode cache
	$(PY) -m ember.tools.class_archive || echo "the driver's class archive was not built: Ember runs without it"  # Spark's classes mapped, not loaded (~30 s once)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/yahoo_campaigns.py

test: $(STAMP) lint browser
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=40  # two pytest-xdist workers, a test file each at a time

# Debian's chromium and chromium-driver for the dashboard's browser test (installed once, with apt).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  echo "installing Debian's chromium and chromium-driver (the dashboard's browser test)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# Style and types of src/ (ruff, mypy: configured in pyproject.toml); part of `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

bench: $(STAMP)
	$(VENV)/bin/ember bench grep --duration 10 --rounds 6
	$(VENV)/bin/ember bench grouping --duration 20 --rounds 3

# The long E4 chaos run on a standalone cluster: >= 20 kills of driver, executors
# and workers over >= 11 minutes; prints the JSON report (EMBER_CHAOS_KILLS / _DURATION).
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/integration/test_chaos_and_cluster.py::test_long_chaos_on_the_cluster

clean:
	rm -rf $(VENV) ember-checkpoints .pytest_cache
