#!/usr/bin/env bash
# Run `kljax train` on a Cloud TPU VM pod slice: one process per worker, one global mesh.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh --name NAME --zone ZONE --accelerator-type TYPE [options] -- kljax train ARGS...

Creates the TPU VM slice NAME (or reuses it if it exists), installs this kljax checkout on every
worker, and starts the same command on all workers at once (gcloud ... ssh --worker=all), streaming
their output here (and to ./tpu_pod_NAME.log). JAX's multi-controller runtime finds the other
workers itself on a TPU VM (jax.distributed.initialize() with no arguments), so the command needs
no multi-host flags; every worker joins the same global mesh.

Options:
  --name NAME               TPU VM name (required)
  --zone ZONE               e.g. us-central2-b, us-west4-a (required)
  --accelerator-type TYPE   e.g. v5litepod-64, v5p-32, v4-32 (required to create)
  --version RUNTIME         TPU VM software version (default: tpu-ubuntu2204-base)
  --project PROJECT         gcloud project (default: gcloud's configured one)
  --spot                    create the slice as Spot (preemptible) capacity
  --bucket BUCKET           mount gs://BUCKET at /mnt/kljax on every worker (gcsfuse) for --workdir:
                            checkpoints must be on storage all workers share and that outlives the VM
  --pip-spec SPEC           pip-install SPEC (e.g. 'kljax @ git+https://...') instead of copying this checkout
  --no-install              skip the install step (the workers are already set up)
  --dry-run                 print the commands instead of running them
  -h, --help                this help

Example (Qwen2.5-7B, fsdp over the 64 chips of a v5e-64; rerun the same line to resume after preemption):
  launch/tpu_pod.sh --name kl-7b --zone us-west4-a --accelerator-type v5litepod-64 --spot --bucket my-bucket -- \
    kljax train --config configs/paper_qwen25_7b_math.py --config.model.source=/mnt/kljax/Qwen2.5-7B \
      --config.mesh.fsdp=-1 --workdir /mnt/kljax/runs/k1-reward --resume --no-progress
Plan the memory first: kljax plan --config ... --model known:qwen2.5-7b --chip v5e-64
EOF
}

NAME="" ZONE="" TYPE="" VERSION="tpu-ubuntu2204-base" PROJECT="" SPOT=0 BUCKET="" PIP_SPEC="" INSTALL=1 DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator-type) TYPE="$2"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --spot|--preemptible) SPOT=1; shift ;;
    --bucket) BUCKET="$2"; shift 2 ;;
    --pip-spec) PIP_SPEC="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "tpu_pod.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$NAME" ] || [ -z "$ZONE" ]; then
  echo "tpu_pod.sh: --name and --zone are required (see --help)" >&2; exit 2
fi
if [ $# -eq 0 ]; then
  echo "tpu_pod.sh: give the command to run after --, e.g. -- kljax train --config ... --workdir ..." >&2; exit 2
fi

REPO="$(cd "$(dirname "$0")/.." && pwd)"
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")

show() {  # one command line, shell-quoted for reading and pasting
  local out="" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then out+="$arg "; else out+="'${arg//\'/\'\\\'\'}' "; fi
  done
  printf '%s\n' "${out% }"
}

run() {  # print (dry run) or run one command
  if [ "$DRY" = 1 ]; then
    show "$@"
  else
    "$@"
  fi
}

on_all_workers() {  # run a shell command line on every worker
  run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command="$1"
}

# 1. Create the slice, or reuse it.
if [ "$DRY" = 1 ] && [ -z "$TYPE" ]; then
  echo "# reuse the existing slice $NAME (no --accelerator-type given)"
elif [ "$DRY" = 1 ] || ! "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" >/dev/null 2>&1; then
  [ -n "$TYPE" ] || { echo "tpu_pod.sh: $NAME does not exist; give --accelerator-type to create it" >&2; exit 2; }
  [ "$DRY" = 1 ] && echo "# create the slice unless it exists (checked with: gcloud compute tpus tpu-vm describe $NAME)"
  CREATE=("${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type="$TYPE" --version="$VERSION")
  [ "$SPOT" = 1 ] && CREATE+=(--spot)
  run "${CREATE[@]}"
fi

# 2. Install kljax (and JAX for TPU) on every worker.
if [ "$INSTALL" = 1 ]; then
  JAX_TPU='pip install -q "jax[tpu]==$(python -c "import jax; print(jax.__version__)")"'
  if [ -n "$PIP_SPEC" ]; then
    on_all_workers "set -e; python3 -m venv ~/kljax-venv; . ~/kljax-venv/bin/activate; pip install -q -U pip; \
pip install -q '$PIP_SPEC'; $JAX_TPU"
    ACTIVATE='. ~/kljax-venv/bin/activate'
  else
    TARBALL="${TMPDIR:-/tmp}/kljax-src-$NAME.tgz"
    run tar czf "$TARBALL" --exclude=.venv --exclude=.git --exclude='__pycache__' -C "$REPO" .
    run "${GCLOUD[@]}" scp "$TARBALL" "$NAME:kljax-src.tgz" "${WHERE[@]}" --worker=all
    on_all_workers "set -e; mkdir -p ~/kljax; tar xzf ~/kljax-src.tgz -C ~/kljax; cd ~/kljax; \
bash launch/setup.sh; . .venv/bin/activate; $JAX_TPU"
    ACTIVATE='cd ~/kljax && . .venv/bin/activate'
  fi
else
  ACTIVATE='{ [ -d ~/kljax/.venv ] && cd ~/kljax && . .venv/bin/activate; } || . ~/kljax-venv/bin/activate'
fi

# 3. Shared, persistent storage for the work directory (checkpoints are written by all workers).
if [ -n "$BUCKET" ]; then
  on_all_workers "set -e; command -v gcsfuse >/dev/null || { \
export GCSFUSE_REPO=gcsfuse-\$(lsb_release -c -s); \
echo \"deb https://packages.cloud.google.com/apt \$GCSFUSE_REPO main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list; \
curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add -; \
sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; }; \
sudo mkdir -p /mnt/kljax && sudo chown \$USER /mnt/kljax; \
mountpoint -q /mnt/kljax || gcsfuse --implicit-dirs $BUCKET /mnt/kljax"
fi

# 4. The same command on every worker; output streamed here.
CMD="$(printf '%q ' "$@")"
LINE="$ACTIVATE && $CMD"
if [ "$DRY" = 1 ]; then
  on_all_workers "$LINE"
else
  on_all_workers "$LINE" 2>&1 | tee "tpu_pod_$NAME.log"
fi
