#!/usr/bin/env bash
# The checks to run when an NVIDIA GPU is at hand, in one go: the cuda-marked tests, both examples on the GPU
# (16-mixed and bf16-mixed), the peers' step side by side and its profile, fp8 against bf16 layer by layer at the
# LM's shapes (benchmarks/fp8_layers.py: times, a kernel profile, graph breaks and recompiles), and the LM at a
# width where fp8 pays (bf16 vs fp8, eager and compiled; fp8 eager once more with the weights wrapped for FSDP's
# fp8 all-gather, as every run was before that became FSDP-only; the compiled fp8 run with
# TORCH_LOGS=recompiles,graph_breaks, its log in $OUT/lm-fp8-compiled.log) with tokens/s and MFU.
#
#   bash benchmarks/on_a_gpu.sh [PART ...]     PART: setup tests examples peers profile fp8 lm (default: all)
#   LM_RUNS="bf16 fp8 bf16-compile fp8-compile" bash benchmarks/on_a_gpu.sh setup lm   # some of the LM runs only
#   DEVICE=cpu LM_WIDTH=64 LM_LAYERS=1 LM_HEADS=2 LM_CONTEXT=32 LM_BATCH=4 LM_STEPS=3 \
#     bash benchmarks/on_a_gpu.sh fp8 lm       # tries the fp8 and lm parts out on a CPU (fp8 emulated, tiny)
#
# Each part writes one log under $OUT (default: ./gpu-results) and prints its tail; a part that fails does not
# stop the next one. A machine without network access can bring torchao (for fp8) as a wheel in .whl/: it is
# installed into a scratch folder first. devplug runs from this checkout (no install): it puts the checkout on
# PYTHONPATH and a `devplug` command on PATH.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu with small LM_* sizes tries the script out on a machine without a GPU
LM_WIDTH=${LM_WIDTH:-2048} LM_LAYERS=${LM_LAYERS:-8} LM_HEADS=${LM_HEADS:-16} LM_CONTEXT=${LM_CONTEXT:-1024}
LM_BATCH=${LM_BATCH:-8} LM_STEPS=${LM_STEPS:-120}
parts=${*:-setup tests examples peers profile fp8 lm}
if [ "$DEVICE" = cpu ]; then  # no fp8 units on a CPU: torchao's emulation, at tiny sizes
  FP8_ARGS=${FP8_ARGS:---emulate --tokens 256 --width 64 --rounds 3 --iters 2}
  LM_FP8_OPTIONS=${LM_FP8_OPTIONS:---device-option fp8=emulate}
fi

part() {  # part NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log (appended), print the tail
  local name=$1 limit=$2 started=$SECONDS rc
  shift 2
  echo "== $(date +%T) $name: $*" | tee -a "$OUT/$name.log"
  timeout "$limit" "$@" >"$OUT/.last" 2>&1
  rc=$?
  cat "$OUT/.last" >>"$OUT/$name.log"
  tail -n "${TAIL:-12}" "$OUT/.last"
  rm -f "$OUT/.last"
  echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$OUT/$name.log"
}

setup() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  mkdir -p /tmp/devplug-bin
  printf '#!/bin/sh\nexec %s -m devplug "$@"\n' "$PY" >/tmp/devplug-bin/devplug
  chmod +x /tmp/devplug-bin/devplug
  export PATH="/tmp/devplug-bin:$PATH"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/setup.log"
  part setup 120 "$PY" -c "
import torch, devplug, platform
print('torch', torch.__version__, 'python', platform.python_version(), torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU',
      'cc', torch.cuda.get_device_capability() if torch.cuda.is_available() else None, 'cpus', __import__('os').cpu_count())
try:
    import torchao; print('torchao', torchao.__version__)
except Exception as exc: print('torchao: not importable', exc)
for name in ('lightning', 'accelerate'):
    try: print(name, __import__(name).__version__)
    except Exception as exc: print(name, 'not importable', exc)
print('devplug', devplug.__version__)"
  part setup 60 devplug devices
}

