#!/usr/bin/env bash
# The GPU checks of one lent-GPU call, in stages, each time-boxed, logs under $OUT (what comes back).
# Prepare here first: `bash ../shared/gpu/prepare.sh` (writes the ignored .gpu/: the embedded model's
# weights, the missing wheels, SST-2); then the device tool, carry [".gpu"], command e.g.
#   bash bench/gpu_session.sh tier-graphs bench-minilm
# Stages (in the order given):
#   tier-graphs    the GPU tier's CUDA-graph tests (training and inference graphs, resume, auto's fallback)
#   tier-rest      the rest of the GPU tier but train.compile (train/eval/predict/embed, resume, out of memory)
#   tier-compile   the GPU tier's train.compile test (about two minutes)
#   bench-minilm   bench/train_throughput.py: finetune eager and graphs against the Trainer, MiniLM
#   bench-base     the same on a random BERT-base-size encoder
#   bench-compile  the Trainer with torch_compile=True against finetune's graphs, MiniLM, one repeat
#   probe          bench/gpu_probe.py: what finished runs leave in device memory, cuDNN attention A/B
# BENCH_N (default 12000) sets the bench's sentences, BENCH_REPEATS (default 2) its repeats,
# BENCH_RUNNERS the runners of bench-minilm and bench-base (default finetune_bf16,finetune_graphs,hf_grouped_bf16).
set -u
source .gpu/setup.sh || { echo "setup failed"; exit 1; }
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export FINETUNE_GPU_REPORT=$OUT/tier.jsonl
N=${BENCH_N:-12000}
REPEATS=${BENCH_REPEATS:-2}
RUNNERS=${BENCH_RUNNERS:-finetune_bf16,finetune_graphs,hf_grouped_bf16}
pt_timeout=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 170")
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 bench/train_throughput.py --data-dir .gpu/data --device cuda --max-length 128 \
    --n "$N" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] exit $? after $SECONDS s"; grep -v '^  File\|^    ' "$OUT/$name.log" | tail -25
}
tier() {  # tier NAME LIMIT PYTEST-ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider $pt_timeout -rfE "$@" \
    > "$OUT/$name.log" 2>&1
  echo "[$name] exit $? after $SECONDS s"; tail -15 "$OUT/$name.log" | cut -c1-400
}
for stage in "$@"; do
  echo "== $stage (at $SECONDS s)"
  case $stage in
    tier-graphs) tier tier-graphs 200 -k "graph" ;;
    tier-rest) tier tier-rest 200 -k "not graph and not compile" ;;
    tier-compile) tier tier-compile 170 -k "compile" ;;
    bench-minilm) bench bench-minilm 270 --runners "$RUNNERS" \
      --repeats "$REPEATS" --profile ;;
    bench-base) bench bench-base 240 --base --runners "$RUNNERS" \
      --repeats "$REPEATS" ;;
    bench-compile) bench bench-compile 200 --runners finetune_graphs,hf_compile_bf16 --repeats 1 ;;
    probe) timeout 120 python3 bench/gpu_probe.py left sdpa > "$OUT/probe.log" 2>&1
      echo "[probe] exit $? after $SECONDS s"; grep -E '^\[|^run|^  ' "$OUT/probe.log" | tail -25 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
[ -f "$OUT/tier.jsonl" ] && cut -c1-600 "$OUT/tier.jsonl"
echo "== done at $SECONDS s"
