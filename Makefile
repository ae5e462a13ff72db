# hpcdp: the two commands a new user needs are `make demo` and `make test`.
# Both set up the whole stack first (system packages when root on Debian or
# Ubuntu, the venv, parallel h5py, the patched Horovod build).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test runs its tests on two pytest-xdist workers: a multi-rank test spends much of
# its time starting ranks and waiting, so one stream leaves a 2-core machine half idle.
# The Slurm tests share one worker (tests/conftest.py, work_unit).
# PYTEST_WORKERS=0 runs one stream.
PYTEST_WORKERS ?= 2

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export HDF5_USE_FILE_LOCKING := FALSE

.PHONY: setup test test-extended test-unit test-parallel test-slurm test-stock test-torch-floor lint demo demo-lm demo-recsys bench doctor gpu-check gpu-bench mutate clean

setup:
	bash scripts/setup-system.sh
	VENV=$(VENV) bash scripts/setup-python.sh

## The whole suite: lint, unit tests, multi-rank tests, the local Slurm cluster; all but the
## `extended` tier (tests marked so in pyproject.toml), which `make test-extended` runs.
test: setup lint
	$(PY) -m pytest tests -ra -m "not extended" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

## CI's second tier (.ci/run calls it after make test): costly runs that add little to
## make test's coverage, such as the compiled digits CNN and the 3-rank mpirun collectives.
test-extended: setup
	$(PY) -m pytest tests -ra -m extended $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -ra $(PYTEST_ARGS)

test-parallel: setup
	$(PY) -m pytest tests/parallel -ra $(PYTEST_ARGS)

test-slurm: setup
	$(PY) -m pytest tests/slurm -ra $(PYTEST_ARGS)

## Stock Horovod 0.28.1 (only the C++17 fix) in $(STOCK_VENV), and the tests that show hpcdp
## runs alike on it: the collectives against reference results, a job mixing it with the
## patched build stopping at start, 1 vs 2 ranks, bitwise resume, preemption, a stall,
## and the compressions built on plain collectives (PowerSGD, bf16).
STOCK_VENV ?= .venv-stock
STOCK_TESTS := tests/parallel/test_horovod.py tests/parallel/test_build_guard.py \
	tests/parallel/test_runtime_settings_parallel.py \
	tests/parallel/test_train.py::test_two_ranks_equal_one_rank_with_twice_the_batch \
	tests/parallel/test_train.py::test_signal_checkpoint_resume_is_bitwise_identical \
	tests/parallel/test_one_rank_step.py::test_one_rank_preemption_is_lagged_and_resumes_bitwise \
	tests/parallel/test_stalls_parallel.py::test_stalled_rank_is_named_and_the_job_ends \
	tests/parallel/test_powersgd_ranks.py tests/parallel/test_bf16_compression.py
test-stock: setup
	VENV=$(STOCK_VENV) HPCDP_HOROVOD=stock bash scripts/setup-python.sh
	PATH=$(abspath $(STOCK_VENV))/bin:$$PATH HPCDP_OTHER_PYTHON=$(abspath $(PY)) \
	  $(STOCK_VENV)/bin/python -m pytest -ra $(PYTEST_ARGS) $(STOCK_TESTS)

## The oldest supported PyTorch (hpcdp.doctor.TORCH_RANGE's floor) in $(TORCH_FLOOR_VENV), with
## the patched Horovod built against it, and the tests that show hpcdp runs on it: the unit
## tests, the collectives, 1 vs 2 ranks, bitwise resume of each workload and of a named
## network, preemption, export. TORCH_FLOOR_VENV may name an existing venv: it must hold
## torch $(TORCH_FLOOR) (setup-python.sh installs it only where the venv has no torch).
TORCH_FLOOR := 2.6.0
TORCH_FLOOR_VENV ?= .venv-torch-floor
TORCH_FLOOR_TESTS := tests/unit tests/parallel/test_horovod.py \
	tests/parallel/test_train.py::test_two_ranks_equal_one_rank_with_twice_the_batch \
	tests/parallel/test_train.py::test_signal_checkpoint_resume_is_bitwise_identical \
	tests/parallel/test_one_rank_step.py::test_one_rank_preemption_is_lagged_and_resumes_bitwise \
	tests/parallel/test_lm_train.py::test_stopped_and_resumed_run_is_bitwise_identical \
	tests/parallel/test_train_recsys.py::test_stopped_and_resumed_run_is_bitwise_identical \
	tests/parallel/test_named_networks_ranks.py \
	tests/parallel/test_eval_export.py::test_image_eval_and_export_reproduce_the_run
test-torch-floor:
	bash scripts/setup-system.sh
	VENV=$(TORCH_FLOOR_VENV) HPCDP_TORCH=torch==$(TORCH_FLOOR) bash scripts/setup-python.sh
	$(TORCH_FLOOR_VENV)/bin/python -c 'import sys, torch; v = torch.__version__; \
	  sys.exit(None if v.split("+")[0] == "$(TORCH_FLOOR)" else \
	  f"test-torch-floor: $(TORCH_FLOOR_VENV) has torch {v}, not $(TORCH_FLOOR)")'
	PATH=$(abspath $(TORCH_FLOOR_VENV))/bin:$$PATH $(TORCH_FLOOR_VENV)/bin/python -m pytest \
	  -ra -m "not extended" -n $(PYTEST_WORKERS) $(PYTEST_ARGS) $(TORCH_FLOOR_TESTS)

# shellcheck reads the batch scripts' templates each alone (the variables one part sets
# and another reads are the renderer's to join), then joined: slurm/*.sbatch, their rendering.
lint:
	$(VENV)/bin/ruff check hpcdp tests datasets slurm examples scripts
	$(VENV)/bin/shellcheck --shell=bash --exclude=SC2034,SC2154 hpcdp/cluster/templates/*.sh
	$(VENV)/bin/shellcheck slurm/train.sbatch slurm/prep.sbatch

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
