# The two commands a new user runs: `make demo` and `make test`. Each does its own set-up in .venv.
# GPU users: install your CUDA build of torch into .venv first (see README); an importable torch
# in .venv is kept as it is, so the CPU pin below only applies to a fresh environment.

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
NPROC       ?= 2
EPOCHS      ?= 100
BIN         := $(VENV)/bin

.PHONY: demo test lint typecheck unit clean

demo: $(VENV)/.examples-installed
	rm -rf runs/wine-demo  # the demo trains from scratch each time; its own scratch folder
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} \
	  $(BIN)/ddpkit run --nproc $(NPROC) examples/wine.py --epochs $(EPOCHS) --checkpoint-dir runs/wine-demo

test: $(VENV)/.test-installed lint typecheck
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy

$(VENV)/.torch-installed:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.examples-installed: $(VENV)/.torch-installed pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[examples]"
	touch $@

$(VENV)/.test-installed: $(VENV)/.torch-installed pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

clean:
	rm -rf $(VENV) runs .mypy_cache .ruff_cache .pytest_cache src/*.egg-info
