#!/usr/bin/env bash
# The GPU measurements the README and docs/results.md quote, one phase per call of at most ten minutes (H200):
#   bash benchmarks/gpu_session.sh calibrate  GPU tests, the three shipped models' profiles (about 8 min)
#                                             -> calibration/profiles/
#   bash benchmarks/gpu_session.sh kernels-matmul     the kernel-level profile's GEMM and norm families,
#   bash benchmarks/gpu_session.sh kernels-gemv       its one- and few-row matmul, glue and host families,
#   bash benchmarks/gpu_session.sh kernels-attention  its decode attention, mixed-context and probe families,
#   bash benchmarks/gpu_session.sh kernels-prefill    and its prefill and power-limit families: each re-measured into
#                                             this GPU's shipped kernel profile (H100: 3-5 min each)
#                                             -> calibration/profiles/
#   bash benchmarks/gpu_session.sh validate   the 20-configuration validation matrix of this GPU (about 7 min)
#                                             -> benchmarks/results/validation/ (H200), validation-h100/ (H100)
#   bash benchmarks/gpu_session.sh bench      the executor table and refill at K = 1 without exits (about 7 min)
#                                             -> benchmarks/results/executor/
#   bash benchmarks/gpu_session.sh checkpoint full-size Ouro-1.4B and Huginn-3.5B saved in the authors' layout and opened
#                                             as --checkpoint does: cdbsim record's speed, bf16 against float32 logits
#                                             (about 1.5 min) -> benchmarks/results/executor/checkpoint.csv
#   bash benchmarks/gpu_session.sh paper      H200: Huginn-3.5B at W = 64 under the paper's per-step launches (about
#                                             7 min) -> benchmarks/results/paper/gpu/; H100: the paper's offline settings,
#                                             CB / no-refill / refill (about 5.5 min) -> benchmarks/results/paper/h100/
#   bash benchmarks/gpu_session.sh adaptive   the adaptive policy against fixed ones on the same requests (about 9 min)
#                                             -> benchmarks/results/adaptive/gpu/
#   bash benchmarks/gpu_session.sh unseen     shapes no per-model profile measured, on the kernel-level profile
#                                             (PART=1/2 and PART=2/2: about 8 min each; re-predict their measured
#                                             logs together on a CPU) -> benchmarks/results/unseen/
#   bash benchmarks/gpu_session.sh memory     GPU tests, an oversized KV cache refused before any model loads, and
#                                             the executor's peak memory on every configuration of this GPU's
#                                             validation matrix (about 6 min) -> benchmarks/results/memory/
#   bash benchmarks/gpu_session.sh layers     one decode layer as served, kernel by kernel, against this GPU's kernel
#                                             profile, on its probe layers and the calibrated and unseen shapes (about
#                                             3 min) -> benchmarks/results/executor/layers.csv.gz
#   bash benchmarks/gpu_session.sh wide       Huginn-3.5B at W = 256, CB and refill (about 6 min) -> not in a table
#   bash benchmarks/gpu_session.sh rebuild N  call N of the rebuild: everything above, in the order that makes later
#                                             calls use the profiles earlier ones measured (no N: the list)
# Everything a phase writes goes to $OUT/session-<phase>.tgz; copy the files the docs cite into the folder named.
# ONLY=name,name runs those configurations of a matrix alone; PART=i/n every n-th from the i-th; HEAD_DIMS=64,80 a
# kernels phase's attention families at those head sizes (a phase too long for one call, in parts; commit the profile
# between them). docs/validating.md says more.
set -u
REBUILD=(calibrate kernels-matmul kernels-gemv kernels-attention kernels-prefill validate unseen:1/2 unseen:2/2 adaptive paper memory
         bench checkpoint layers wide)
