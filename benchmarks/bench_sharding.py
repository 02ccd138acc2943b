"""What sharded decoding compiles to: the scale-out plan for Llama-3-8B / 70B shapes, and the
collectives of one decode step of the default model, on forced CPU devices.

    .venv/bin/python benchmarks/bench_sharding.py [--batch 8] [--max-len 4096] [--skip-70b]

On 8 or 64 forced CPU devices (2 real cores) timings mean nothing; this reports what the
compiled programs do instead:

1. `fg.sharding.plan` for Llama-3-8B and Llama-3-70B shapes (bfloat16 weights and cache) on
   meshes of 8 and 64 devices: per-device memory from `compiled.memory_analysis()` next to the
   analytic bytes (weights + KV cache per device), and the collectives in the step's HLO;
2. the default model (SmolLM2-135M) on meshes (1, 8) and (2, 4): collectives per decode step.

Each mesh size runs in its own subprocess (`XLA_FLAGS=--xla_force_host_platform_device_count`).
"""

import argparse
import json
import os
import subprocess
import sys

LLAMA3 = {
    "Llama-3-8B": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "Llama-3-70B": dict(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
}

WORKER = """
import json, sys
import functional_gen as fg
from functional_gen.sharding import plan
from functional_gen.testing import tiny_config
name, fields, mesh, batch, max_len = json.loads(sys.argv[1])
if fields is None:
    model, _ = fg.load_model()
    config = model.config
    dtype = "float32"
else:
    config = tiny_config(**fields, tie_word_embeddings=False)
    dtype = "bfloat16"
print(json.dumps(plan(config, tuple(mesh), batch, max_len, dtype)))
"""


def run(name, fields, mesh, batch, max_len):
    devices = mesh[0] * mesh[1]
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    arg = json.dumps([name, fields, mesh, batch, max_len])
    out = subprocess.run(
        [sys.executable, "-c", WORKER, arg], capture_output=True, text=True, env=env, timeout=3000
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def gib(n):
    return f"{n / 2**30:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--skip-70b", action="store_true")
    args = parser.parse_args()

    print(f"plan: one decode step, batch {args.batch}, {args.max_len} cache slots, bfloat16")
    print(
        "| model | mesh (data, model) | weights/device GiB | KV cache/device GiB | analytic total "
        "| XLA arguments GiB | XLA temp GiB | collectives per step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, fields in LLAMA3.items():
        if name == "Llama-3-70B" and args.skip_70b:
            continue
        for mesh in [(1, 8), (8, 8)]:
            r = run(name, fields, list(mesh), args.batch, args.max_len)
            coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items() if v)
            print(
                f"| {name} | {mesh} | {gib(r['weights_bytes'])} | {gib(r['cache_bytes'])} | "
                f"{gib(r['weights_bytes'] + r['cache_bytes'])} | {gib(r['argument_bytes'])} | "
                f"{gib(r['temp_bytes'])} | {coll} |",
                flush=True,
            )

    print("\nSmolLM2-135M (float32), one decode step, batch 8, 256 slots:")
    print("| mesh | weights/device MiB | collectives per step |")
    print("|---|---|---|")
    for mesh in [(1, 8), (2, 4)]:
        r = run("SmolLM2-135M", None, list(mesh), 8, 256)
        coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items() if v)
        print(f"| {tuple(mesh)} | {r['weights_bytes'] / 2**20:.1f} | {coll} |", flush=True)


if __name__ == "__main__":
    main()
