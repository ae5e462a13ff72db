# hpcdp: the two commands a new user needs are `make demo` and `make test`.
# Both set up the whole stack first (system packages when root on Debian or
# Ubuntu, the venv, parallel h5py, the patched Horovod build).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export HDF5_USE_FILE_LOCKING := FALSE

.PHONY: setup test test-unit test-parallel test-slurm lint demo demo-lm demo-recsys bench doctor gpu-check gpu-bench mutate clean

setup:
	bash scripts/setup-system.sh
	VENV=$(VENV) bash scripts/setup-python.sh

## The whole suite: lint, unit tests, multi-rank tests, the local Slurm cluster.
test: setup lint
	$(PY) -m pytest tests -ra $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -ra $(PYTEST_ARGS)

test-parallel: setup
	$(PY) -m pytest tests/parallel -ra $(PYTEST_ARGS)

test-slurm: setup
	$(PY) -m pytest tests/slurm -ra $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check hpcdp tests datasets slurm

## Prepare the bundled digits data with 2 ranks and train on it with horovodrun -np 2.
demo: setup
	VENV=$(VENV) bash scripts/demo.sh

## Prepare the Markov corpus with 2 ranks, train the tiny GPT with horovodrun -np 2, and
## print the validation loss against the corpus's entropy rate.
demo-lm: setup
	VENV=$(VENV) bash scripts/demo-lm.sh

## Write the click log with 2 ranks, train the DLRM-style model with horovodrun -np 2,
## and set val_auc beside the data's oracle_auc and baseline_auc.
demo-recsys: setup
	VENV=$(VENV) bash scripts/demo-recsys.sh

bench: setup
	$(VENV)/bin/hpcdp bench all --out bench/results

## Mutation testing of the pure core (10-20 min; not part of make test): a score per module.
mutate: setup
	VENV=$(VENV) bash scripts/mutate.sh

doctor: setup
	$(VENV)/bin/hpcdp doctor

## On a GPU node (Horovod built there with NCCL): the CUDA/NCCL paths, PASS/FAIL each.
gpu-check: setup
	VENV=$(VENV) bash scripts/gpu-check.sh

## On one GPU: ResNet-50, GPT-2 124M and DLRM throughput, eager and compiled (docs/gpu.md).
gpu-bench: setup
	PY=$(PY) bash scripts/gpu-bench.sh

clean:
	rm -rf runs data bench/results .pytest_cache .ruff_cache mutants mutants.log