phase=${1:-}
if [ "$phase" = rebuild ]; then
  n=${2:-}
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt ${#REBUILD[@]} ]; then
    echo "rebuild: one device call each, at most ten minutes; commit what a call measured (the profiles above all)"
    echo "before the next, then run 'python benchmarks/tables.py --write'. Give the call's number:"
    for i in "${!REBUILD[@]}"; do echo "  bash benchmarks/gpu_session.sh rebuild $((i + 1))   ${REBUILD[$i]}"; done
    [ -z "$n" ] && exit 0 || exit 2
  fi
  phase=${REBUILD[$((n - 1))]}
  [[ $phase == *:* ]] && { export PART=${phase#*:}; phase=${phase%%:*}; }
fi
case $phase in
  calibrate | kernels-matmul | kernels-gemv | kernels-attention | kernels-prefill | validate | bench | checkpoint \
    | paper | adaptive \
    | unseen | memory | layers | wide) ;;
  *) echo "error: unknown phase '$phase'; phases: calibrate, kernels-matmul, kernels-gemv, kernels-attention," \
       "kernels-prefill, validate, bench, checkpoint, paper, adaptive, unseen, memory, layers, wide, rebuild N" >&2
     exit 2 ;;
esac
if [ -n "${PART:-}" ] && ! [[ $PART =~ ^([1-9][0-9]*)/([1-9][0-9]*)$ && ${BASH_REMATCH[1]} -le ${BASH_REMATCH[2]} ]]; then
  echo "error: PART=$PART: give i/n with 1 <= i <= n" >&2
  exit 2
fi
OUT=${OUT:-/tmp/cdbsim-out}
work=$OUT/work
mkdir -p "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,uuid,memory.total,clocks.sm,power.limit,driver_version --format=csv > "$work/nvidia-smi.csv"
case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) in *H100*) gpu=h100 ;; *) gpu=h200 ;; esac
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" > "$work/versions.txt"
run() {  # run LIMIT_S NAME CMD...: a time-limited step with its log kept; the archive is rewritten after each
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$work/steps.txt"
  tail -n 25 "$work/$name.log"
  tar czf "$OUT/session-$phase.tgz" --exclude=trace.json.gz --exclude='checkpoint-*' -C "$work" .
}
matrix() {  # matrix LIMIT_S NAME FILE: a validation matrix (ONLY, PART: some entries) against the shipped profiles
  local only=${ONLY:-}
  [ -n "${PART:-}" ] && only=$(python3 -c "import sys; from calibration.validation import load_matrix
i, n = map(int, sys.argv[2].split('/')); print(','.join(e.name for e in load_matrix(sys.argv[1])[i - 1::n]))" \
    "calibration/matrices/$3" "$PART")
  run "$1" "validate-$2" python3 cli.py validate --matrix "calibration/matrices/$3" ${only:+--only "$only"} \
    --out "$work/$2"
}
kernels() {  # kernels NAME FAMILIES: those families re-measured into this GPU's shipped kernel profile
  run 580 "calibrate-$1" python3 cli.py calibrate --kernels --update "calibration/profiles/$gpu-kernels.json" \
    --families "$2" ${HEAD_DIMS:+--head-dims "$HEAD_DIMS"} --out "$work/profiles"
}
case $phase in
  calibrate)
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    for model in ${MODELS:-ouro-1.4b ouro-2.6b huginn-3.5b}; do
      run 150 "calibrate-$model" python3 cli.py calibrate --arch "$model" --no-kernels --out "$work/profiles"
    done
    ;;
  kernels-matmul) kernels matmul copy,gemm,few_gemm,elementwise,adapter ;;
  kernels-gemv) kernels gemv few_swiglu,gemv,glue,host ;;
  kernels-attention) kernels attention attention,skew,probes,mixed_probes ;;
  kernels-prefill) kernels prefill prefill,sustained ;;
  validate) matrix 560 validation "validation-$gpu.json" ;;
  bench)
    run 300 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --sizes 1 2 4 8 16 32 64 128 256 --parts stages attention --contexts 512 4096 --prefill-tokens 512 2048 4096 \
      --budget-s 270 --out "$work/executor"
    run 150 bench-throughput-k1 python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 1 --budget-s 130 --out "$work/executor-k1"
    ;;
  checkpoint)
    run 560 checkpoint python3 benchmarks/bench_executor.py --parts checkpoint --quick --requests 64 \
      --out "$work/executor"
    ;;
  paper) matrix 560 paper "$([ $gpu = h100 ] && echo paper-h100.json || echo paper-huginn-h200.json)" ;;
  adaptive) matrix 560 adaptive adaptive-h200.json ;;
  unseen) matrix 560 unseen unseen-h200.json ;;
  layers)
    run 400 layers python3 benchmarks/bench_executor.py --parts layers --budget-s 360 --layer-archs probe0 probe1 \
      probe2 probe3 ouro-1.4b huginn-3.5b calibration/archs/unseen-ouro-1024.json \
      calibration/archs/unseen-huginn-1792.json calibration/archs/unseen-ouro-2560-d80.json \
      --layer-rows 1 2 4 8 16 32 64 --contexts 128 2048 --out "$work/executor"
    ;;
  wide) matrix 560 wide wide-huginn-h200.json ;;
  memory)
    run 380 memory python3 benchmarks/memory.py measure --matrix "calibration/matrices/validation-$gpu.json" \
      --requests 32 --out "$work/memory-$gpu.csv"
    run 30 oversized-kv-refused python3 cli.py validate --arch ouro-2.6b --kv-tokens 1000000 --requests 8 \
      --out "$work/refused"
    run 170 gpu-tests python3 -m pytest tests/executor -m gpu -q -p no:cacheprovider -n 0
    ;;
esac
cat "$work/steps.txt"
