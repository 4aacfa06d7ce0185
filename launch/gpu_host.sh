#!/usr/bin/env bash
# Run a kljax command on one GPU host: one process, a mesh over all of its local GPUs.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/gpu_host.sh [options] [-- kljax train ARGS...]

Runs the command as ONE process that drives every visible GPU of this host: JAX sees them all as
local devices, and the run's mesh (config.mesh, e.g. --config.mesh.fsdp=-1) spans them. Without a
command it only checks the set-up (JAX with CUDA, the GPUs it sees) and prints install hints.

Options:
  --gpus LIST          use only these GPUs (CUDA_VISIBLE_DEVICES, e.g. 0,1,2,3)
  --mem-fraction F     fraction of each GPU's memory JAX preallocates (default 0.90;
                       XLA_PYTHON_CLIENT_MEM_FRACTION)
  --no-preallocate     allocate on demand instead (slower, but leaves memory to other processes)
  --dry-run            print the environment and command instead of running them
  -h, --help           this help

Install JAX with CUDA into the kljax virtual environment (once; pick the CUDA major of your driver):
  . .venv/bin/activate && pip install -U "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')"
  (newer JAX releases also offer jax[cuda13]; `nvidia-smi` shows the driver's CUDA version.)
  KLJAX_TORCH can pick a CUDA PyTorch build for launch/setup.sh; kljax itself only needs JAX on the GPU.

Example (Llama-3.1-8B on 8xH100, FSDP over the 8 GPUs):
  kljax plan --config configs/paper_llama31_8b_math.py --model known:llama-3.1-8b --chip 8xh100
  launch/gpu_host.sh -- kljax train --config configs/paper_llama31_8b_math.py \
    --config.model.source=/data/Llama-3.1-8B --config.mesh.fsdp=-1 --workdir runs/llama-k1 --resume
Several GPU hosts: one process per host with --coordinator/--num-processes/--process-id on `kljax
train` (or under SLURM, where no flags are needed); see docs/scaling.md.
EOF
}

GPUS="" MEM_FRACTION="0.90" PREALLOCATE=1 DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS="$2"; shift 2 ;;
    --mem-fraction) MEM_FRACTION="$2"; shift 2 ;;
    --no-preallocate) PREALLOCATE=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "gpu_host.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ENV_VARS=(XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION")
[ -n "$GPUS" ] && ENV_VARS+=(CUDA_VISIBLE_DEVICES="$GPUS")
[ "$PREALLOCATE" = 0 ] && ENV_VARS+=(XLA_PYTHON_CLIENT_PREALLOCATE=false)
# Overlap the FSDP all-gathers with compute.
ENV_VARS+=(XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true")

show() {  # one command line, shell-quoted for reading and pasting
  local out="" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then out+="$arg "; else out+="'${arg//\'/\'\\\'\'}' "; fi
  done
  printf '%s\n' "${out% }"
}

if [ "$DRY" = 1 ]; then
  echo "# one process, all local GPUs"
  show env "${ENV_VARS[@]}" "$@"
  exit 0
fi

if [ -f "$REPO/.venv/bin/activate" ] && [ -z "${VIRTUAL_ENV:-}" ]; then
  . "$REPO/.venv/bin/activate"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader \
  || echo "gpu_host.sh: nvidia-smi not found: is the NVIDIA driver installed?" >&2
if ! env "${ENV_VARS[@]}" python -c 'import jax, sys; d = jax.devices(); print("JAX", jax.__version__, d); sys.exit(d[0].platform != "gpu")'; then
  echo "gpu_host.sh: JAX does not see a GPU. Install the CUDA build, e.g." >&2
  echo "  pip install -U \"jax[cuda12]==\$(python -c 'import jax; print(jax.__version__)')\"" >&2
  exit 1
fi
[ $# -eq 0 ] && exit 0
exec env "${ENV_VARS[@]}" "$@"
