# Two commands do all set-up on a fresh machine:
#   make quickstart   # build .venv, fine-tune the embedded model on the shipped data (offline)
#   make test         # build .venv, run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned: on our machines `pip install torch==2.13.0` takes a local CPU wheel, while an
# unpinned torch in a fresh venv would download gigabytes of CUDA packages.
TORCH  ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv quickstart test test-fast test-readme test-gpu lint docs docs-deps bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

quickstart: venv
	$(BIN)/finetune train --recipe recipes/quickstart.yaml
	$(BIN)/finetune eval runs/quickstart

# Everything CI runs (unit, integration and slow tests).
test: venv
	$(BIN)/python -m pytest -q --durations=20 tests

# The README walk alone (also part of `make test`): every command of the README and of the docs
# pages, as a newcomer would run it.
test-readme: venv
	FINETUNE_README_WALK=1 $(BIN)/python -m pytest -q tests/integration/test_readme.py

# The inner loop: unit tests only (tiny random models, seconds to a minute).
test-fast: venv
	$(BIN)/python -m pytest -q -m "not integration and not slow" tests

# The GPU tier (tests/gpu): the CUDA paths on a real GPU; skipped where torch sees no CUDA device,
# so `make test` never fails on it. .venv holds a CPU torch (TORCH above): build it with a CUDA one
# (`make test-gpu TORCH=torch`, a fresh .venv) or name a Python that has one (`make test-gpu
# GPU_PYTHON=python3`, with this checkout's requirements installed there).
GPU_PYTHON ?=
test-gpu: $(if $(GPU_PYTHON),,venv)
	$(or $(GPU_PYTHON),$(BIN)/python) -m pytest -q -m gpu tests/gpu

lint: venv
	$(BIN)/ruff check finetune_cli tests bench scripts

# The docs site in site/ (open site/index.html). Strict: a broken link or anchor, or a page missing
# from mkdocs.yml's nav, fails the build. The reference pages are generated from the code at every
# build. The `docs` extra is installed here, so quickstart and test never need it.
# NO_MKDOCS_2_WARNING: Material prints a banner about its successor at every build otherwise.
$(BIN)/.docs-installed: pyproject.toml $(BIN)/.installed
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# The docs extra alone: CI installs it so that `make test` runs the strict docs build
# (tests/integration/test_docs_site.py, which checks more than `make docs`) instead of building twice.
docs-deps: $(BIN)/.docs-installed

bench: venv
	$(BIN)/python bench/train_throughput.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
