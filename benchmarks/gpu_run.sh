#!/bin/sh
# benchmarks/bench_gpu.py (or bench_serving_gpu.py, step 3) on a lent GPU machine (the `device`
# tool's `run`), in ONE call each.
#
# That machine (an H200: Python 3.12 at /opt/torch/.venv/bin/python3 with jax 0.11.2 + CUDA 13,
# torch, transformers 5.17, equinox, jaxtyping, safetensors, tokenizers, numpy, scipy) reaches no
# network: the pure wheels functional_gen needs and it lacks travel with the call, and so does
# the default model's tokenizer (checkpoints are made there with random weights).
#
# 1. Here, once, in the repository root (the session's checkout, the one `run` sends):
#
#        sh benchmarks/gpu_run.sh prepare
#
#    It adds `/.whl/` and `/.gpu-tokenizer/` to .git/info/exclude (ignored, so they travel only
#    when carried), downloads the wheels with
#        pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#            --platform manylinux_2_31_x86_64 (llguidance's tag) --platform manylinux_2_28_x86_64
#            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl ...
#    and saves the tokenizer (`bench_gpu.py --save-tokenizer .gpu-tokenizer`, ~3.5 MB).
#    The wheels, as downloaded on 2026-11-28 (5.9 MB together, far under the 64 MiB a call carries):
#        gguf-0.19.0-py3-none-any                                   118 kB
#        lark-1.3.1-py3-none-any                                    113 kB
#        llguidance-1.9.1-cp39-abi3-manylinux_2_31_x86_64          3.07 MB
#        outlines_core-0.2.14-cp312-cp312-manylinux_2_17_x86_64    2.34 MB
#        jsonschema-4.26.0-py3-none-any                              91 kB
#        jsonschema_specifications-2025.9.1-py3-none-any             18 kB
#        referencing-0.37.0-py3-none-any                             27 kB
#        rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64          371 kB
#
# 2. With the device tool, one call (about 7-8 minutes; the script stops starting new work after
#    --budget-s seconds and saves every figure as it goes):
#
#        run(command="sh benchmarks/gpu_run.sh device", carry=[".whl", ".gpu-tokenizer"],
#            timeout_s=560)
#
#    There it installs the wheels into /tmp/site (pip --no-index --no-deps --target), sets
#    PYTHONPATH=/tmp/site:<repo root> and XLA_PYTHON_CLIENT_MEM_FRACTION=0.55 (torch shares the
#    GPU in the same process), and runs
#        python3 benchmarks/bench_gpu.py --tokenizer .gpu-tokenizer --out $OUT --profile
#            --budget-s 400 [extra arguments of this script after `device`]
#    so that $OUT/bench_gpu.json (every figure), $OUT/bench_gpu.log (the whole output) and
#    $OUT/decode.xplane.pb (the profile) come back. The reply's output_tail ends with the tables.
#    The `generate` program compiles with the GPU plan's command-buffer option itself
#    (`generation_program`); `sh benchmarks/gpu_run.sh device --xla-command-buffers` sets the
#    same option process-wide through XLA_FLAGS instead (the JSON and the table name the
#    XLA_FLAGS used), to compare.
#    Add `--prefill-32k` for the 32,768-token prefill on the 8B shape (run last, if time is left).
#
# 3. benchmarks/bench_serving_gpu.py (issue 56: our paged serving engine against transformers'
#    continuous batching on a 512-request trace, the static batch-64 decode rate, the cost of a
#    speculative verification call) in its own call, after the same `prepare`:
#
#        run(command="sh benchmarks/gpu_run.sh device-serving", carry=[".whl", ".gpu-tokenizer"],
#            timeout_s=580)
#
#    The same installation and environment, then
#        python3 benchmarks/bench_serving_gpu.py --tokenizer .gpu-tokenizer --out $OUT
#            --budget-s 460 [extra arguments of this script after `device-serving`]
#    under `timeout 550`, so that $OUT/bench_serving_gpu.json (every figure, saved after each
#    task), $OUT/bench_serving_gpu.md (the tables) and $OUT/bench_serving_gpu.log come back; the
#    reply's output_tail ends with the tables. The shapes run in the order given (default
#    llama-3.1-8b, then llama-3.2-1b), each task by priority, none started past the budget and
#    each trace run cut at --max-run-s (150 s) or the budget's end: one call is unlikely to
#    reach the 1B shape. `device-serving --shapes llama-3.2-1b` runs that one alone,
#    `--only static verify` a subset.
set -e
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    PYTHON="${PYTHON:-.venv/bin/python}"
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    for d in /.whl/ /.gpu-tokenizer/; do
        grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"
    done
    mkdir -p .whl
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        gguf==0.19.0 lark==1.3.1 llguidance==1.9.1 outlines_core==0.2.14 jsonschema==4.26.0 \
        jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    "$PYTHON" benchmarks/bench_gpu.py --save-tokenizer .gpu-tokenizer
    du -sh .whl .gpu-tokenizer
    ;;
device | device-serving)
    mode="$1"
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$(pwd)" XLA_PYTHON_CLIENT_MEM_FRACTION=0.55 PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    python3 -c "import jax, torch, transformers; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__, 'transformers', transformers.__version__)"
    # the command is stopped before the call's limit; the JSON already holds what was measured
    set +e
    if [ "$mode" = device ]; then
        timeout 540 python3 benchmarks/bench_gpu.py --tokenizer .gpu-tokenizer --out "$OUT" \
            --profile --budget-s 400 "$@" 2>&1 | tee "$OUT/bench_gpu.log"
    else
        timeout 550 python3 benchmarks/bench_serving_gpu.py --tokenizer .gpu-tokenizer \
            --out "$OUT" --budget-s 460 "$@" 2>&1 | tee "$OUT/bench_serving_gpu.log"
    fi
    ;;
*)
    echo "usage: sh benchmarks/gpu_run.sh prepare | device [bench_gpu.py arguments]" \
        "| device-serving [bench_serving_gpu.py arguments]" >&2
    exit 2
    ;;
esac
