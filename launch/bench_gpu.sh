#!/usr/bin/env bash
# Run the kljax benchmarks (decode, train, kl, rl) on one GPU host, bf16, with MFU against the chip's peak.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: launch/bench_gpu.sh [options] [OUT_DIR]      (OUT_DIR default: runs/bench_gpu)

Runs `kljax bench train`, `kl`, `decode` and `rl` on this host's first GPU in bfloat16, for the
embedded SmolLM2-135M-Instruct and random-init Qwen2.5-0.5B / Qwen2.5-1.5B (`--model
random:qwen2.5-0.5b`, identical weights on both sides), and writes every result as
OUT_DIR/BENCH_MODEL.json (+ .log), then a table of all of them (OUT_DIR/summary.txt).
MFU is against the chip's dense bf16 peak, looked up from `nvidia-smi --query-gpu=name`
(H100/H200 SXM 989e3, H100 PCIe 756e3, A100 312e3 GFLOP/s) and passed as --peak-gflops; an
unknown chip gets the peak measured in each benchmark's process. Benchmarks run one after another
inside a total time budget; one that would start with under a minute left is skipped, and a
subcommand this kljax does not have is skipped with a message. The PyTorch/transformers peer runs
on the GPU when PyTorch has CUDA, else it is left out (--no-peer); `rl`'s peer (TRL) is left out
when trl is not installed.

Set-up: uses .venv if it exists; else a python3 that already has jax, torch and transformers
(with this checkout on PYTHONPATH); else runs launch/setup.sh and installs JAX's CUDA build
(pip install "jax[cuda12]"), as launch/gpu_host.sh describes.

Options:
  --cpu-smoke        everything at tiny sizes on the CPU (a tiny random Qwen2.5-shaped model), for
                     tests; also KLJAX_BENCH_CPU_SMOKE=1
  --budget SECONDS   total time budget (default 600; 300 with --cpu-smoke)
  --benches LIST     comma-separated subset, in order (default train,kl,decode,rl)
  --gpu-name NAME    chip name for the peak table instead of nvidia-smi's
  -h, --help         this help
EOF
}

SMOKE="${KLJAX_BENCH_CPU_SMOKE:-0}" BUDGET="" BENCHES="train,kl,decode,rl" GPU_NAME="" OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) SMOKE=1; shift ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --benches) BENCHES="$2"; shift 2 ;;
    --gpu-name) GPU_NAME="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "bench_gpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) OUT="$1"; shift ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-runs/bench_gpu}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
[ "$SMOKE" = 1 ] && BUDGET="${BUDGET:-300}" || BUDGET="${BUDGET:-600}"
DEADLINE=$(( $(date +%s) + BUDGET ))
MIN_LEFT=60
[ "$SMOKE" = 1 ] && MIN_LEFT=5

# ------------------------------------------------------------------------------------------ set-up
KLJAX=(kljax)
if [ -x "$REPO/.venv/bin/kljax" ]; then
  [ -z "${VIRTUAL_ENV:-}" ] && . "$REPO/.venv/bin/activate"
elif python3 -c 'import jax, torch, transformers, ml_collections, optax' 2>/dev/null; then
  KLJAX=(python3 -m kljax)
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
  (cd "$REPO" && bash launch/setup.sh) || { echo "bench_gpu.sh: launch/setup.sh failed" >&2; exit 1; }
  . "$REPO/.venv/bin/activate"
  if [ "$SMOKE" != 1 ]; then
    pip install -q -U "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')" \
      || { echo "bench_gpu.sh: installing jax[cuda12] failed" >&2; exit 1; }
  fi
fi

if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS=cpu
  DTYPE=float32
else
  # JAX and PyTorch share the process: allocate on demand rather than preallocating 90% for JAX.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  DTYPE=bfloat16
  if ! python3 -c 'import jax, sys; d = jax.devices(); print("JAX", jax.__version__, d)
sys.exit(d[0].platform != "gpu")'; then
    echo "bench_gpu.sh: JAX does not see a GPU (see launch/gpu_host.sh --help for the CUDA install)" >&2
    exit 1
  fi
  if [ -z "$GPU_NAME" ] && command -v nvidia-smi >/dev/null; then
    GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  fi
fi

peak_for() {  # dense bf16 GFLOP/s of a chip, by nvidia-smi name; empty when unknown
  case "$1" in
    *H100*PCIe*) echo 756000 ;;
    *H100*|*H200*) echo 989000 ;;
    *A100*) echo 312000 ;;
    *) echo "" ;;
  esac
}
PEAK="$(peak_for "$GPU_NAME")"
echo "bench_gpu.sh: chip '${GPU_NAME:-none}', bf16 peak ${PEAK:-unknown (measured per benchmark)} GFLOP/s;" \
  "out $OUT; budget ${BUDGET}s"

# Which subcommands and flags this kljax has (one Python start for all of them).
FLAGS_FILE="$OUT/.bench_flags"
python3 - "$FLAGS_FILE" <<'PY' || true
import argparse, importlib, sys
from benchmarks.cli import BENCHMARKS
with open(sys.argv[1], "w") as out:
    for name, (module, _) in BENCHMARKS.items():
        try:
            parser = argparse.ArgumentParser()
            importlib.import_module(module).configure(parser)
        except Exception as e:  # a benchmark that does not import is reported as missing
            print(f"bench_gpu.sh: kljax bench {name} does not load: {e}", file=sys.stderr)
            continue
        out.write(name + " " + " ".join(o for a in parser._actions for o in a.option_strings) + "\n")
