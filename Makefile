# The two commands a new user runs: `make demo` and `make test`. Each does its own set-up in .venv.
# GPU users: install your CUDA build of torch into .venv first (see README); an importable torch
# in .venv is kept as it is, so the CPU pin below only applies to a fresh environment.

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
# The oldest torch pyproject.toml admits: make test also runs the unit tier and the tests marked
# oldest_torch under it, in its own venv (a PyPI CUDA build, ~5.7 GB; built once, then kept).
OLDEST_TORCH ?= 2.7.0
# torchvision of that release: the ImageNet example is tested with torchvision there (no CPU
# build of torchvision imports beside the pinned CPU torch 2.13.0) and without it in .venv.
OLDEST_TORCHVISION ?= 0.22.0
OLDEST_VENV  ?= .venv-torch$(OLDEST_TORCH)
# Every package the two virtualenvs get, pinned: make installs from these constraint files, so
# a fresh clone gets what CI ran. `make lock` resolves them anew (on purpose: then run make test
# and commit them). torch itself is each venv's pin above (a comment in the file), so a CUDA
# build a GPU user put in .venv is kept.
LOCK        ?= constraints/test.txt
OLDEST_LOCK ?= constraints/test-oldest.txt
TEST_EXTRAS ?= test,mlflow,wandb,docs,hf
LOCK_VENV   ?= .venv-lock
NPROC       ?= 2
TEST_WORKERS ?= 2
# pytest-xdist: a module's tests stay on one worker, so a job its module fixture launched is shared.
ON_WORKERS  := -n $(TEST_WORKERS) --dist loadfile
EPOCHS      ?= 100
BIN         := $(VENV)/bin
# pip compiles every module it installs (not --no-compile: where PYTHONDONTWRITEBYTECODE is set, as
# here and in many containers, no import writes one, and every worker compiled torch anew, 700 CPU-s
# more in a fresh clone's parallel pass)
PIP_INSTALL := -m pip install --quiet

.PHONY: demo test test-notice test-oldest check lint typecheck docs unit gpu-check scale lock lock-main lock-oldest clean

demo: $(VENV)/.examples-installed
	rm -rf runs/wine-demo  # the demo trains from scratch each time; its own scratch folder
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} \
	  $(BIN)/ddpkit run --nproc $(NPROC) examples/wine.py --epochs $(EPOCHS) --checkpoint-dir runs/wine-demo

# Everything CI runs: lint, types, and every test tier (GPU tests skip without a GPU).
# Set-up two at a time (make -j2): the two venvs' torch installs side by side, then the oldest
# venv's test tools beside lint, types and docs (its editable install after .venv's, as both write
# src/ddpkit.egg-info). Two passes: on TEST_WORKERS pytest workers, then the tests marked serial
# (they time things) alone.
# Last, what the tests left in the temporary folder (tests/helpers/leftovers.py): none.
# The parallel pass names its 30 slowest tests: where make test's time goes, in CI's log too.
test: test-notice
	$(MAKE) --no-print-directory -j2 $(VENV)/.test-installed $(OLDEST_VENV)/.torch-installed
	$(MAKE) --no-print-directory -j2 --output-sync=target $(OLDEST_VENV)/.test-installed lint typecheck docs
	$(BIN)/python tests/helpers/leftovers.py start
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest -m "not serial" $(ON_WORKERS) \
	  --durations=30 --durations-min=5 $(PYTEST_ARGS)
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest -m serial $(PYTEST_ARGS)
	$(MAKE) test-oldest
	$(BIN)/python tests/helpers/leftovers.py check

# What make test is about to do, said before it does it.
test-notice:
	@echo "make test: installs into $(VENV) (torch $(patsubst torch==%,%,$(TORCH_SPEC)) CPU + test tools, pinned by $(LOCK)) and"
	@echo "  $(OLDEST_VENV) (torch $(OLDEST_TORCH), a ~5.7 GB CUDA build, for test-oldest), each once, then kept;"
	@echo "  as root, the cluster tests install Debian's slurm, munge, OpenMPI and OpenSSH server with apt-get the first time."
	@echo "  Then lint, types, every test tier, and test-oldest: about 28-31 minutes on 2 cores, 55 on a slow day (docs/benchmarks.md)."

