#!/usr/bin/env bash
# Qwen3-0.6B full-parameter GRPO on one TPU v5e chip (issue 55): does the paper's model fit,
# and does every run that does not fit end in the memory plan's message, never a traceback?
#
#   OUT=/some/dir bash benchmarks/tpu/qwen3_fit.sh                 # everything (~12 min)
#   OUT=... PARTS="a b" bash benchmarks/tpu/qwen3_fit.sh           # the two targets (~8 min)
#   OUT=... PARTS="c" bash benchmarks/tpu/qwen3_fit.sh             # the sweep that must not fit
#   OUT=... TINY=1 JAX_PLATFORMS=cpu bash benchmarks/tpu/qwen3_fit.sh   # dry run, a tiny model
#   OUT=... BALLAST=1 PARTS=a bash benchmarks/tpu/qwen3_fit.sh   # and the plan's peak by ballast
#
# Run from the repository root on the TPU machine. It needs, in ignored folders carried with
# the checkout (docs/real_size.md, "Qwen3-0.6B on one v5e chip"):
#   .tpu-wheels/site.sh                    the dependencies (../shared/tpu/README.md)
#   .tpu-data/configs/qwen3-0.6b.json      the published config (../shared/configs/)
#   .tpu-data/gsm8k/train.jsonl            GSM8K rows (the first 3000 of ../shared/data/gsm8k)
# Model: random weights at the published config (written once to $WORK by locojax's own
# init, no torch), the char tokenizer: GSM8K questions of at most P = 256 characters, left-
# padded to 256; 512 new tokens with EOS ignored (every row 512); GRPO with β 0.04 (the
# reference held), AdamW, bf16 compute over f32 master weights and Adam state.
#   (a) 8 prompts x G 4 = 32 rows; (b) 32 prompts x G 4 = 128 rows: each one process that
#       prints the memory plan (what `--plan-only` prints) and then runs steps until STEPS or
#       its time budget, printing each step's time and the chip's peak bytes in use
#       (`memory_stats()["peak_bytes_in_use"]`) beside the plan's peak;
#   (c) settings that must not fit (256 rows; 4096 new tokens; f32 at 128 rows): `locojax
#       train` must exit 2 with the plan's refusal, and no output may hold a traceback.
# Everything it prints is also in $OUT (one log per sub-run, summary.txt last).
set -uo pipefail

OUT=${OUT:?set OUT to the folder the logs go to}
PARTS=${PARTS:-"a b c"}
TINY=${TINY:-0}
STEPS=${STEPS:-20}
A_SECONDS=${A_SECONDS:-120}   # stepping budget of (a), after its plan and compiles
B_SECONDS=${B_SECONDS:-170}
RUN_TIMEOUT=${RUN_TIMEOUT:-400}  # a whole sub-run (start, compiles, steps)
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-150}
WORK=${WORK:-/tmp/locojax-qwen3-fit}
CONFIG=${CONFIG:-.tpu-data/configs/qwen3-0.6b.json}
DATA=${DATA:-.tpu-data/gsm8k/train.jsonl}
. benchmarks/tpu/preamble.sh
say "# PARTS=$PARTS"

# The shapes. TINY: the same commands on a 2-layer, d=64 model (vocab kept) and fewer tokens.
NEW=512; SWEEP_NEW=4096
if [ "$TINY" = 1 ]; then
  NEW=32; SWEEP_NEW=256; STEPS=${TINY_STEPS:-2}
  EXTRA_SWEEP=(--device-memory-gb 0.15)  # a small "device", so the sweep is refused here too
  EXTRA_TARGET=(--device-memory-gb 0.45)  # and one the targets fit only as on the chip:
  # the reference offloaded, remat on, micro-batches (the layers' gradients summed in place)
else
  EXTRA_SWEEP=(); EXTRA_TARGET=()
fi
random_model tiny  # the char tokenizer: GSM8K's questions need no other

COMMON=(gsm8k --model "$MODEL" --task.data "$DATA" --task.template plain --task.skip-invalid
        --mode single --rollout.max-prompt-tokens 256 --rollout.ignore-eos --algo.beta 0.04
        --eval.every 0 --no-progress --no-tensorboard)

