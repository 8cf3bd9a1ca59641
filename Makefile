# plancache: `make run` starts a server, `make test` runs the tests, `make demo`
# shows a plan compiled, stored and served on a machine without a GPU.
# Each sets up what it needs on a fresh machine: redis-server (and, for the
# tests, Chromium, Node.js and Prometheus) from the OS packages when missing, the Python packages in
# a venv (.venv). `make test` first prints what it is about to install. No service an OS package
# ships is left running or enabled at boot (scripts/install-os-package.sh disables them).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: setup setup-test test-plan torch-cpu cxx redis chromium node prometheus run demo test lint typecheck proto bench herd upgrade flood soak clean

$(STAMP): client/pyproject.toml server/pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -e ./client -e ./server
	@# The cuDNN frontend's graph IR imports without a GPU (no torch, no CUDA): the
	@# from_pygraph tests use it. Its GPU-only requirements are left out on purpose.
	$(PY) -m pip install -q --no-deps nvidia-cudnn-frontend==1.32.0 apache-tvm-ffi || echo "cuDNN frontend not installable here: interop tests will skip"
	touch $(STAMP)

setup: $(STAMP) redis

## torch's CPU build, for the tests only: plancache.torch's operators and mode are traced, compiled and
## checked on the CPU (tests/unit/plancache_torch; their CUDA side is tests/gpu). The CPU index keeps a fresh
## machine from fetching a CUDA build of several GB; a machine with torch 2.13.0 on disk takes that.
TORCH_STAMP := $(VENV)/.torch-stamp
torch-cpu: $(TORCH_STAMP)

$(TORCH_STAMP): $(STAMP)
	$(PY) -m pip install -q torch==2.13.0 --retries 0 --extra-index-url https://download.pytorch.org/whl/cpu && touch $(TORCH_STAMP) \
		|| echo "torch not installable here: tests/unit/plancache_torch will skip (they say so)"

redis:
	@scripts/install-redis.sh

## Headless Chromium renders the status page in its tests (Debian's chromium package).
chromium:
	@scripts/install-os-package.sh chromium chromium chromium chromium

## Node.js runs the conformance client written from the proto (tests/conformance/node),
## with the packages pinned by its package-lock.json.
NODE_MODULES := tests/conformance/node/node_modules/.package-lock.json
node: $(NODE_MODULES)

$(NODE_MODULES): tests/conformance/node/package-lock.json
	@scripts/install-os-package.sh node nodejs nodejs node
	@scripts/install-os-package.sh npm npm npm node
	cd tests/conformance/node && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_MODULES)

## A C++ compiler (Debian's g++): tests/unit/plancache_torch/test_native.py builds plancache.torch's native
## kernels (one C++ file against torch's CPU build; ninja comes with requirements-dev.txt).
cxx:
	@scripts/install-os-package.sh c++ g++ gcc-c++ gcc

## Prometheus and promtool (Debian's prometheus package): a real Prometheus evaluates the
## Grafana dashboard's queries and the alert rules in the tests.
prometheus:
	@scripts/install-os-package.sh promtool prometheus golang-github-prometheus prometheus

## What `make test` installs, said before anything is installed (sizes from apt's lists when present).
TEST_COMMANDS := redis-server=redis-server chromium=chromium node=nodejs npm=npm promtool=prometheus c++=g++
test-plan:
	@echo "make test sets up, where missing:"
	@if [ ! -f $(STAMP) ]; then echo "  Python packages into $(VENV) (about 500 MB: grpcio, redis, cryptography, the cuDNN frontend's IR, ...)"; fi
	@if [ ! -f $(TORCH_STAMP) ]; then echo "  torch 2.13.0, CPU build, into $(VENV) (about 700 MB; the tests of plancache.torch)"; fi
	@if [ ! -f $(NODE_MODULES) ]; then echo "  npm packages into tests/conformance/node/node_modules (package-lock.json)"; fi
	@scripts/install-os-package.sh --plan $(TEST_COMMANDS)
	@echo "  (no service of these packages is left running or enabled at boot)"

setup-test: test-plan setup torch-cpu chromium node prometheus cxx

## Start a server on 127.0.0.1:50051 with a private Redis and a worker per local GPU;
## /metrics and the status page on http://127.0.0.1:$(METRICS_PORT)/ (METRICS_PORT=0: off).
## REDIS_LISTEN=0.0.0.0:6379: the private Redis also listens there, for compile workers on other
## hosts (passwords required; the workers' URL is written to the data folder: docs/deploying.md).
METRICS_PORT ?= 9464
REDIS_LISTEN ?=
run: setup
	$(VENV)/bin/plancache-server --metrics-port $(METRICS_PORT) $(if $(REDIS_LISTEN),--redis-listen $(REDIS_LISTEN)) $(ARGS)

## Try it without a GPU: a server with the tests' CPU STAND-IN compiler (never the default: its plans
## are made-up bytes for a target no GPU has), a client that compiles a spec (built, signed, stored),
## compiles it again (a hit) and prints the counters and the status page http://127.0.0.1:9464/;
## the server then runs until Ctrl-C (ARGS=--exit: it stops after the tour). Only the two packages
## are installed (not the test tools), so it runs within a minute or two of `git clone`.
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): client/pyproject.toml server/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ./client -e ./server
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP) redis
	$(PY) examples/try_without_gpu.py $(ARGS)

## Lint, type-check and run every test this machine can run (GPU tests skip without a GPU),
## in TEST_WORKERS processes (pytest-xdist): most tests wait (processes, Redis, builds), so more than the cores.
TEST_WORKERS ?= 4
test: setup-test lint typecheck
	$(VENV)/bin/pytest -n $(TEST_WORKERS) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## CPU benchmarks (stand-in compiler): a table of ratios, bench/results/cpu_bench.{json,png}.
## The GPU benchmarks run on a GPU machine: scripts/gpu-check.sh (bench/gpu_bench.py).
bench: setup
	$(PY) bench/cpu_bench.py $(ARGS)

## Rollout herd (stand-in compiler): 1000 nodes need the same 13 new plans at once; bench/results/herd.{json,png}.
herd: setup
	$(PY) bench/herd.py $(ARGS)

## Upgrade rehearsal (stand-in compiler): a new target's nodes against A's 500 stored specs, with and without warming; bench/results/upgrade.{json,png}.
upgrade: setup
	$(PY) bench/upgrade.py $(ARGS)

## One client floods while 50 honest nodes read and compile (stand-in compiler); bench/results/flood.{json,png}.
flood: setup
	$(PY) bench/flood.py $(ARGS)

## The service over an hour (stand-in compiler): RSS, descriptors, Redis memory, hit p99; bench/results/soak.{json,png}.
soak: setup
	$(PY) bench/soak.py $(ARGS)

## Regenerate the committed gRPC stubs from proto/.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=client/src --grpc_python_out=client/src --pyi_out=client/src proto/plancache/v1/plancache.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/conformance/node/node_modules
