# Quick start: `make demo` and `make test`. Both create or refresh .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build first: any other torch request pulls gigabytes of CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp
DEMO_DIR := demo-data
DEMO_ARGS := --nodes 200000 --avg-degree 20 --feat-dim 64 --classes 8 --seed 0

.PHONY: demo test lint clean bench-prepare bench-compare bench-soak gpu-check

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[trainer,dev]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: $(STAMP)
	$(BIN)/ruff check loader proto trainer tests bench
	$(BIN)/mypy

# Generates and prepares a graph once, then runs the daemon and a GraphSAGE trainer against it
# (config: deploy/config/demo.toml) and stops the daemon with SIGTERM, as systemd would.
demo: $(STAMP)
	mkdir -p $(DEMO_DIR)
	test -d $(DEMO_DIR)/raw || $(BIN)/megabatch generate $(DEMO_DIR)/raw $(DEMO_ARGS)
	test -f $(DEMO_DIR)/dataset/manifest.json || \
		$(BIN)/megabatch prepare $(DEMO_DIR)/raw $(DEMO_DIR)/dataset --partitions 64 --memory-budget 512M
	$(BIN)/megabatch verify $(DEMO_DIR)/dataset
	$(BIN)/megabatch serve --config deploy/config/demo.toml & daemon=$$!; \
	$(BIN)/megabatch train --socket $(DEMO_DIR)/loader.sock --connect-timeout 120 --model sage --hidden 128 \
		--epochs 3; status=$$?; \
	kill -TERM $$daemon; wait $$daemon; exit $$status

bench-prepare: $(STAMP)
	$(BIN)/python bench/prepare_bench.py

# Every loader mode side by side on a 2M-node out-of-core graph (generated once under /var/tmp):
# bench/results/compare.{json,md,png}. Run as root for drop_caches and cgroup limits.
bench-compare: $(STAMP)
	$(BIN)/pip install -q -e '.[trainer,dev,bench]'
	$(BIN)/python bench/compare.py

# A trainer, a hog and a hostile client against one daemon for SOAK_MINUTES; fails unless the daemon
# stays up and flat (fds, memfds, RSS): bench/results/soak.{json,md}.
SOAK_MINUTES ?= 5
bench-soak: $(STAMP)
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES)

# The CUDA path end to end on a machine with an NVIDIA GPU (bench/gpu_check.py: pinned slots, H2D GB/s,
# data-wait, step time; bench/results/gpu-check.{json,md}). .venv holds torch's CPU build, so this runs
# under GPU_PYTHON, a python whose torch is a CUDA build and that has the project's dependencies.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) build *.egg-info
