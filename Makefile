# The two commands a new user runs: `make demo` and `make test`. Each does its own set-up in .venv.
# GPU users: install your CUDA build of torch into .venv first (see README); an importable torch
# in .venv is kept as it is, so the CPU pin below only applies to a fresh environment.

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
NPROC       ?= 2
EPOCHS      ?= 100
BIN         := $(VENV)/bin

.PHONY: demo test check lint typecheck unit clean

demo: $(VENV)/.examples-installed
	rm -rf runs/wine-demo  # the demo trains from scratch each time; its own scratch folder
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} \
	  $(BIN)/ddpkit run --nproc $(NPROC) examples/wine.py --epochs $(EPOCHS) --checkpoint-dir runs/wine-demo

# Everything CI runs: lint, types, and every test tier (GPU tests skip without a GPU).
test: $(VENV)/.test-installed lint typecheck
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest $(PYTEST_ARGS)

# The edit-test loop (under 2 minutes): lint, types, the unit tier and the doctests.
check: $(VENV)/.test-installed lint typecheck unit

unit: $(VENV)/.test-installed
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest tests/unit src/ddpkit $(PYTEST_ARGS)

# ruff, and the import-linter contracts in pyproject.toml (the layers of docs/architecture.md).
lint: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

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
