#!/usr/bin/env bash
# The GPU measurements README quotes, one phase per call of at most ten minutes on the H200:
#   bash benchmarks/gpu_session.sh spin     GPU tests, the calibration timer bench (bench_timer.py), calibration
#                                           of the three shipped models -> calibration/profiles/,
#                                           benchmarks/results/calibration-timer/shipped/
#   bash benchmarks/gpu_session.sh rebuild  after a kernel change: the shipped profiles (MODELS=... only those), then
#                                           the validation matrix on them -> calibration/profiles/, .../validation/
#   bash benchmarks/gpu_session.sh matrix   the 20-configuration validation matrix against the shipped profiles, GPU
#                                           tests -> benchmarks/results/validation/ (after `kernels`: .../kernels/shipped/)
#   bash benchmarks/gpu_session.sh last     GPU tests, stage and attention bench, no-exit throughput of the three
#                                           policies (K = 16), Ouro-1.4B calibration -> benchmarks/results/chain/final/
#   bash benchmarks/gpu_session.sh k1       no-exit throughput of the three policies with refill at K = 1
#                                           -> benchmarks/results/throughput-noexit/k1/
#   bash benchmarks/gpu_session.sh kernels  the kernel-level calibration but the few-row families (about 535 s)
#                                           -> calibration/profiles/h200-kernels.json, benchmarks/results/kernels/; then,
#                                           that profile shipped, FAMILIES=few_gemm,few_swiglu bash benchmarks/gpu_session.sh update
#   bash benchmarks/gpu_session.sh unseen   decode and prefill attention, the probes and the host re-measured into the kernel
#                                           profile, then the unseen-shape matrix -> benchmarks/results/unseen/
#                                           (ONLY=name,name runs those configurations of the matrix alone;
#                                           PART=kernels or PART=matrix one of the two halves)
#   bash benchmarks/gpu_session.sh paper    GPU tests, then Huginn W = 64 under the authors' per-step core launches
#                                           -> benchmarks/results/paper/
#   bash benchmarks/gpu_session.sh adaptive the adaptive policy against fixed ones on the same requests
#                                           -> benchmarks/results/adaptive/
#   bash benchmarks/gpu_session.sh host     GPU tests, the host's time per launch re-measured on the serving path
#                                           (kernel and shipped profiles) and split into its parts (probe_host_path.py),
#                                           calibration against serving conditions
#                                           for the two smallest unseen shapes, their unseen-matrix runs again
#                                           -> benchmarks/results/host/
#   bash benchmarks/gpu_session.sh sequence stages timed alone (as calibration does) against queued back to back as
#                                           served, for small shapes and a shipped one -> benchmarks/results/host/
#   bash benchmarks/gpu_session.sh hostvar  the host's time per launch of one configuration run alone twice, then
#                                           after four others in the same process -> benchmarks/results/host/
#   bash benchmarks/gpu_session.sh prefill  GPU tests; prefill attention swept over its launch shape (SWEEP=0:
#                                           not), a full-depth prefill's device time by kernel family
#                                           -> benchmarks/results/prefill-profile/, .../prefill-attention/
#   bash benchmarks/gpu_session.sh attention GPU tests; decode attention swept over tile, warps, head parts and
#                                           splits for four head shapes; every stage at B = 1 ... 256, L = 512
#                                           and 4,096 against its roofline -> benchmarks/results/attention-sweep/
#   bash benchmarks/gpu_session.sh gap      calibration's replay conditions against serving's (scattered KV blocks, the
#                                           depth layout, sustained load, the metadata copy, a prelude just before) for
#                                           core steps of the shipped models (MODELS, default huginn-3.5b; POINTS:
#                                           stage:batch:context,...) -> benchmarks/results/few-row-matmul/gap/
#   bash benchmarks/gpu_session.sh profile  core steps of the unseen shapes kernel by kernel against the kernel model's
#                                           composition: uniform contexts (PDL on; off for the two smallest), then
#                                           mixed contexts and loop steps -> benchmarks/results/decode-profile/
#   bash benchmarks/gpu_session.sh update   families of the kernel profile re-measured (FAMILIES=a,b; default skew:
#                                           the mixed-context attention points) -> calibration/profiles/h200-kernels.json;
#                                           MODELS=a,b: those models' mixed-context core steps -> their profiles
#   bash benchmarks/gpu_session.sh rows     GPU tests; stages at 1-64 rows as built, with late PDL triggers everywhere, and
#                                           with cuBLAS projections; SWEEP=1: the few-row matmul's configs against cuBLAS
#                                           per projection shape -> benchmarks/results/few-row-matmul/
#   bash benchmarks/gpu_session.sh pdl      GPU tests; the executor table; the stages with PDL behind cuBLAS too
#                                           (CDBSIM_PDL=all); calibration's replays of 32-64-row core steps
#                                           -> benchmarks/results/pdl-behind-cublas/
#   bash benchmarks/gpu_session.sh table    GPU tests; the executor table (README: every stage of both models at 1-256
#                                           rows, L = 512 and 4,096, decode attention, prefill); Huginn-3.5B's 64-256-row
#                                           core steps kernel by kernel (shared KV layout) -> benchmarks/results/executor-table/
#   bash benchmarks/gpu_session.sh splits   decode attention's split rule: each model's stages at 1-512 rows with the
#                                           shipped rule and with candidates (RULES, default "8192:2 16384:2"; MODELS,
#                                           SIZES, CONTEXTS, ROUNDS), then the kernel alone at POINTS (ATTENTION=0: not;
#                                           GRID=1: a split's fewest positions too) -> benchmarks/results/attention-rule/
#   bash benchmarks/gpu_session.sh rule     after a change to decode attention's split rule: GPU tests, the executor
#                                           table, the kernel profile's attention tables and probe layers
#                                           -> benchmarks/results/executor-table/, calibration/profiles/h200-kernels.json;
#                                           then `MODELS=... rebuild` for the shipped models whose launches changed
#   bash benchmarks/gpu_session.sh served   served throughput of the three policies (MODELS, default huginn-3.5b; W, default
#                                           256; N requests, default 1024, Alpaca) with the shipped split rule and with
#                                           RULES (default 8192:1, the rule before heads in two parts kept two splits)
#                                           -> benchmarks/results/attention-rule/served/
#   bash benchmarks/gpu_session.sh fewrow   GPU tests; the few-row O and down projections' configs, then Ouro-1.4B's
#                                           layers; Ouro-1.4B's 2-64-row stages as built, with one-kernel attention,
#                                           with the few-row matmul up to 64 rows
#                                           -> benchmarks/results/few-row-matmul/
#   bash benchmarks/gpu_session.sh chainrows  the chained kernels at 2-4 rows: GPU tests, Ouro-1.4B's configs, layers
#                                           and stages against the few-row path -> benchmarks/results/chain-rows/
#   bash benchmarks/gpu_session.sh ab       builds against each other on one board (TREES, ROUNDS): Ouro-1.4B's stages at
#                                           1-16 rows in turn, both models' at 1-256 rows -> benchmarks/results/split-merge/
#   bash benchmarks/gpu_session.sh variants environment settings against each other on one board (VARIANTS, ROUNDS,
#                                           SIZES): Ouro-1.4B's few-row stages in turn -> benchmarks/results/few-row-matmul/
#   bash benchmarks/gpu_session.sh servedvariants  the same settings' served throughput (SERVED: workload:W:requests;
#                                           MODELS) -> benchmarks/results/few-row-matmul/
#   bash benchmarks/gpu_session.sh servedab the same settings served on validation-matrix configurations (ONLY, ROUNDS),
#                                           launch by launch (compare_stages.py) -> benchmarks/results/few-row-matmul/
#   bash benchmarks/gpu_session.sh direct   the few-row matmul with weights loaded into MMA registers: its GPU tests and
#                                           the TMA kernel's; per projection against the Triton kernel at every split
#                                           count; Ouro-1.4B's stages on each (ROUNDS, SIZES, CONTEXTS); its kernels
#                                           under Nsight Compute (NCU=0: not) -> benchmarks/results/few-row-direct/
#   bash benchmarks/gpu_session.sh clock    whole stages (Huginn-3.5B's at 64 and 256 rows, Ouro-1.4B's at 256 rows and its
#                                           prefills) replayed back to back from rest, the SM clock and power sampled
#                                           -> benchmarks/results/step-clock/
#   bash benchmarks/gpu_session.sh wide     Huginn-3.5B served at W = 256 (CB, refill K = 16), where its steps run into the
#                                           power limit, against the simulator -> benchmarks/results/step-clock/wide/
# Results go to $OUT/session-<phase>.tgz (logs, profiles, CSV/JSON, plots). Every step has its own time
# limit so the archive is written even when one step runs long. docs/gpu-runs.md says more.
set -u
phase=${1:-}
case $phase in
  spin | rebuild | matrix | last | k1 | kernels | unseen | paper | adaptive | host | hostvar | sequence | attention | prefill | profile | update | gap | rows | pdl | table | rule | served | splits | fewrow | chainrows | chain2 | maxsplits | ab | variants | servedvariants | servedab | direct | clock | wide) ;;
  *) echo "error: unknown phase '$phase'; phases: spin, rebuild, matrix, last, k1, kernels, unseen, paper, adaptive, host, hostvar, sequence, attention, prefill, profile, update, gap, rows, pdl, table, rule, served, splits, fewrow, chainrows, chain2, maxsplits, ab, variants, servedvariants, servedab, direct, clock, wide" >&2; exit 2 ;;
