# `make demo` and `make test` work on a fresh clone: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HC := $(VENV)/bin/hiercoll
# torch is pinned to one release, torch==2.13.0, and its CPU build: TORCH_CPU from the wheel on
# disk (our CPU machines), else from PyTorch's CPU wheel index (~200 MB). Only where neither
# answers does pip take PyPI's torch==2.13.0, the CUDA build (several GB), and it says so.
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_PYPI ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
OUT ?= out/demo

.PHONY: demo test install resolve clean fuzz

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if $(PY) -m pip install -q "$(TORCH_CPU)" 2>/dev/null; then \
	  echo "torch: $(TORCH_CPU), the CPU build"; \
	elif $(PY) -m pip install -q --timeout 20 --retries 1 --extra-index-url "$(TORCH_CPU_INDEX)" \
	    "$(TORCH_CPU)" 2>/dev/null; then echo "torch: $(TORCH_CPU) from PyTorch's CPU index"; \
	else echo "torch: no CPU build reachable; installing PyPI's $(TORCH_PYPI), the CUDA build (GBs)"; \
	  $(PY) -m pip install -q "$(TORCH_PYPI)"; fi
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The dev install resolves on any Linux x86-64 machine with PyPI, not only with this machine's pip
# configuration (wheels on disk, extra indexes): resolved with all of that off, where PyPI's
# $(TORCH_PYPI) is the CUDA build, which pins its own triton.
resolve: $(VENV)/.installed
	env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT \
	  PIP_CONFIG_FILE=/dev/null $(PY) -m pip install --dry-run --ignore-installed --quiet \
	  "$(TORCH_PYPI)" -e '.[dev]'
	@echo "resolve: $(TORCH_PYPI) -e '.[dev]' resolves from PyPI alone"

demo: $(VENV)/.installed
	@mkdir -p $(OUT)
	$(HC) topo show dgx-h100 --nodes 2
	$(HC) plan -t dgx-h100 -n 2 -c reduce_scatter -b 64MiB -a hier -o $(OUT)/rs_hier.json
	$(HC) verify $(OUT)/rs_hier.json
	$(HC) simulate $(OUT)/rs_hier.json --trace $(OUT)/rs_hier.trace.json --png $(OUT)/rs_hier.png
	$(HC) plan -t dgx-h100 -n 2 -c reduce_scatter -b 64MiB -a ring -p channels=8 -o $(OUT)/rs_ring.json
	$(HC) simulate $(OUT)/rs_ring.json
	$(HC) autopick -t dgx-h100 -n 2 -c all_reduce --sizes 64KiB:256MiB:4

# Lint and types first: a wrong import or a type error fails in seconds, not after the suite.
test: $(VENV)/.installed
	$(VENV)/bin/ruff check hiercoll tests bench
	$(VENV)/bin/mypy hiercoll
	$(PY) -m pytest

# The long fuzz profile (tests/fuzz); figures go to bench/results/fuzz.md.
fuzz: $(VENV)/.installed
	$(PY) -m tests.fuzz --cases 5000 --seed 1

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