# One target: the plan, then steps in this process (no checkpoint or export: they would
# write 7 GB), each step's time and the chip's peak against the plan's.
target() {  # name prompts budget_seconds
  local name=$1 prompts=$2 budget=$3
  say "## ($name) $prompts prompts x G 4 = $((prompts * 4)) rows, P 256 + $NEW new tokens, bf16"
  timeout "$RUN_TIMEOUT" "$PY" - "$STEPS" "$budget" "$OUT/$name.jsonl" "${COMMON[@]}" \
    --rollout.prompts-per-step "$prompts" --algo.group-size 4 --rollout.max-new-tokens "$NEW" \
    --precision bf16 --steps "$STEPS" --run-dir "$WORK/run-$name" "${EXTRA_TARGET[@]}" \
    <<'EOF' 2>&1 | tee "$OUT/$name.log"
import json, os, sys, time
import jax
import tyro
from locojax.profiler import StepTimer
from locojax.train import out_of_memory, wiring
from locojax.train.config import PRESETS
from locojax.train.loop import start
from locojax.train.memory_plan import MemoryPlanError

steps, budget, log = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
cfg = tyro.extras.overridable_config_cli(PRESETS, args=sys.argv[4:], prog="locojax train")
t0 = time.perf_counter()
try:
    trainer = start(cfg, wiring.join("single"))  # prints the plan; compiles its programs
except MemoryPlanError as e:
    print(f"locojax train: {e}")
    sys.exit(2)
plan, ready = trainer.memory, time.perf_counter() - t0
print(f"plan and compiles: {ready:.0f} s; plan peak {plan.peak / 1e9:.2f} GB in "
      f"{plan.peak_program.name}; offloaded {plan.offloaded or 'nothing'}", flush=True)
device = jax.local_devices()[0]
t1 = time.perf_counter()
with open(log, "w") as out:
    for step in range(steps):
        timer = StepTimer()
        try:
            metrics = trainer.step(step, timer)
        except Exception as e:  # noqa: BLE001 - the one paragraph, as `locojax train` says it
            if not out_of_memory.is_out_of_memory(e):
                raise
            print(f"locojax train: {out_of_memory.runtime_message(e, plan, step)}")
            sys.exit(1)
        perf = timer.finish_step()
        stats = device.memory_stats() or {}
        row = {"step": step + 1, "step_s": perf["perf/step_time"],
               "phases": {k[5:]: v for k, v in perf.items() if k.startswith("perf/")},
               "chip_peak_gb": stats.get("peak_bytes_in_use", 0) / 1e9,
               "plan_peak_gb": plan.peak / 1e9,
               "response_len": metrics.get("rollout/response_length/mean"),
               "kl": metrics.get("actor/kl")}
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(f"step {step + 1}: {row['step_s']:.2f} s, chip peak {row['chip_peak_gb']:.2f} GB "
              f"(plan {row['plan_peak_gb']:.2f} GB), response length {row['response_len']}",
              flush=True)
        if time.perf_counter() - t1 > budget:
            print(f"stopping after {step + 1} steps: the {budget:.0f} s budget is spent")
            break
print("settings:", plan.format().splitlines()[0])
if os.environ.get("BALLAST") == "1":  # the plan's peak against the chip, by ballast
    from benchmarks.tpu import ballast
    more = iter(range(step + 1, step + 10))
    print(ballast.check(lambda: trainer.step(next(more), StepTimer()), plan.peak), flush=True)
EOF
  local rc=$?
  say "($name) exit $rc; $(grep -E '^  peak |^  auto ' "$OUT/$name.log" | tr -s ' ' | tr '\n' ';')"
  grep -E '^step |^stopping|^plan and|^ballast' "$OUT/$name.log" >> "$SUMMARY"
  "$PY" - "$OUT/$name.jsonl" <<'EOF' 2>/dev/null | tee -a "$SUMMARY"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
if rows:
    later = [r["step_s"] for r in rows[1:]] or [rows[0]["step_s"]]
    print(f"  {len(rows)} steps; step 1 {rows[0]['step_s']:.2f} s, later median "
          f"{statistics.median(later):.2f} s; chip peak {max(r['chip_peak_gb'] for r in rows):.2f}"
          f" GB against the plan's {rows[0]['plan_peak_gb']:.2f} GB")
EOF
}

# One setting that must not fit: the plan's refusal (exit 2), never a traceback.
refused() {  # name args...
  local name=$1; shift
  timeout "$SWEEP_TIMEOUT" "$PY" -m locojax.cli train "${COMMON[@]}" --steps 1 \
    --run-dir "$WORK/run-$name" "${EXTRA_SWEEP[@]}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$? verdict=ok
  if grep -q "Traceback" "$OUT/$name.log"; then verdict="FAILED: a traceback"
  elif [ $rc -ne 2 ]; then verdict="FAILED: exit $rc, not the plan's refusal (2)"
  elif ! grep -q "^locojax train: .*nothing was run" "$OUT/$name.log"; then
    verdict="FAILED: no refusal message"; fi
  say "(c) $name: exit $rc, $verdict: $(grep -m1 '^locojax train:' "$OUT/$name.log" | cut -c1-220)"
}

for part in $PARTS; do
  case $part in
    a) target a 8 "$A_SECONDS" ;;
    b) target b 32 "$B_SECONDS" ;;
    c) say "## (c) settings that must not fit: the plan's refusal, never a traceback"
       refused c-256-rows --rollout.prompts-per-step 64 --algo.group-size 4 \
         --rollout.max-new-tokens "$NEW" --precision bf16
       refused c-more-tokens --rollout.prompts-per-step 8 --algo.group-size 4 \
         --rollout.max-new-tokens "$SWEEP_NEW" --precision bf16
       refused c-f32-128-rows --rollout.prompts-per-step 32 --algo.group-size 4 \
         --rollout.max-new-tokens "$NEW" --precision f32 ;;
    *) say "unknown part $part (a, b, c)"; exit 2 ;;
  esac
done
if grep -l "Traceback" "$OUT"/*.log > /dev/null 2>&1; then
  say "TRACEBACKS in: $(grep -l Traceback "$OUT"/*.log | tr '\n' ' ')"
fi
say "# done $(date -u +%FT%TZ)"
