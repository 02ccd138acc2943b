"""Probe: what would the first `fg.generate` compile in, if the DECODE step scanned its layers
too? (issue 40, item 6). The whole program (`program.run_generation`: prefill + the
`while_loop` of decode steps) of the first call, captured, then compiled in one process after
`jax.clear_caches()`, three ways, each twice: as the library runs it (`base`: decode layers
unrolled, the short prefill unrolled), with the decode layers scanned (`scan_decode`: each step
stacks the layer weights and the layer caches and runs `jax.lax.scan` over layer groups of
`decoder.layer_period`, as `_scan_layers` does for long prefills), and with the prefill scanned
as well (`scan_all`, `decoder.SCAN_MIN_TOKENS = 1`). Prints the CPU seconds of tracing +
lowering and of XLA's compilation, the fusions and dots of the optimized module, and with
`--decode` the decode tokens/s at batch 1 of `base` and `scan_decode` (`128 / (T_129 - T_1)`,
greedy, EOS disabled, best of 3) and whether their tokens agree.

Run: `python benchmarks/probe_scan_decode.py [--models smollm2-135m-instruct gemma-3-270m]
[--decode]`. The scanned decode is patched in here (`DecoderModel._unrolled_layers` replaced for
calls without a prefill chunk); the library does not offer it. Results 2026-11-26 on the shared
2-core machine under load (load average 10-15): see docs/concepts/long_prompts.md, "Compile
time of the first call".
"""

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.generation import program
from functional_gen.models import decoder
from functional_gen.models.attention import LayerCache

PROMPT = "What is the capital of France?"
UNROLLED = decoder.DecoderModel._unrolled_layers


def scanned_decode(self, x, positions, ropes, cache, slot_positions, write_index, ring, **kw):
    """`_unrolled_layers` for prefills; for decode steps (no prefill chunk) a `lax.scan` over
    layer groups whose inputs are the stacked weights AND the stacked layer caches (copies made
    in every step)."""
    period = decoder.layer_period(self.layers)
    if kw.get("prefill_chunk") is not None or period is None:
        return UNROLLED(self, x, positions, ropes, cache, slot_positions, write_index, ring, **kw)
    groups = len(self.layers) // period
    params, statics = [], []
    for j in range(period):
        members = [(g * period + j, self.layers[g * period + j]) for g in range(groups)]
        parts = [(eqx.filter(m, eqx.is_array), cache.k[i], cache.v[i]) for i, m in members]
        params.append(jax.tree.map(lambda *xs: jnp.stack(xs), *parts))
        statics.append(eqx.partition(members[0][1], eqx.is_array)[1])

    def body(x, params):
        out_k, out_v = [], []
        for j, ((p, k, v), static) in enumerate(zip(params, statics)):
            layer = eqx.combine(p, static)
            x, view = layer(
                x,
                positions,
                ropes[layer.self_attn.sliding_window is not None],
                LayerCache(
                    k, v, slot_positions, write_index, *(ring if j in cache.ring_layers else ())
                ),
                **kw,
            )
            out_k.append(view.k)
            out_v.append(view.v)
        return x, (tuple(out_k), tuple(out_v))

    x, (out_k, out_v) = jax.lax.scan(body, x, tuple(params))
    order = [(g, j) for g in range(groups) for j in range(period)]
    return x, [out_k[j][g] for g, j in order], [out_v[j][g] for g, j in order]


def set_variant(name: str) -> None:
    """Patch the decoder for `name` (`base`, `scan_decode`, `scan_all`)."""
    decoder.SCAN_MIN_TOKENS = 1 if name == "scan_all" else 1024
    decoder.DecoderModel._unrolled_layers = UNROLLED if name == "base" else scanned_decode


def generate(model, tokenizer, n):
    """`(seconds, token ids)` of one greedy `fg.generate` of `n` tokens."""
    start = time.perf_counter()
    result = fg.generate(
        model, tokenizer, PROMPT, max_new_tokens=n, sampler=fg.samplers.Greedy(), eos_token_id=[]
    )
    jax.block_until_ready(result.token_ids)
    return time.perf_counter() - start, np.asarray(result.token_ids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--decode", action="store_true", help="also decode tokens/s")
    args = parser.parse_args(argv)
    print("| model | variant | trace+lower CPU (s) | XLA compile CPU (s) | fusions | dots |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        model, tokenizer = fg.load_model(name)
        captured = []
        run = program.run_generation

        def spy(*a, _run=run, _captured=captured, **k):
            _captured.append((a, k))
            return _run(*a, **k)

        program.run_generation = spy
        try:
            generate(model, tokenizer, 8)
        finally:
            program.run_generation = run
        fn_args, kwargs = captured[0]
        for _ in range(2):
            for variant in ("base", "scan_decode", "scan_all"):
                set_variant(variant)
                jax.clear_caches()
                c0 = time.process_time()
                lowered = eqx.filter_jit(program._generate_jit).lower(*fn_args, **kwargs)
                c1 = time.process_time()
                text = lowered.compile().compiled.as_text()
                c2 = time.process_time()
                fusions = len(re.findall(r"= \S+ fusion\(", text))
                dots = len(re.findall(r" dot\(", text))
                print(
                    f"| {name} | {variant} | {c1 - c0:.2f} | {c2 - c1:.2f} | {fusions} | {dots} |",
                    flush=True,
                )
        if args.decode:
            tokens = {}
            for variant in ("base", "scan_decode"):
                set_variant(variant)
                jax.clear_caches()
                generate(model, tokenizer, 129)
                t1 = min(generate(model, tokenizer, 1)[0] for _ in range(3))
                tn = min(generate(model, tokenizer, 129)[0] for _ in range(3))
                tokens[variant] = generate(model, tokenizer, 16)[1]
                print(f"{name} {variant}: decode {128 / (tn - t1):.1f} tok/s (batch 1)", flush=True)
            same = np.array_equal(tokens["base"], tokens["scan_decode"])
            print(f"{name}: greedy tokens equal: {same}", flush=True)
        set_variant("base")
    return 0


if __name__ == "__main__":
    sys.exit(main())
