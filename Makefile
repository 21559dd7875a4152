# make run   - set up everything on a fresh machine (first time only), then run the pipeline on the bundled demo
# make test  - set up if needed, then run the tests
# make lint  - ruff (format check and lint) and mypy over components/ and pipelines/
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gnnflow-installed
PIP := $(BIN)/pip --disable-pip-version-check

.PHONY: setup run test lint lock clean-venv

setup: $(STAMP)

$(STAMP): requirements/lock.txt requirements/source-builds.txt pyproject.toml
	@echo "==> Setting up $(VENV): about 7 GB of pinned packages (torch 2.3.0 brings its CUDA libraries)."
	@echo "==> The first install also compiles torch-scatter and torch-sparse from source:"
	@echo "==> 10 to 25 minutes on 2 cores, side by side (pip caches the wheels, so later installs are quick)."
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar on pip==24.3.1
	$(PIP) install --progress-bar on -r requirements/lock.txt
	# The source builds run side by side, one per core, and torch-sparse's own files compile in
	# parallel through ninja (pinned in the lock); one after the other on one core they took 24 minutes here.
	rm -rf $(VENV)/source-wheels
	pids=""; for requirement in $$(grep -v '^#' requirements/source-builds.txt); do \
	  $(PIP) wheel --quiet --no-deps --no-build-isolation -w $(VENV)/source-wheels "$$requirement" & pids="$$pids $$!"; \
	done; for pid in $$pids; do wait $$pid || exit 1; done
	$(PIP) install --no-index --no-deps --find-links $(VENV)/source-wheels -r requirements/source-builds.txt
	$(PIP) install --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import torch, torch_sparse, graphlearn_torch, tensorflow, kfp, google.cloud.storage; print('==> environment ready: torch', torch.__version__)"
	touch $(STAMP)

run: setup
	$(BIN)/gnnflow run

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

LINTED := components pipelines tests

lint: setup
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy

# Re-resolve the pinned set after changing a direct dependency (keep STACK.md's constraints).
# --all: plain `pip freeze` leaves out setuptools (and wheel), which packages need to install
# (grpcio-tools requires setuptools>=77), and the image's venv seeds an older one. pip itself is
# pinned above, the two source builds in requirements/source-builds.txt. tests/test_lock.py
# checks that the result is closed under dependencies.
lock: setup
	{ sed -n '1,2p' requirements/lock.txt; $(PIP) freeze --all --exclude-editable | grep -viE '^(pip|torch[-_]scatter|torch[-_]sparse)=='; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt

clean-venv:
	rm -rf $(VENV)
