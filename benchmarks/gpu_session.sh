#!/usr/bin/env bash
# GPU measurements, in the order this project runs them on the H200 (each phase fits one 10-minute call):
#   bash benchmarks/gpu_session.sh calibrate   GPU tests, calibration of the shipped models, stage/attention bench
#   bash benchmarks/gpu_session.sh validate    the validation matrix, executor throughput bench
#   bash benchmarks/gpu_session.sh full        calibration, then the validation matrix against the fresh
#                                              profiles
#   bash benchmarks/gpu_session.sh probe       three Ouro validation configs and the Ouro stage/attention bench
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
run() {  # run LIMIT_S NAME CMD...: time-limited step with its log kept
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$work/steps.txt"
  tail -n 25 "$work/$name.log"
}
case $phase in
  calibrate)
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 330 calibrate python3 cli.py calibrate --arch ouro-1.4b,ouro-2.6b,huginn-3.5b --out "$work/profiles"
    run 100 bench-stages python3 benchmarks/bench_executor.py --parts stages attention --out "$work/bench"
    ;;
  validate)
    run 420 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    run 120 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --out "$work/bench"
    ;;
  full)
    run 220 calibrate python3 cli.py calibrate --arch ouro-1.4b,ouro-2.6b,huginn-3.5b --out "$work/profiles"
    mkdir -p calibration/profiles && cp "$work"/profiles/*.json calibration/profiles/
    run 330 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    ;;
  probe)  # short: three Ouro validation configs against the shipped profiles, Ouro stage/attention bench
    run 90 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --only ouro-alpaca-cb-W64,ouro-alpaca-refill-W64,ouro-alpaca-refill-W256 --out "$work/validation"
    run 60 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b --parts stages attention \
      --out "$work/bench"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
tar czf "$OUT/session-$phase.tgz" -C "$work" .
cat "$work/steps.txt"