# The other end of the supported range: unit tier, doctests, one 2-worker DDP run through
# ddpkit run, resume, a restart after kill -9, SIGUSR1, and an FSDP run with its resume.
test-oldest: $(OLDEST_VENV)/.test-installed
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(OLDEST_VENV)/bin/python -m pytest \
	  -p no:cacheprovider $(ON_WORKERS) tests/unit src/ddpkit $(PYTEST_ARGS)
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(OLDEST_VENV)/bin/python -m pytest \
	  -p no:cacheprovider $(ON_WORKERS) -m oldest_torch tests/multiproc $(PYTEST_ARGS)

# The scale tier at full size: 8, 16, 32 and 64 ranks on this machine (make test runs 8).
SCALE_SIZES ?= 8,16,32,64
scale: $(VENV)/.test-installed
	SCALE_SIZES=$(SCALE_SIZES) GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} \
	  $(BIN)/python -m pytest -p no:cacheprovider -m scale tests/scale -v -s $(PYTEST_ARGS)

# On a GPU machine, with its own Python and nothing installed (docs/development.md): the GPU
# tier and the GPU parity benchmark, at most 9 min 20 s on one GPU, a summary in GPU_CHECK_OUT.
# Without a GPU it is a dry run that proves the wiring (under a minute).
GPU_PYTHON    ?= python3
GPU_CHECK_OUT ?= runs/gpu-check
gpu-check:
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT)

# The edit-test loop (under 2 minutes): lint, types, the unit tier and the doctests.
check: $(VENV)/.test-installed lint typecheck unit

unit: $(VENV)/.test-installed
	GLOO_SOCKET_IFNAME=$${GLOO_SOCKET_IFNAME:-lo} $(BIN)/python -m pytest tests/unit src/ddpkit $(PYTEST_ARGS)

# ruff, the import-linter contracts in pyproject.toml (the layers of docs/architecture.md), and
# the review list of the longest modules and functions (not a cap: docs/development.md).
lint: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python tests/helpers/longest.py

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy

# The docs as a site in runs/site (MkDocs, Material, the API reference from the docstrings by
# mkdocstrings), built offline in strict mode: a broken link or reference fails (mkdocs.yml).
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet

$(VENV)/.torch-installed:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python $(PIP_INSTALL) -c $(LOCK) "$(TORCH_SPEC)"
	touch $@

$(VENV)/.examples-installed: $(VENV)/.torch-installed pyproject.toml $(LOCK)
	$(BIN)/python $(PIP_INSTALL) -c $(LOCK) -e ".[examples]"
	touch $@

$(VENV)/.test-installed: $(VENV)/.torch-installed pyproject.toml $(LOCK)
	$(BIN)/python $(PIP_INSTALL) -c $(LOCK) -e ".[$(TEST_EXTRAS)]"
	touch $@

$(OLDEST_VENV)/.torch-installed: $(OLDEST_LOCK)
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python $(PIP_INSTALL) -c $(OLDEST_LOCK) "torch==$(OLDEST_TORCH)" "torchvision==$(OLDEST_TORCHVISION)"
	touch $@

$(OLDEST_VENV)/.test-installed: $(OLDEST_VENV)/.torch-installed pyproject.toml $(OLDEST_LOCK)
	$(OLDEST_VENV)/bin/python $(PIP_INSTALL) -c $(OLDEST_LOCK) -e ".[test]"
	touch $@

# Resolve both constraint files anew from pyproject.toml, each in a scratch venv (the oldest
# torch's is a ~5.7 GB download). Then `make test`, and commit constraints/ with the change.
lock: lock-main lock-oldest

lock-main:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(LOCK_VENV)/bin/python -m pip install --quiet -e ".[$(TEST_EXTRAS),examples]"
	$(call write_lock,$(LOCK),$(TORCH_SPEC) with the extras [$(TEST_EXTRAS) examples])

lock-oldest:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet "torch==$(OLDEST_TORCH)" "torchvision==$(OLDEST_TORCHVISION)"
	$(LOCK_VENV)/bin/python -m pip install --quiet -e ".[test]"
	$(call write_lock,$(OLDEST_LOCK),torch==$(OLDEST_TORCH) with the extra [test])

# torch (and torchvision) become comments: the venv's own pin installs them.
define write_lock
	{ echo "# What make installs beside $(2) (make lock wrote it; do not edit)."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable \
	    | sed -E 's/^(torch|torchvision)==/# \1==/'; } > $(1)
	rm -rf $(LOCK_VENV)
endef

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(LOCK_VENV) runs .mypy_cache .ruff_cache .pytest_cache src/*.egg-info