PY
has_bench() { grep -q "^$1 " "$FLAGS_FILE" 2>/dev/null; }
has_flag() { grep "^$1 " "$FLAGS_FILE" | tr ' ' '\n' | grep -qx -- "$2"; }
TORCH_CUDA=0
python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && TORCH_CUDA=1
HAS_TRL=0
python3 -c 'import trl' 2>/dev/null && HAS_TRL=1

# ------------------------------------------------------------------------------------ the benches
if [ "$SMOKE" = 1 ]; then
  TINY="random:qwen2.5-0.5b:num_hidden_layers=1,hidden_size=32,intermediate_size=64,num_attention_heads=4"
  TINY+=",num_key_value_heads=2,vocab_size=256"
  MODELS=("tiny=$TINY")
  COMMON=(--repeats 2 --warmup 0)
  TRAIN=(--batch 2 --seq-len 16 --response-len 8)
  DECODE=(--batch 2 --prompt-len 4 --new-tokens 4)
  KL=(--batch 4 --seq-len 32 --iters 2 --full-batch 1 --full-len 8 --full-chunk 4 --hidden 16 --vocab 64
      --memory-batch 1 --memory-len 32)
  RL=(--prompts 2 --group 2 --new-tokens 4)
else
  MODELS=("smollm2=" "qwen2.5-0.5b=random:qwen2.5-0.5b" "qwen2.5-1.5b=random:qwen2.5-1.5b")
  COMMON=(--repeats 5 --warmup 1)
  TRAIN=(--batch 16 --seq-len 512 --response-len 256)
  DECODE=(--batch 64 --prompt-len 128 --new-tokens 256 --repeats 3)
  KL=(--batch 64 --seq-len 1024 --full-batch 4 --full-len 1024 --full-chunk 256
      --memory-batch 16 --memory-len 2048)
  RL=(--prompts 8 --group 8 --new-tokens 128)
fi

FAILED=0
run_bench() {  # run_bench BENCH TAG ARGS...: one benchmark, inside the budget, into OUT/BENCH_TAG.json
  local bench="$1" tag="$2"; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if ! has_bench "$bench"; then
    echo "bench_gpu.sh: skipping $bench: \`kljax bench $bench\` does not exist in this kljax"; return
  fi
  if [ "$left" -lt "$MIN_LEFT" ]; then
    echo "bench_gpu.sh: skipping $bench $tag: ${left}s of the ${BUDGET}s budget left"; return
  fi
  local args=("$@")
  [ "$TORCH_CUDA" = 0 ] && [ "$SMOKE" != 1 ] && has_flag "$bench" --no-peer && args+=(--no-peer)
  [ "$bench" = rl ] && [ "$HAS_TRL" = 0 ] && has_flag rl --no-peer && args+=(--no-peer)
  [ -n "$PEAK" ] && has_flag "$bench" --peak-gflops && args+=(--peak-gflops "$PEAK")
  has_flag "$bench" --dtype && args+=(--dtype "$DTYPE")
  echo "=== kljax bench $bench ($tag) ${args[*]}"
  timeout -k 10 -s INT "$left" "${KLJAX[@]}" bench "$bench" "${args[@]}" --json "$OUT/${bench}_${tag}.json" \
    2>&1 | tee "$OUT/${bench}_${tag}.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "bench_gpu.sh: kljax bench $bench ($tag) exited $rc (log: $OUT/${bench}_${tag}.log)"; FAILED=1
  fi
}

IFS=',' read -r -a BENCH_LIST <<< "$BENCHES"
for bench in "${BENCH_LIST[@]}"; do
  case "$bench" in
    kl) run_bench kl shapes "${COMMON[@]}" "${KL[@]}"; continue ;;
    train) extra=("${TRAIN[@]}") ;;
    decode) extra=("${DECODE[@]}") ;;
    rl) extra=("${RL[@]}") ;;
    *) extra=() ;;
  esac
  for entry in "${MODELS[@]}"; do
    tag="${entry%%=*}" spec="${entry#*=}"
    model_args=()
    [ -n "$spec" ] && model_args=(--model "$spec")
    run_bench "$bench" "$tag" "${model_args[@]}" "${COMMON[@]}" "${extra[@]}"
  done
done

# ------------------------------------------------------------------------------------- the table
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    fmt = lambda v, f: "-" if v is None else format(v, f)
    rows.append((path.stem, fmt(r.get("kljax"), ".4g"), fmt(r.get("peer"), ".4g"), fmt(r.get("ratio"), ".2f"),
                 fmt(r.get("mfu"), ".3f"), fmt(r.get("peer_mfu"), ".3f"), fmt(r.get("peak_gflops"), ".4g")))
head = ("result", "kljax", "peer", "ratio", "mfu", "peer_mfu", "peak GFLOP/s")
widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
for row in [head, *rows]:
    print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))
PY
exit "$FAILED"
