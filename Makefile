# `make demo` and `make test` work on a fresh clone: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HC := $(VENV)/bin/hiercoll
# The CPU build of torch (on disk on our CPU machines); a bare `torch` pulls GBs of CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
OUT ?= out/demo

.PHONY: demo test install clean fuzz

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

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
