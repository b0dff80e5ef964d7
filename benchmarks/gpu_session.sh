#!/usr/bin/env bash
# GPU measurements, in the order this project runs them on the H200 (each phase fits one 10-minute call):
#   bash benchmarks/gpu_session.sh calibrate   GPU tests, calibration of the shipped models, stage/attention bench
#   bash benchmarks/gpu_session.sh validate    the validation matrix, executor throughput bench
#   bash benchmarks/gpu_session.sh full        calibration, then the validation matrix against the fresh
#                                              profiles
#   bash benchmarks/gpu_session.sh short       GPU tests, calibration of the shipped models, seven validation
#                                              configs (Ouro and Huginn, offline and online) against it
#   bash benchmarks/gpu_session.sh bench       GPU tests, which calibration condition hides the large-batch gap
#                                              (probe_calibration_gap.py), no-exit throughput of the three
#                                              policies on the same requests
#   bash benchmarks/gpu_session.sh final       the validation matrix, Ouro's no-exit throughput with refill K = 16
#   bash benchmarks/gpu_session.sh fused       Ouro-1.4B's stages with and without the fused skinny-matmul path
#   bash benchmarks/gpu_session.sh recal       GPU tests, quick stage/attention bench, calibration of the shipped
#                                              models one by one
#   bash benchmarks/gpu_session.sh mini        GPU tests, Ouro-1.4B calibration, two Ouro validation configs
#   bash benchmarks/gpu_session.sh probe       GPU tests, skinny-matmul sweep, stage bench, Ouro-1.4B calibration
#                                              and three Ouro validation configs against it
# Results go to $OUT/session-<phase>.tgz (logs, profiles, CSV/JSON, plots). Every step has its own time
# limit so the archive is written even when one step runs long.
set -u
phase=${1:?calibrate or validate}
OUT=${OUT:-/tmp/cdbsim-out}
work=$OUT/work
mkdir -p "$work"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # pure-Python wheels the GPU image lacks (simpy)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$work/nvidia-smi.csv"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" > "$work/versions.txt"
run() {  # run LIMIT_S NAME CMD...: time-limited step with its log kept; the archive is rewritten after
  local limit=$1 name=$2; shift 2  # every step, so a call cut short still brings back what was done
  local t0=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$work/steps.txt"
  tail -n 25 "$work/$name.log"
  tar czf "$OUT/session-$phase.tgz" -C "$work" .
}
case $phase in
  calibrate)
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 330 calibrate python3 cli.py calibrate --arch ouro-1.4b,ouro-2.6b,huginn-3.5b --out "$work/profiles"
    run 100 bench-stages python3 benchmarks/bench_executor.py --parts stages attention --out "$work/bench"
    ;;
  validate)
    run 400 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    run 120 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --budget-s 60 --out "$work/bench-throughput"
    ;;
  full)
    run 220 calibrate python3 cli.py calibrate --arch ouro-1.4b,ouro-2.6b,huginn-3.5b --out "$work/profiles"
    mkdir -p calibration/profiles && cp "$work"/profiles/*.json calibration/profiles/
    run 330 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    ;;
  short)
    run 90 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 150 calibrate python3 cli.py calibrate --arch ouro-1.4b,ouro-2.6b,huginn-3.5b --out "$work/profiles"
    mkdir -p calibration/profiles && cp "$work"/profiles/*.json calibration/profiles/
    run 130 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json --only \
ouro-alpaca-cb-W64,ouro-alpaca-refill-W64,ouro-alpaca-refill-W256,ouro-sharegpt-refill-W16,ouro-alpaca-refill-online,\
huginn-alpaca-cb-W64,huginn-alpaca-refill-K16-W64 --out "$work/validation"
    ;;
  bench)
    run 70 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 120 probe-gap python3 benchmarks/probe_calibration_gap.py --out "$work/probe-gap.json"
    run 240 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --budget-s 150 --out "$work/bench-throughput"
    ;;
  final)  # the validation matrix again (its logs now keep each launch's longest item), and Ouro's no-exit
          # refill at K = 16 beside CB
    run 340 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    run 80 bench-throughput-k16 python3 benchmarks/bench_executor.py --models ouro-1.4b --parts throughput \
      --quick --exits none --requests 128 --k 16 --out "$work/bench-throughput-k16"
    ;;
  fused)  # the whole core step on the default (cuBLAS) projections and on the fused skinny-matmul path
    for rows in 0 16; do
      run 80 "bench-stages-fuse$rows" python3 benchmarks/bench_executor.py --models ouro-1.4b --quick \
        --parts stages --fuse-rows "$rows" --out "$work/bench-fuse$rows"
    done
    ;;
  recal)
    run 70 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 90 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --parts stages attention --out "$work/bench"
    for model in ouro-1.4b ouro-2.6b huginn-3.5b; do
      run 150 "calibrate-$model" python3 cli.py calibrate --arch "$model" --out "$work/profiles"
    done
    ;;
  mini)  # what fits three minutes: GPU tests, Ouro-1.4B calibration, two Ouro validation configs
    run 75 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 50 calibrate python3 cli.py calibrate --arch ouro-1.4b --out "$work/profiles"
    mkdir -p calibration/profiles && cp "$work"/profiles/*.json calibration/profiles/
    run 60 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --only ouro-alpaca-cb-W64,ouro-alpaca-refill-W64 --out "$work/validation"
    ;;
  probe)
    run 120 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 180 bench-gemv python3 benchmarks/bench_gemv.py --measure-copy --out "$work/gemv.json"
    run 80 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --parts stages \
      --out "$work/bench"
    run 60 calibrate python3 cli.py calibrate --arch ouro-1.4b --out "$work/profiles"
    cp "$work"/profiles/*.json calibration/profiles/
    run 90 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --only ouro-alpaca-cb-W64,ouro-alpaca-refill-W64,ouro-alpaca-refill-W256 --out "$work/validation"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
tar czf "$OUT/session-$phase.tgz" -C "$work" .
cat "$work/steps.txt"
