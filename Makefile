# Two entry points on a fresh machine with Python 3.11: `make demo` and `make test`.
export TF_CPP_MIN_LOG_LEVEL ?= 2

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
TFF_VERSION := 0.87.0
STAMP  := $(VENV)/.installed-$(shell cat requirements/lock.txt | cksum | cut -d' ' -f1)

.PHONY: setup demo test test-tables test-fast bench clean

setup: $(STAMP)

# TFF 0.87.0 pins jaxlib==0.4.14, which the registry lacks: install its pinned dependency set
# (with jaxlib 0.4.13, accepted by jax 0.4.14) from the lock, then TFF with --no-deps.
# The lock is the complete environment, installed with --no-deps: TFF and tensorflow-privacy
# require `tensorflow`, which would pull in the GPU build beside the lock's tensorflow-cpu (same
# files, CUDA/cuDNN errors on CPU-only machines). A GPU `tensorflow` of an older install is
# removed first, since both builds write the same package directory (docs/INSTALL.md, "GPU").
$(STAMP): requirements/lock.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==23.3.2
	$(PIP) uninstall -q -y tensorflow 2>/dev/null || true
	$(PIP) install -q --no-deps -r requirements/lock.txt
	$(PIP) install -q --no-deps tensorflow-federated==$(TFF_VERSION)
	$(PIP) install -q --no-deps -e .
	$(PY) -c "import tensorflow_federated as tff; assert tff.__version__ == '$(TFF_VERSION)'"
	touch $(STAMP)

# Main job: DP-FedAvg with flat adaptive clipping on a generated, seeded EMNIST cache in TFF's
# format: 2,000 writers, 200 of them held out for evaluation (not in the population: the
# evaluation reveals nothing of it, and the held-out writers are outside the guarantee), 100
# expected per round among the other 1,800 (Poisson), z = 0.7, 30 rounds, EMA + past-3
# aggregates. About 4 minutes on 2 cores with the set-up; prints one line per round and the
# run's privacy statement (README, "Quick start").
DEMO_DATA ?= data_cache/demo-emnist-2000
DEMO_FLAGS ?= --task=emnist --data_dir=$(DEMO_DATA) --dp=adaptive --clip=0.1 \
	--noise_multiplier=0.7 --clients_per_round=100 --total_rounds=30 \
	--client_learning_rate=0.05 --rounds_per_eval=5 --ema_beta=0.9 --past_k=3 \
	--uncertainty_last_k=5 --eval_data=holdout --root_output_dir=runs
$(DEMO_DATA)/emnist_all.sqlite: | setup
	$(PY) -m tasks.synthetic_data --family=emnist --population=2000 --cache_dir=$(DEMO_DATA)
demo: setup $(DEMO_DATA)/emnist_all.sqlite
	$(PY) run_experiment.py $(DEMO_FLAGS)

# The whole suite, with one arm per paper table at smoke scale; `make test-tables` runs every arm.
# Three pytest workers (pytest-xdist) on 2 cores: a test's time is mostly single-threaded Python
# (TFF tracing, TensorFlow imports, SQLite), and with one worker per core the cores still sat
# idle 13% of the time (tests waiting on signals, killed workers, time-outs); a third worker
# fills that (docs/BENCHMARKS.md, "The test suite's time"). Each file runs whole on one worker
# (--dist loadfile), so a module's fixtures are built once; pytest-xdist 3.8 hands the files out
# by their number of tests, most first (its --loadscope-reorder default), whatever their order
# of collection. TEST_WORKERS=0 runs the suite in this process (one worker's memory, e.g.
# beside another job).
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile
test: setup
	$(PYTEST) --durations=10 -m "not all_tables" tests

test-tables: setup
	$(PYTEST) --durations=10 -m all_tables tests

# The edit-test loop: every unit and contract test, no end-to-end run (tests marked `slow`:
# whole experiments, command lines, signals); about 3 minutes on 2 cores (docs/BENCHMARKS.md).
test-fast: setup
	$(PYTEST) --durations=5 -m "not slow" tests

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs
