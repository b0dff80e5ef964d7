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
#   bash benchmarks/gpu_session.sh final       the validation matrix, no-exit throughput of the three policies
#   bash benchmarks/gpu_session.sh chain       GPU tests, the chained (PDL) skinny-matmul sweep and layer chain,
#                                              small-batch stages on the chained path (PDL on, off) and off it
#   bash benchmarks/gpu_session.sh last        GPU tests, stage/attention bench, no-exit throughput (K = 16),
#                                              Ouro-1.4B calibration
#   bash benchmarks/gpu_session.sh spin        GPU tests, the timer bench (bench_timer.py), calibration of the
#                                              three shipped models (spin-queued timer, metadata copy per byte)
#   bash benchmarks/gpu_session.sh matrix      the validation matrix against the shipped profiles
#   bash benchmarks/gpu_session.sh k1          no-exit throughput of the three policies, refill at K = 1
#   bash benchmarks/gpu_session.sh recal       GPU tests, quick stage/attention bench (B = 1 also off the chained
#                                              path), calibration of the shipped models one by one
#   bash benchmarks/gpu_session.sh mini        GPU tests, Ouro-1.4B calibration, two Ouro validation configs
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
  final)  # the validation matrix against the shipped profiles, and no-exit throughput of the three policies
    run 340 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    run 150 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 16 --budget-s 140 --out "$work/bench-throughput"
    ;;
  chain)  # the chained skinny-matmul path (executor.chain): configs, and whole small-batch stages
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 60 bench-chain-layers python3 benchmarks/bench_chain.py --parts layers --out "$work/chain-layers.json"
    for rows in 0 1; do
      run 80 "stages-fuse$rows" python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
        --parts stages attention --fuse-rows "$rows" --sizes 1 2 16 64 --out "$work/stages-fuse$rows"
    done
    CDBSIM_PDL=0 run 60 stages-fuse1-nopdl python3 benchmarks/bench_executor.py --models ouro-1.4b --quick \
      --parts stages --fuse-rows 1 --sizes 1 16 --out "$work/stages-fuse1-nopdl"
    ;;
  last)  # what fits the last few minutes: GPU tests, stages and attention, no-exit throughput, Ouro-1.4B
    run 90 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 45 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --parts stages attention --sizes 1 16 64 --out "$work/bench"
    run 110 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 16 --budget-s 90 --out "$work/bench-throughput"
    run 60 calibrate-ouro-1.4b python3 cli.py calibrate --arch ouro-1.4b --out "$work/profiles"
    ;;
  spin)  # the calibration timer with its spin kernel: GPU tests, its effect on a few stages, three profiles
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 60 bench-timer python3 benchmarks/bench_timer.py --out "$work/timer.json"
    for model in ouro-1.4b ouro-2.6b huginn-3.5b; do
      run 150 "calibrate-$model" python3 cli.py calibrate --arch "$model" --out "$work/profiles"
    done
    ;;
  k1)  # no-exit throughput of the three policies with refill at K = 1 (the launch-heavy case)
    run 150 bench-throughput-k1 python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 1 --budget-s 130 --out "$work/bench-throughput-k1"
    ;;
  matrix)
    run 560 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    ;;
  recal)
    run 90 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 90 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --parts stages attention --sizes 1 2 16 64 --out "$work/bench"
    run 40 bench-stages-cublas python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages \
      --fuse-rows 0 --sizes 1 --out "$work/bench-cublas"
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
  *) echo "unknown phase $phase"; exit 2 ;;
esac
tar czf "$OUT/session-$phase.tgz" -C "$work" .
cat "$work/steps.txt"