esac
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
nvidia-smi --query-gpu=name,uuid,memory.total,clocks.sm,clocks.mem,power.limit,driver_version --format=csv \
  > "$work/nvidia-smi.csv"  # the uuid tells whether two calls ran on the same board
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" > "$work/versions.txt"
run() {  # run LIMIT_S NAME CMD...: time-limited step with its log kept; the archive is rewritten after
  local limit=$1 name=$2; shift 2  # every step, so a call cut short still brings back what was done
  local t0=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$work/steps.txt"
  tail -n 25 "$work/$name.log"
  tar czf "$OUT/session-$phase.tgz" --exclude=trace.json.gz -C "$work" .
}
variant_env() {  # variant_env "name:VAR=value,VAR=value": a variant's settings, one per line (none for a bare name)
  [[ $1 == *:* ]] && tr ',' '\n' <<< "${1#*:}"
  return 0
}
over_variants() {  # over_variants LIMIT_S PREFIX CMD...: ROUNDS rounds (default 2) of each variant of VARIANTS in turn,
  # CMD run under the variant's settings with --out $work/PREFIX-NAME-ROUND; those folders are left in `runs`
  local limit=$1 prefix=$2 round variant name settings; shift 2
  runs=()
  for round in $(seq "${ROUNDS:-2}"); do
    for variant in ${VARIANTS:-base early:CDBSIM_PDL_LATE=none}; do
      name=$prefix-${variant%%:*}-$round
      mapfile -t settings < <(variant_env "$variant")
      run "$limit" "$name" env "${settings[@]}" "$@" --out "$work/$name"
      runs+=("$work/$name")
    done
  done
}
case $phase in
  kernels)  # the kernel-level profile (copied out as soon as it exists: the calibration rewrites it per family);
    # run `matrix` in the next call, while the GPU is still held, to validate it on the same board. Every family but
    # few_gemm and few_swiglu (their compiled shapes do not fit this call): ship the profile, then
    # `FAMILIES=few_gemm,few_swiglu ... update`
    families=$(python3 -c "from calibration.kernels import FAMILIES; print(','.join(f for f in FAMILIES if not f.startswith('few_')))")
    run 580 calibrate-kernels python3 cli.py calibrate --kernels --families "$families" --out "$work/profiles"
    cp "$work/profiles/h200-kernels.json" "$OUT/" 2>/dev/null
    ;;
  unseen)  # the kernel profile's probes and prefill attention, then shapes no profile measured whole
    # (PART=kernels or PART=matrix runs one half: together they can pass one call's ten minutes)
    if [ "${PART:-kernels}" = kernels ]; then
      run 340 kernels-update python3 cli.py calibrate --kernels --families attention,skew,probes,mixed_probes,prefill,host \
        --update calibration/profiles/h200-kernels.json --out "$work/profiles"
      cp "$work/profiles/h200-kernels.json" calibration/profiles/h200-kernels.json && cp "$work/profiles/h200-kernels.json" "$OUT/"
    fi
    [ "${PART:-matrix}" = matrix ] && run 560 validate-unseen python3 cli.py validate \
      --matrix calibration/matrices/unseen-h200.json ${ONLY:+--only "$ONLY"} --out "$work/unseen"
    ;;
  paper)  # the executor under the new scheduler, then the authors' launch behaviour on Huginn
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 420 validate-paper python3 cli.py validate --matrix calibration/matrices/paper-huginn-h200.json \
      ${ONLY:+--only "$ONLY"} --out "$work/paper"
    ;;
  attention)  # decode attention over the kernel's tile, warps, head parts and split counts, four head shapes;
    # then every stage of both models at B = 1 ... 256 and contexts 512 and 4,096 against its roofline
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 300 bench-attention python3 benchmarks/bench_executor.py --parts attention --quick --attention-sweep \
      --out "$work/attention"
    run 300 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --parts stages --sizes 1 2 4 8 16 32 64 128 256 --contexts 512 4096 --prefill-tokens 512 2048 4096 \
      --budget-s 280 --out "$work/stages"
    ;;
  profile)  # which kernels of a core step differ from their kernel-table times (PART=uniform or skew: one half)
    # (ARCHS="a b": those architectures, names or files, both with PDL and without, instead of the unseen shapes)
    archs=${ARCHS:-$(printf 'calibration/archs/unseen-%s.json ' huginn-2048 ouro-1536 ouro-2560 huginn-3072)}
    if [ "${PART:-uniform}" = uniform ]; then
      run 240 decode-profile python3 benchmarks/profile_decode.py --arch $archs \
        --points "${POINTS:-1:3072,2:256,4:256,16:256,4:3072,16:3072,64:512}" --out "$work/decode-profile"
      CDBSIM_PDL=0 run 150 decode-profile-nopdl python3 benchmarks/profile_decode.py \
        --arch ${ARCHS:-calibration/archs/unseen-huginn-2048.json calibration/archs/unseen-ouro-1536.json} \
        --points "${POINTS:-1:3072,2:256,4:256,16:256,4:3072,16:3072,64:512}" --out "$work/decode-profile-nopdl"
    fi
    if [ "${PART:-skew}" = skew ]; then  # rows at mixed contexts, at one loop step and at mixed ones
      for steps in "" --mixed-steps; do
        run 200 "decode-profile-skew${steps:+-mixed}" python3 benchmarks/profile_decode.py --arch $archs $steps \
          --points "4:256:1024:1,8:256,8:256:1024:2,8:128:2048:1,16:256:1024:4,16:128:3072:2,32:256:2048:4,48:128:1024:8" \
          --out "$work/decode-profile-skew${steps:+-mixed}"
      done
    fi
    ;;
  update)  # some families of the kernel profile (FAMILIES, default skew: the attention width); with MODELS=a,b the
    # mixed-context core steps of those shipped models instead
    if [ -n "${MODELS:-}" ]; then
      for m in ${MODELS//,/ }; do
        run 200 "remeasure-$m" python3 cli.py calibrate --no-kernels --arch "$m" \
          --update "calibration/profiles/h200-$m.json" --out "$work/profiles"
      done
      cp "$work"/profiles/h200-*.json "$OUT/" 2>/dev/null
    else
      run 300 "kernels-${FAMILIES:-skew}" python3 cli.py calibrate --kernels --families "${FAMILIES:-skew}" \
        --update calibration/profiles/h200-kernels.json --out "$work/profiles"
      cp "$work/profiles/h200-kernels.json" "$OUT/" 2>/dev/null
    fi
    ;;
  prefill)  # where a full-depth prefill's time goes, against the matmul rate
    run 200 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider -n 0
    [ "${SWEEP:-1}" = 1 ] && run 300 prefill-attention python3 benchmarks/bench_prefill_attention.py \
      --out "$work/prefill-attention"  # SWEEP=0 leaves the launch-shape sweep out
    [ "${REFERENCE:-0}" = 1 ] && run 200 prefill-attention-reference python3 benchmarks/bench_prefill_attention.py \
      --quick --reference --out "$work/prefill-attention-reference"  # REFERENCE=1: PyTorch's kernels beside it
    run 200 prefill-profile python3 benchmarks/profile_prefill.py --out "$work/prefill"
    ;;
  adaptive)  # adaptive and the fixed policies on identical requests, steady and shifting load
    run 560 validate-adaptive python3 cli.py validate --matrix calibration/matrices/adaptive-h200.json \
      ${ONLY:+--only "$ONLY"} --out "$work/adaptive"
    ;;
  host)  # the host's time per launch as served, and what serving conditions change for small shapes
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 90 kernels-host python3 cli.py calibrate --kernels --families host \
      --update calibration/profiles/h200-kernels.json --out "$work/profiles"
    cp "$work/profiles/h200-kernels.json" calibration/profiles/h200-kernels.json
    run 150 shipped-host python3 benchmarks/remeasure_host.py calibration/profiles/h200-ouro-1.4b.json \
      calibration/profiles/h200-ouro-2.6b.json calibration/profiles/h200-huginn-3.5b.json --out "$work/profiles"
    run 120 host-path python3 benchmarks/probe_host_path.py --out "$work/host-path"
    for shape in $([ "${GAP:-1}" = 1 ] && echo huginn-2048 ouro-1536); do  # GAP=0 leaves these out
      run 100 "gap-$shape" python3 benchmarks/probe_calibration_gap.py --repeats 10 \
        --arch "calibration/archs/unseen-$shape.json" --out "$work/gap-$shape.json" \
        --points core:1:512,core:1:3072,core:4:3072,core:16:3072,prelude:1:3072,coda:1:3072
    done
    small=$(python3 -c "import json; print(','.join(c['name'] for c in json.load(open('calibration/matrices/unseen-h200.json'))['configs'] if c['name'].startswith(('ouro-1536', 'huginn-2048'))))")
    run 240 validate-unseen python3 cli.py validate --matrix calibration/matrices/unseen-h200.json \
      --only "${ONLY:-$small}" \
      --out "$work/unseen"
    ;;
  sequence)  # does a stage run slower inside a serving sequence than replayed alone?
    for point in unseen-huginn-2048:1:3072 unseen-huginn-2048:8:3072 unseen-ouro-1536:1:3072 huginn-3.5b:1:1024 \
                 unseen-huginn-2048:1:3072:exiting unseen-huginn-2048:8:3072:exiting \
                 unseen-huginn-2048:1:3072:wide unseen-huginn-2048:8:3072:wide \
                 unseen-ouro-2560:8:3072:bigcore unseen-ouro-2560:8:3072; do
      IFS=: read -r name batch context variant <<< "$point"
      arch=$name; [ -f "calibration/archs/$name.json" ] && arch="calibration/archs/$name.json"
      [ -n "${ONLY_VARIANT:-}" ] && [ "$variant" != "$ONLY_VARIANT" ] && continue  # e.g. ONLY_VARIANT=wide
      extra=""; [ "$variant" = exiting ] && extra="--exiting"
      [ "$variant" = wide ] && extra="--table-context 8116"  # tables as wide as the ShareGPT run's (508 blocks)
      [ "$variant" = bigcore ] && extra="--core-batch 64"  # prelude and coda behind a 64-row core step
      run 90 "sequence-$name-B$batch$variant" python3 benchmarks/probe_launch_sequence.py --arch "$arch" \
        --batch "$batch" --context "$context" $extra --out "$work/sequence-$name-B$batch$variant.json"
    done
    ;;
  hostvar)  # is the host's time per launch a property of the machine or of the process's history?
    (lscpu; uptime; nproc) > "$work/host-machine.txt" 2>&1
    one=huginn-2048-alpaca-refill
    for i in 1 2; do
      run 90 "alone-$i" python3 cli.py validate --matrix calibration/matrices/unseen-h200.json --only $one \
        --out "$work/alone-$i"
    done
    run 150 after-others python3 cli.py validate --matrix calibration/matrices/unseen-h200.json \
      --only ouro-1536-alpaca-refill,ouro-1536-alpaca-cb,ouro-1536-sharegpt-refill,huginn-2048-alpaca-norefill,$one \
      --out "$work/after-others"
    ;;
  spin)  # the calibration timer with its spin kernel, then the three shipped profiles
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 60 bench-timer python3 benchmarks/bench_timer.py --out "$work/timer.json"
    for model in ouro-1.4b ouro-2.6b huginn-3.5b; do
      run 150 "calibrate-$model" python3 cli.py calibrate --arch "$model" --no-kernels --out "$work/profiles"
    done
    ;;
  rebuild)  # after a kernel change: the shipped profiles (MODELS: those alone), then the validation matrix on
    # them (the three models and the matrix take about 8 minutes; the kernel profile: the unseen phase)
    for model in ${MODELS:-ouro-1.4b ouro-2.6b huginn-3.5b}; do
      run 150 "calibrate-$model" python3 cli.py calibrate --arch "$model" --no-kernels --out "$work/profiles"
      cp "$work/profiles/h200-$model.json" "$work/profiles/h200-$model.png" calibration/profiles/
    done
    run 400 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    for model in ${MODELS:-ouro-1.4b ouro-2.6b huginn-3.5b}; do  # the board's launch gap, from the matrix's runs
      run 30 "launch-gap-$model" python3 cli.py calibrate --refit "calibration/profiles/h200-$model.json" \
        --launch-gap "$work/validation/measured"
      cp "calibration/profiles/h200-$model.json" "$work/profiles/"
    done
    ;;
  matrix)  # the validation matrix against the shipped profiles, then the GPU tests
    run 420 validate python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --out "$work/validation"
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    ;;
  last)  # the executor table: GPU tests, stages and attention, no-exit throughput at K = 16, Ouro-1.4B profile
    run 90 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 45 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --parts stages attention --sizes 1 16 64 --out "$work/bench"
    run 110 bench-throughput python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 16 --budget-s 90 --out "$work/bench-throughput"
    run 60 calibrate-ouro-1.4b python3 cli.py calibrate --arch ouro-1.4b --out "$work/profiles"
    ;;
  rows)  # the few-row matmul: GPU tests; stages at 1-64 rows as built, with every PDL kernel letting its successor
    # launch late (CDBSIM_PDL_LATE), and with cuBLAS projections (--few-rows 0); then (SWEEP=1) its configs
    # against cuBLAS per projection shape at 1-16 rows and Ouro-1.4B's layer projections per path
    run 120 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick --parts stages
            --sizes 1 2 4 8 16 32 64 --contexts 512 4096 --prefill-tokens 512 --budget-s 130)
    run 150 bench-stages "${stages[@]}" --out "$work/stages"
    CDBSIM_PDL_LATE=few_rows,chain,attention run 150 bench-stages-late "${stages[@]}" --out "$work/stages-late"
    run 150 bench-stages-cublas "${stages[@]}" --few-rows 0 --out "$work/stages-cublas"
    if [ "${SWEEP:-0}" = 1 ]; then
      run 200 bench-rows python3 benchmarks/bench_chain.py --parts rows layers --sizes 1 2 4 8 16 --out "$work/rows.json"
    fi
    ;;
  gap)  # do few-row core steps time slower in calibration's replays than they serve? (each model about 100 s)
    for model in ${MODELS:-huginn-3.5b}; do
      run 200 "gap-$model" python3 benchmarks/probe_calibration_gap.py --repeats 10 --arch "$model" \
        --variants "${VARIANTS:-base,zeros,scatter,depth,sustained,run-like,served,after-prelude,wide,queued}" --points "${POINTS:-core:1:128,core:1:512,core:2:512,core:4:512,core:16:512,core:64:512}" \
        --out "$work/gap-$model.json"
    done
    ;;
  pdl)  # GPU tests; the executor table (every stage at 1-256 rows, attention, prefill); the stages at L = 512 with
    # the Triton kernels PDL-launched behind cuBLAS too (CDBSIM_PDL=all, the previous build); Ouro-1.4B's 32-64-row
    # core steps replayed as calibration replays them, in a calibration-sized bench and back to back
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick --sizes 1 2 4 8 16 32 64 128 256)
    run 300 bench-stages "${stages[@]}" --parts stages attention --contexts 512 4096 --prefill-tokens 512 2048 4096 \
      --budget-s 270 --out "$work/stages"
    CDBSIM_PDL=all run 120 bench-stages-all "${stages[@]}" --parts stages --contexts 512 --prefill-tokens 2048 \
      --budget-s 100 --out "$work/stages-all"
    run 80 gap-ouro-1.4b python3 benchmarks/probe_calibration_gap.py --repeats 10 --arch ouro-1.4b \
      --variants base,sustained,wide,queued --points core:64:32,core:48:32,core:32:32,core:64:128,decode:64:128 \
      --out "$work/gap-ouro-1.4b.json"
    ;;
  table)  # the README's executor table on the build as shipped, and where Huginn-3.5B's many-row steps spend it
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 300 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --sizes 1 2 4 8 16 32 64 128 256 --parts stages attention --contexts 512 4096 --prefill-tokens 512 2048 4096 \
      --budget-s 270 --out "$work/stages"
    run 120 decode-profile-huginn python3 benchmarks/profile_decode.py --arch huginn-3.5b --layout shared \
      --points 64:512,128:512,256:512 --out "$work/decode-profile-huginn"
    ;;
  rule)  # a new split rule changes the executor's launches and the kernels' tables (not the prefill or the
    # mixed-context points, which stay within the rows x heads the rule left alone)
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 300 bench-stages python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick \
      --sizes 1 2 4 8 16 32 64 128 256 --parts stages attention --contexts 512 4096 --prefill-tokens 512 2048 4096 \
      --budget-s 270 --out "$work/stages"
    run 300 kernels-attention python3 cli.py calibrate --kernels --families attention,probes \
      --update calibration/profiles/h200-kernels.json --out "$work/profiles"
    cp "$work/profiles/h200-kernels.json" "$OUT/" 2>/dev/null
    ;;
  served)  # what a split rule does to served throughput: one process per (model, rule), the same requests
    for model in ${MODELS:-huginn-3.5b}; do
      for rule in shipped ${RULES:-8192:1}; do
        run 200 "served-$model-${rule/:/-}" python3 benchmarks/bench_executor.py --models "$model" --quick \
          --parts throughput --exits synthetic --width "${W:-256}" --requests "${N:-1024}" --budget-s 30 \
          $([ "$rule" = shipped ] || echo --attention-rule "$rule") --out "$work/served-$model-${rule/:/-}"
      done
    done
    ;;
  splits)  # decode attention's split count at many rows: the shipped rule (one split from 4,097 row x head
    # programs) against candidates PROGRAMS:LEAST (bench_executor.py --attention-rule), one process per model
    # (MODELS), SIZES and CONTEXTS as given, ROUNDS times in turn (the spread between rounds is the noise)
    for round in $(seq "${ROUNDS:-1}"); do
      for model in ${MODELS:-ouro-1.4b huginn-3.5b}; do
        stages=(python3 benchmarks/bench_executor.py --models "$model" --quick --parts stages --prefill-tokens 512
                --sizes ${SIZES:-1 2 4 8 16 32 64 128 256 512} --contexts ${CONTEXTS:-512 4096} --budget-s 110)
        tag=${model}${ROUNDS:+-round$round}
        run 130 "stages-$tag-shipped" "${stages[@]}" --out "$work/stages-$tag-shipped"
        for rule in ${RULES:-8192:2 16384:2}; do
          run 130 "stages-$tag-${rule/:/-}" "${stages[@]}" --attention-rule "$rule" --out "$work/stages-$tag-${rule/:/-}"
        done
      done
    done
    # the kernel alone at POINTS (B:L), every split count; GRID=1: also with longer fewest positions per split
    [ "${ATTENTION:-1}" = 1 ] && run 240 attention python3 benchmarks/bench_executor.py --models ouro-1.4b --quick \
      --parts attention --attention-points ${POINTS:-128:512 256:512 512:512 64:4096} \
      $([ "${GRID:-0}" = 1 ] && echo --split-grid) --out "$work/attention"
    ;;
  fewrow)  # candidates for Ouro's launches of 2-64 rows: GPU tests; the O and down projections' configs against
    # cuBLAS and the layer's projections (this phase measured them split over K 2-4 ways, which gained nothing:
    # benchmarks/results/few-row-matmul/candidates/); Ouro-1.4B's stages as built, with RoPE, KV write and attention
    # as one kernel up to 16 rows, and with the few-row matmul up to 64
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    run 200 bench-rows python3 benchmarks/bench_chain.py --parts rows layers --shapes ouro.wo ouro.down \
      --sizes 2 8 16 --out "$work/rows-layers.json"
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages --sizes 2 4 8 16 32 64
            --contexts 512 4096 --prefill-tokens 512 --budget-s 60)
    run 80 bench-stages "${stages[@]}" --out "$work/stages"
    run 80 bench-stages-fused "${stages[@]}" --fused-attention-rows 16 --out "$work/stages-fused"
    run 80 bench-stages-few64 "${stages[@]}" --few-rows 64 --out "$work/stages-few64"
    # served few-row core steps ran 4% under the table (validation/served-gap-ouro-W64.txt): replayed alone as
    # calibration times them, or back to back as served?
    run 60 gap-ouro-1.4b python3 benchmarks/probe_calibration_gap.py --repeats 10 --arch ouro-1.4b \
      --variants base,queued --points core:1:512,core:2:512,core:4:512,core:16:512,core:64:512 \
      --out "$work/gap-ouro-1.4b.json"
    ;;
  chainrows)  # the chained kernels at 2-4 rows: their GPU tests; a config sweep of Ouro-1.4B's projections at 2 and
    # 4 rows; the layer's projections chained against the few-row path; Ouro-1.4B's stages as built, with the chained
    # path up to 4 rows (RoPE, KV write and attention as one kernel), and the same with the separate attention kernels
    run 90 gpu-tests python3 -m pytest tests/executor/test_executor_chain.py -m gpu -q -x -p no:cacheprovider
    run 170 sweep python3 benchmarks/bench_chain.py --parts sweep --shapes ouro.wqkv ouro.wo ouro.gate_up ouro.down \
      --sizes 2 4 --out "$work/sweep.json"
    run 50 layers python3 benchmarks/bench_chain.py --parts layers --sizes 1 2 4 --out "$work/layers.json"
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages --sizes 1 2 4 8
            --contexts 512 4096 --prefill-tokens 512 --budget-s 55)
    run 75 stages "${stages[@]}" --out "$work/stages"
    run 75 stages-chain4 "${stages[@]}" --fuse-rows 4 --out "$work/stages-chain4"
    run 75 stages-chain4-split "${stages[@]}" --fuse-rows 4 --fused-attention-rows 1 --out "$work/stages-chain4-split"
    ;;
  chain2)  # the chained path at two rows as built (tuned configs): its GPU tests; Ouro-1.4B's layer projections at 1-2
    # rows; the Ouro models' stages at 1-4 rows as built and with the chained path at one row only
    run 90 gpu-tests python3 -m pytest tests/executor/test_executor_chain.py -m gpu -q -x -p no:cacheprovider
    run 40 layers python3 benchmarks/bench_chain.py --parts layers --sizes 1 2 --out "$work/layers.json"
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b ouro-2.6b --quick --parts stages --sizes 1 2 4
            --contexts 512 4096 --prefill-tokens 512 --budget-s 70)
    run 90 stages "${stages[@]}" --out "$work/stages"
    run 90 stages-chain1 "${stages[@]}" --fuse-rows 1 --out "$work/stages-chain1"
    ;;
  maxsplits)  # GPU tests; Ouro-1.4B's stages at 1-16 rows as built, with decode attention's split cap raised from 16 to 32 and
    # to 64 (bench_executor --attention-rule 8192:1:MOST), and as built again (the drift)
    run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    stages=(python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages --sizes 1 2 4 8 16
            --contexts 512 4096 --prefill-tokens 512 --budget-s 50)
    run 70 stages-base "${stages[@]}" --out "$work/base"
    run 70 stages-most32 "${stages[@]}" --attention-rule 8192:1:32 --out "$work/most32"
    run 70 stages-most64 "${stages[@]}" --attention-rule 8192:1:64 --out "$work/most64"
    run 70 stages-base-again "${stages[@]}" --out "$work/base-again"
    run 30 compare python3 benchmarks/compare_stages.py "$work/base" "$work/most32" "$work/most64" "$work/base-again"
    ;;
  ab)  # kernel builds against each other on one board: GPU tests; then, ROUNDS times (default 2), each tree of TREES in
    # turn (default ".ab/base ."; "." is the working tree, the others copies of other builds carried as ignored paths):
    # Ouro-1.4B's stages at 1-16 rows; then each tree's stages of both models at 1-256 rows (FULL=0: not); every run
    # against the first tree's (compare_stages.py); L = 512 and 4,096. A copy of a build: mkdir -p .ab/base && git archive
    # REV cdbsim executor traces calibration benchmarks/bench_executor.py cli.py pyproject.toml | tar -x -C .ab/base
    [ "${TESTS:-1}" = 1 ] && run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    few="python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages --sizes 1 2 3 4 8 16 --contexts 512 4096 --prefill-tokens 512 --budget-s 50"
    full="python3 benchmarks/bench_executor.py --models ouro-1.4b huginn-3.5b --quick --parts stages --sizes 1 2 4 8 16 32 64 128 256 --contexts 512 4096 --prefill-tokens 512 --budget-s 150"
    runs=()
    for round in $(seq "${ROUNDS:-2}"); do
      for tree in ${TREES:-.ab/base .}; do
        name=$(basename "$(realpath "$tree")")-$round
        run 70 "few-$name" bash -c "cd $tree && PYTHONPATH=/tmp/site:\$PWD $few --out $work/few-$name"
        runs+=("$work/few-$name")
      done
    done
    run 30 compare-few python3 benchmarks/compare_stages.py "${runs[@]}"
    runs=()
    if [ "${FULL:-1}" = 1 ]; then
      for tree in ${TREES:-.ab/base .}; do
        name=$(basename "$(realpath "$tree")")
        run 170 "full-$name" bash -c "cd $tree && PYTHONPATH=/tmp/site:\$PWD $full --out $work/full-$name"
        runs+=("$work/full-$name")
      done
    fi
    [ ${#runs[@]} -gt 1 ] && run 30 compare-full python3 benchmarks/compare_stages.py "${runs[@]}"
    ;;
  variants)  # environment settings against each other on one board: GPU tests (TESTS=0: not); then, ROUNDS times
    # (default 2), each variant of VARIANTS in turn ("name:VAR=value,VAR=value ..."; a bare name runs as built):
    # Ouro-1.4B's stages at SIZES (default 3-16) rows and CONTEXTS (default 512 4096), STAGE_ARGS added (e.g.
    # --stage-layout depth); every run against the first (compare_stages.py)
    [ "${TESTS:-1}" = 1 ] && run 150 gpu-tests python3 -m pytest tests/executor -m gpu -q -x -p no:cacheprovider
    over_variants 70 few python3 benchmarks/bench_executor.py --models ouro-1.4b --quick --parts stages \
      --sizes ${SIZES:-3 4 5 6 8 12 16} --contexts ${CONTEXTS:-512 4096} --prefill-tokens 512 --budget-s 50 \
      ${STAGE_ARGS:-}
    run 30 compare python3 benchmarks/compare_stages.py "${runs[@]}"
    ;;
  servedvariants)  # what environment settings do to served throughput: for each SERVED entry (workload:W:requests;
    # default alpaca:64:256 alpaca:256:768 sharegpt:64:128 sharegpt:256:256), each variant of VARIANTS in turn (as in
    # variants), MODELS' (default ouro-1.4b) three policies on the same requests, one process per run
    for model in ${MODELS:-ouro-1.4b}; do
      for served in ${SERVED:-alpaca:64:256 alpaca:256:768 sharegpt:64:128 sharegpt:256:256}; do
        IFS=: read -r workload width requests <<< "$served"
        for variant in ${VARIANTS:-base late:CDBSIM_PDL_LATE=few_rows}; do
          name=$model-$workload-W$width-${variant%%:*}
          mapfile -t settings < <(variant_env "$variant")
          run "${LIMIT_S:-120}" "served-$name" env "${settings[@]}" python3 benchmarks/bench_executor.py \
            --models "$model" --quick --parts throughput --exits synthetic --workload "$workload" --width "$width" \
            --requests "$requests" --budget-s 30 --out "$work/served-$name"
        done
      done
    done
    ;;
  servedab)  # settings against each other as served: ROUNDS (default 2) rounds of each variant of VARIANTS in turn
    # (as in variants), the validation matrix's ONLY configurations (default ouro-alpaca-refill-W64) served by the
    # executor (cdbsim validate: its launch logs), then compare_stages.py on them (mean launch time per stage and
    # padded rows, and each run's makespan, against the first)
    over_variants "${LIMIT_S:-90}" served python3 cli.py validate --matrix calibration/matrices/validation-h200.json \
      --only "${ONLY:-ouro-alpaca-refill-W64}"
    run 30 compare python3 benchmarks/compare_stages.py "${runs[@]}"
    ;;
  direct)  # the direct few-row kernel against the Triton one on one board: per projection (every split count), in
    # Ouro-1.4B's stages (as built, the direct kernel where it measured faster, everywhere it can), and under Nsight
    # Compute at 4 and 16 rows
    run 200 gpu-tests python3 -m pytest tests/executor/test_executor_few_rows_direct.py \
      tests/executor/test_executor_few_rows_tma.py -m gpu -q -p no:cacheprovider
    run 90 direct python3 benchmarks/bench_chain.py --parts direct --sizes ${SIZES:-1 2 3 4 8 16} \
      --out "$work/direct.json"
    VARIANTS="base direct:CDBSIM_FEW_ROWS_KERNEL=direct direct-all:CDBSIM_FEW_ROWS_KERNEL=direct-all" \
      over_variants 70 few python3 benchmarks/bench_executor.py \
      --models ouro-1.4b --quick --parts stages --sizes ${SIZES:-3 4 8 16} --contexts ${CONTEXTS:-512 4096} \
      --prefill-tokens 512 --budget-s 50
    run 30 compare python3 benchmarks/compare_stages.py "${runs[@]}"
    if [ "${NCU:-1}" = 1 ]; then
      for rows in 4 16; do
        for kernel in triton direct; do
          run 90 "ncu-$kernel-$rows" env CDBSIM_FEW_ROWS_KERNEL=$kernel ncu --clock-control none \
            --profile-from-start off --csv --page raw --metrics gpu__time_duration.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum,smsp__inst_executed.sum,\
'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' python3 benchmarks/probe_layer_kernels.py \
            --rows "$rows"
        done
      done
    fi
    ;;
  clock)  # does a whole stage replay slower once the board has been busy, and is the SM clock why?
    run 400 step-clock python3 benchmarks/probe_step_clock.py --out "$work/step-clock" \
      --stages benchmarks/results/executor-table/stages/stages.csv
    ;;
  wide)  # the simulator against the executor where 256-row steps run at the power-limited clock
    run 560 validate-wide python3 cli.py validate --matrix calibration/matrices/wide-huginn-h200.json \
      --out "$work/wide"
    ;;
  k1)  # no-exit throughput of the three policies with refill at K = 1 (the launch-heavy case)
    run 150 bench-throughput-k1 python3 benchmarks/bench_executor.py --parts throughput --quick --exits none \
      --requests 128 --k 1 --budget-s 130 --out "$work/bench-throughput-k1"
    ;;
esac
tar czf "$OUT/session-$phase.tgz" --exclude=trace.json.gz -C "$work" .
cat "$work/steps.txt"
