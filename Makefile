# Two entry points a newcomer needs (see README):
#   make demo   - set up .venv if missing, install, run the embedded CPU demo
#   make test   - set up .venv if missing, install, run the default test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-requirements

.PHONY: demo test test-slow venv clean

venv: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@cp requirements.txt $(STAMP)

demo: $(STAMP)
	$(PY) -m pipeline.demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs prompts/rendered
