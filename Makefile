# npu-wizard developer commands. `make demo` and `make test` need nothing but python3.
# The interpreter both venvs are made from (PYTHON=... names another): the distribution's /usr/bin/python3 where it
# is 3.10 or 3.11 (torch 2.1, for .venv-torch21, has no wheel for a later one) and can make a venv, else the python3
# found on PATH. On this kind of machine (Debian 12) that is pyenv's 3.11.7, a default build (against a shared
# libpython, without profile-guided optimisation): test-fast at 2d5c201 took 259.5 s (445 CPU s) on it, and 229.9 s
# and 215.3 s (407 and 377 CPU s) on Debian's 3.11.2 just before and after. A venv keeps its interpreter: to change
# it, `rm -rf .venv` first.
DISTRIBUTION_PYTHON_FITS := /usr/bin/python3 -c \
	'import ensurepip, sys; sys.exit(sys.version_info[:2] not in ((3, 10), (3, 11)))'
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell $(DISTRIBUTION_PYTHON_FITS) 2>/dev/null && echo /usr/bin/python3 || echo python3)
endif
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast snapshots bench clean torch21

# pip keeps no copy of what it downloads: the venvs alone take about 11 GB (torch 2.14.1 and torch 2.1.2 with
# their CUDA libraries), and a CI machine's disk can be small (a CI run once ran out of space in the tests)
export PIP_NO_CACHE_DIR := 1

# pytest workers for `make test`: twice the two cores, because part of the suite's test time waits on a
# scheduler, a hang deadline, a shaped link or sshd while the others fill the cores (see `test:` below)
TEST_WORKERS ?= 4
# and for `make test-fast` (see `test-fast:` below); `make test-fast FAST_WORKERS=4` names another count
FAST_WORKERS ?= 6

$(BIN)/npu-wizard: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The oldest torch offered (2.1) in a venv of its own, for tests/test_oldest_torch.py.
# PyPI's torch 2.1.2 pulls its CUDA libraries (about 3 GB); it runs on the CPU.
TORCH21 := .venv-torch21
$(TORCH21)/bin/torch21-ready:
	$(PYTHON) -m venv $(TORCH21)
	$(TORCH21)/bin/pip install -q 'torch==2.1.2' 'torchvision==0.16.2' 'numpy<2' pyyaml pytest
	touch $@

torch21: $(TORCH21)/bin/torch21-ready  ## the torch 2.1 venv the oldest-torch tests use

# --fresh: a demo trains from step 0 every time (an earlier run's checkpoints are moved aside, not deleted)
demo: $(BIN)/npu-wizard  ## render examples/cpu-demo.yaml into out/ and train it afresh on CPU with the monitor
	$(BIN)/npu-wizard --answers examples/cpu-demo.yaml -o out --force
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/npu-wizard run out/cpu-demo --fresh

# -n 4 on two cores: much of the suite waits (for a Slurm job to be scheduled, a hang to be detected, a shaped link,
# sshd), so more workers fill the cores while some wait: the whole suite took 31 min with -n 3 against 40 min
# with -n 2 on this 2-core machine (tests/costs.py recordings, benchmarks/suite_costs.py); with -n 3 the cores
# still idled about a quarter of the time. Every test waits on a condition with a deadline, never on a bound that
# a busier core would break (-n 4 passed beside five other engineers' test runs, load 11-15). More workers buy
# nothing now: with -n 6 a clean clone's pytest took 1892 s against 1880 s with -n 4, the cores 92% busy
# (vmstat): the suite is bound by the CPU its real runs need, so only fewer or smaller runs make it faster.
# --dist loadgroup: the tests that read one shared run (tests/conftest.py) go to one worker, which makes it once.
# -rsfE: the log's last lines name every skipped, failed and erroring test with its message (CI shows only the
# end of the log: a run of e8468fa ended "2 errors" with no word of which tests)
# tests/ram-basetemp.sh: every test's tmp_path in RAM where it can be (it says why, and mounts a tmpfs as root)
test: $(BIN)/npu-wizard  ## the whole test suite; the log ends with its 20 slowest tests (setup, call or teardown)
	tests/ram-basetemp.sh
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -q -rsfE --durations=20

# The inner loop: the tests that start no training process (-m "not slow"): renders, answers, the TUI, parsing,
# verdicts and reports on recorded or hand-made folders, launch scripts under test doubles. `make test` before a push.
# -n 6: the TUI's Pilot tests wait on the event loop (Textual's idle checks sleep in 20 ms steps) and the doctor's
# tests on a probe that imports torch, so more workers than cores fill the two cores: 4 beat 2 (a quiet clean clone:
# 6:03 against 8:04) and 3 (4:58 and 503 CPU s against 4:46 and 527 CPU s, quiet, at 30fc0ef); at 15adaed, runs
# taken in turn on a quiet machine: -n 6 in 167.0, 173.5, 174.3 and 169.1 s (313-327 CPU s), -n 4 in 176.7 and 178.1 s
# (291 CPU s), -n 5 in 179.9 s, -n 8 in 201.7 s (387 CPU s: each worker collects and imports on its own). That is
# about 3% sooner for about 10% more CPU, near the noise of one run (the single -n 5 run was the slowest but one);
# on a machine that is busy already the extra CPU may cost more than it saves. On a slower day the same machine
# kind took 215-283 s with -n 4 (at 2d5c201-15adaed, above): the figure depends on the machine's speed.
test-fast: $(BIN)/npu-wizard  ## the tests that start no training process, about three minutes on a quiet machine
	tests/ram-basetemp.sh
	$(BIN)/python -m pytest -n $(FAST_WORKERS) --dist loadgroup -q -m "not slow" -rsfE --durations=10

snapshots: $(BIN)/npu-wizard  ## re-record the template snapshots after a template change
	NPU_WIZARD_UPDATE_SNAPSHOTS=1 $(BIN)/python -m pytest -q tests/test_snapshots.py

bench: $(BIN)/npu-wizard  ## the benchmarks, each against its baseline in the same run
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/render_vs_accelerate.py

clean:
	rm -rf out .pytest_cache