lm_run() {  # lm_run LOG LIMIT TAG LM-FLAGS...: the LM at the LM_* sizes (environment: $LM_ENV), then its RESULT line
  local log=$1 limit=$2 tag=$3
  shift 3
  # shellcheck disable=SC2086  # LM_ENV: VAR=VALUE words for env
  part "$log" "$limit" env ${LM_ENV:-} "$PY" examples/lm.py --device "$DEVICE" --width "$LM_WIDTH" \
    --layers "$LM_LAYERS" --heads "$LM_HEADS" --context "$LM_CONTEXT" --batch-size "$LM_BATCH" --steps "$LM_STEPS" \
    --warmup 10 --eval-every 0 --eval-batches 1 --sample-bytes 0 --log-every 40 --save-every 100000 \
    --out "/tmp/lm-$tag" "$@"
  "$PY" - "/tmp/lm-$tag/summary.json" "$tag" <<'EOF' | tee -a "$OUT/$log.log"
import json, sys
s = json.load(open(sys.argv[1]))
mfu = f"{s['mfu']:.1%}" if s.get("mfu") is not None else "n/a"
print(f"RESULT {sys.argv[2]:<24} {s['precision']:<10} compile={s['compiled'] or 'off':<30} "
      f"tokens/s={s['tokens_per_sec']:>10,.0f} MFU={mfu} peak={(s.get('peak_flops') or 0) / 1e12:.1f} TFLOP/s "
      f"({s.get('peak_source')}) flops/token={(s.get('flops_per_token') or 0) / 1e9:.3f} G "
      f"loss={s['final_eval_loss']:.3f} | {s['precision_detail']}")
EOF
}

case " $parts " in *" setup "*) setup ;; *) export PATH="/tmp/devplug-bin:$PATH" PYTHONPATH="$PYTHONPATH:/tmp/site" ;; esac
for p in $parts; do
  case $p in
    setup) ;;
    tests) part tests 240 "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/ ;;
    examples)
      for precision in 16-mixed bf16-mixed; do
        part examples 120 "$PY" examples/dcgan.py --device "$DEVICE" --precision "$precision" --epochs 2 --no-progress \
          --log-every 50 --out "/tmp/dcgan-$precision"
        "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print('RESULT dcgan', sys.argv[2],
              {k: s.get(k) for k in ('precision', 'images_per_sec', 'mfu', 'steps', 'wall_seconds')})" \
          "/tmp/dcgan-$precision/summary.json" "$precision" 2>&1 | tee -a "$OUT/examples.log"
      done ;;
    peers) part peers 240 "$PY" benchmarks/peers.py --device "$DEVICE" --rounds "${PEERS_ROUNDS:-11}" \
             --json "$OUT/peers.json" ;;
    profile)
      for workload in ${PROFILE_WORKLOADS:-mlp dcgan}; do
        TAIL=60 part profile 120 "$PY" benchmarks/profile_step.py --device "$DEVICE" --workload "$workload" --steps 50 \
          --adapters raw,fabric,devplug
      done ;;
    fp8)  # shellcheck disable=SC2086  # FP8_ARGS: flags
      TAIL=80 part fp8 "${FP8_LIMIT:-300}" "$PY" benchmarks/fp8_layers.py --device "$DEVICE" --rounds 5 --iters 10 \
        ${FP8_ARGS:-} ;;
    lm)
      limit=${LM_LIMIT:-150} compile_limit=${LM_COMPILE_LIMIT:-240}
      # shellcheck disable=SC2086  # LM_FP8_OPTIONS: flags
      for run in ${LM_RUNS:-bf16 fp8 fp8-gather bf16-compile fp8-compile}; do
        case $run in
          bf16) lm_run lm "$limit" bf16-mixed --precision bf16-mixed --no-compile ;;
          fp8) lm_run lm "$limit" fp8-mixed --precision fp8-mixed --no-compile ${LM_FP8_OPTIONS:-} ;;
          fp8-gather) lm_run lm "$limit" fp8-mixed-gather-wrapped --precision fp8-mixed --no-compile \
                        ${LM_FP8_OPTIONS:-} --device-option fp8_all_gather=true ;;
          bf16-compile) lm_run lm "$compile_limit" bf16-mixed-compile --precision bf16-mixed --compile ;;
          fp8-compile) LM_ENV="TORCH_LOGS=recompiles,graph_breaks" lm_run lm-fp8-compiled "$compile_limit" \
                         fp8-mixed-compile --precision fp8-mixed --compile ${LM_FP8_OPTIONS:-} ;;
          *) echo "unknown LM run: $run (bf16 fp8 fp8-gather bf16-compile fp8-compile)" ;;
        esac
      done ;;
    *) echo "unknown part: $p (setup tests examples peers profile fp8 lm)"; exit 2 ;;
  esac
done
