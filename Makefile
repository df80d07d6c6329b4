# The two commands the README starts with. Both set up the virtual environment first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench clean

# setup.py and the C source: the fast decoder (tailwatch/ingest/_columnar.c) is compiled at install.
$(STAMP): pyproject.toml dev/pyproject.toml setup.py tailwatch/ingest/_columnar.c
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]' -e './dev[bench]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tailwatch demo

# Test processes for `make test` (pytest-xdist), each with an embedded broker of its own. More
# than the cores: a broker test spends most of its time waiting on workers and the broker.
TEST_PROCESSES ?= 3

# Every test, the 25 slowest printed at the end: those marked `alone` first, by themselves (they
# fail under the CPU contention of a parallel run), then the rest in parallel.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -m "alone and not gpu" --durations=25
	$(VENV)/bin/python -m pytest -n $(TEST_PROCESSES) -m "not alone and not gpu" --durations=25

# The edit loop: the tests that need no broker and are not marked slow, one process per core.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n auto -m "not broker and not slow and not gpu" --durations=10

bench: $(STAMP)
	$(VENV)/bin/tailwatch bench

clean:
	rm -rf $(VENV) data
