# The two commands the README starts with. Both set up the virtual environment first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench clean

$(STAMP): pyproject.toml dev/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]' -e './dev[bench]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tailwatch demo

# Every test, the 25 slowest printed at the end.
test: $(STAMP)
	$(VENV)/bin/python -m pytest --durations=25

# The edit loop: the tests that need no broker and are not marked slow.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not broker and not slow and not gpu" --durations=10

bench: $(STAMP)
	$(VENV)/bin/tailwatch bench

clean:
	rm -rf $(VENV) data
