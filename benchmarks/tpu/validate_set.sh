#!/usr/bin/env bash
# A pre-registered set of `predict` points on the chip, over several device calls (issue 58):
# call 1 calibrates (423-429 s on a v5e) and keeps the profile in /tmp, which lives as long as
# the machine stays warm (it goes back after ~100 s idle: make the calls back to back); each
# call then runs the points not yet measured, in the file's order, starting one only while
# MIN_POINT seconds are left of LIMIT. Every point is reported as `validate_heldout` prints
# it (measured, predicted, signed error); a point never started is not run, and counts as a
# miss (the points file's rules).
#
#   OUT=... POINTS=benchmarks/predict_validation_points_v14_tpu.json \
#       bash benchmarks/tpu/validate_set.sh        # once per call, until "all points run"
#   LIMIT=575 (s this call may take)  MIN_POINT=100  WORK=/tmp/validate_set
#   TINY=1 JAX_PLATFORMS=cpu ...   # dry run on the CPU, each model cut to 2 layers at d 64
#   PROFILE=F PREDICTED=P ...   # a set registered with its profile and predictions committed
#                               # (validate_heldout --write-predictions): no calibration here,
#                               # the runs only measure; a machine lost between calls costs
#                               # only site.sh's install (set 13 lost its points that way)
#
# The decode grid (9650cfd) adds ~20 generate compiles to the calibration, ~2-4 min on a
# v5e: with site.sh's ~100 s first install, more than one call's 600 s. So on a fresh
# machine make a first short call of `. .tpu-wheels/site.sh` alone (it installs into /tmp,
# kept while warm), then this one with the whole call for the calibration.
# Needs .tpu-wheels and .tpu-data (benchmarks/tpu/carry.sh). At most 8 files come back
# from a call: the logs are packed into $OUT/logs.tgz at the end.
set -uo pipefail
OUT=${OUT:?set OUT}; POINTS=${POINTS:?set POINTS}
LIMIT=${LIMIT:-575}; MIN_POINT=${MIN_POINT:-100}; WORK=${WORK:-/tmp/validate_set}
t0=$SECONDS
left() { echo $((LIMIT - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$OUT/summary.txt"; }
mkdir -p "$OUT" "$WORK/done"
# PYTHON: an interpreter that has the dependencies (a dry run's .venv); else the chip's
# python3 with the carried wheels
if [ -z "${PYTHON:-}" ] && [ -f .tpu-wheels/site.sh ]; then . .tpu-wheels/site.sh; fi
PY=${PYTHON:-python3}
say "# $(basename "$0") $POINTS at git $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
if [ -n "${PROFILE:-}" ]; then cp -n "$PROFILE" "$WORK/here.json"; fi
if [ ! -f "$WORK/here.json" ]; then
  say "calibrate"
  timeout -k 5 $(( $(left) - 20 )) "$PY" -m locojax.cli predict calibrate \
    --out "$WORK/here.json" > "$OUT/calibrate.log" 2>&1
  say "calibrate: exit $?"
  [ -f "$WORK/here.json" ] || { say "no profile: nothing measured"; exit 1; }
fi
for id in $("$PY" -c "import json,sys; print(*(p['id'] for p in json.load(open(sys.argv[1]))['points']))" "$POINTS"); do
  [ -f "$WORK/done/$id" ] && continue
  t=$(( $(left) - 10 ))
  [ "$t" -lt "$MIN_POINT" ] && { say "$id: not started ($t s left): next call"; break; }
  "$PY" -m benchmarks.validate_heldout --points "$POINTS" --configs .tpu-data/configs \
    --data .tpu-data/gsm8k/train.jsonl --work-dir "$WORK" --profile "$WORK/here.json" \
    --only "$id" --timeout $((t - 20)) ${TINY:+$([ "$TINY" = 1 ] && echo --tiny)} \
    ${PREDICTED:+--predicted "$PREDICTED"} \
    >> "$OUT/points.log" 2>&1
  line=$(grep "^# $id:" "$OUT/points.log" | tail -1)
  say "$line"
  case $line in *": measured "*) touch "$WORK/done/$id" ;; esac
done
left_ids=$("$PY" -c "import json,sys,os; print(*(p['id'] for p in json.load(open(sys.argv[1]))['points'] if not os.path.exists(sys.argv[2] + '/done/' + p['id'])))" "$POINTS" "$WORK")
if [ -n "$left_ids" ]; then say "not yet run: $left_ids"; else say "all points run"; fi
cp -f "$WORK/here.json" "$OUT/" 2>/dev/null
(cd "$WORK" && tar czf "$OUT/logs.tgz" ./*.log ./*.pred.json ./*/perf.jsonl 2>/dev/null)
