"""`Multinomial`'s draw (`reductions.categorical`, inverse transform sampling over blocks) against
the Gumbel-max draw it replaced and `jax.random.categorical`, alone and inside `generate`, in ONE
process with the variants alternating (the machine is shared: compare the ratios of one run).

    .venv/bin/python benchmarks/bench_sampler.py [--models smollm2-135m-instruct gemma-3-270m]
        [--batches 1 8] [--new-tokens 33] [--repeats 3] [--draws-only]

Printed: the time of one draw over `[batch, vocab]` random logits (median of 15 alternating
calls, jitted and vmapped per row as `Sample` runs the sampler) for the vocabularies of SmolLM2
(49,152) and Gemma 3 (262,144); then, per model and batch, decode tokens/s of
`generate_token_ids` (EOS off, a 16-token prompt, `Temperature(0.8)`) with the old Gumbel draw,
the new draw, and greedy decoding for scale: `B * (N - 1) / (T_N - T_1)`, median of
`--repeats`, alternating the order.

2026-11-26, this 2-core machine heavily loaded (4 sessions; single runs varied up to 3x, so
only the ratios of one run mean anything):

| draw (median of 15)  | gumbel   | jax.random.categorical | ours     | gumbel / ours |
|----------------------|----------|------------------------|----------|---------------|
| [1, 49,152]          | 0.45 ms  | 0.79 ms                | 0.12 ms  | 3.7x          |
| [8, 49,152]          | 3.10 ms  | 12.5 ms                | 0.56 ms  | 5.5x          |
| [1, 262,144]         | 1.60 ms  | 6.65 ms                | 0.28 ms  | 5.7x          |
| [8, 262,144]         | 134 ms   | 199 ms                 | 12.7 ms  | 10.6x         |

(a quieter moment: [8, 262,144] ours 1.06 ms, `reductions.argmax` 0.55 ms, the fused
`sum(exp)` of the block sums alone 0.68 ms.) `generate`, 25 new tokens, `Temperature(0.8)`,
median of 3: SmolLM2 batch 1 1.04x, batch 8 1.13x; Gemma 3 270M batch 1 1.07x (14.0 -> 14.9
tok/s), batch 8 1.21x (56.3 -> 67.9 tok/s). Sampled Gemma 3 batch 8 is still 0.61x greedy (110.8
tok/s) in that run although the draw costs ~2x an argmax alone: the rest of the gap (the
`Temperature` pass, keys, or noise) was not profiled.

Re-measured 2026-11-26 23:00-23:10 UTC (load 1-4 on 2 cores; Gemma 3 270M, batch 8, 32 new
tokens, `generate_token_ids`, greedy and `Temperature(0.8)` + `Multinomial()` alternating, 6
rounds in one process): greedy 98.1, sampled 99.3 tok/s (medians; sampled/greedy 1.01x; per
round 1.19, 0.74, 1.01, 0.98, 1.02, 0.56: a single round swings both ways). An earlier run of 3
rounds with the `Temperature` and the draw apart (tests running beside it): greedy 56.9,
`Multinomial` alone 63.1, `Temperature` + greedy 51.2, `Temperature` + `Multinomial` 67.4.
The 0.61x was noise: no gap. Outside the loop, jitted over `[8, 262144]`, what differs between
the two (the step's tail: `Temperature`, the draw or argmax, the chosen token's logprob, the
dead-row test) took 3.0 vs 2.0 ms (medians of 21; minima 1.6 vs 1.5 ms) of a ~80 ms step.
Since then `Sample` computes only the chosen tokens' logprobs (`reductions.chosen_logprobs`,
not a `[batch, vocab]` `log_softmax` written out): 0.5-0.9 ms less per step at that shape,
greedy and sampled alike.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

import functional_gen as fg
from functional_gen.reductions import argmax, categorical

PROMPT = "The history of the Roman Empire spans many centuries, from the founding of the city"


class GumbelMultinomial(fg.samplers.AbstractSampler):
    """`Multinomial` as it was: `jax.random.categorical`'s Gumbel-max draw with the blockwise
    `argmax` (one threefry random number and two logarithms per vocabulary entry)."""

    needs_key: bool = True

    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        noise = jax.random.gumbel(key, logits.shape, logits.dtype)
        return argmax(noise + logits).astype(jnp.int32)


def _gumbel(key, logits):
    return GumbelMultinomial()(logits, key=key)


def bench_draws(batches, repeats=15):
    draws = {
        "gumbel": jax.jit(jax.vmap(_gumbel)),
        "jax.random.categorical": jax.jit(jax.vmap(jax.random.categorical)),
        "ours": jax.jit(jax.vmap(categorical)),
    }
    for vocab in (49_152, 262_144):
        for batch in batches:
            logits = jax.random.normal(jax.random.key(0), (batch, vocab)) * 2
            keys = jax.random.split(jax.random.key(1), batch)
            times = {name: [] for name in draws}
            for fn in draws.values():
                jax.block_until_ready(fn(keys, logits))
            for r in range(repeats):
                for name in draws if r % 2 == 0 else list(draws)[::-1]:
                    t = time.perf_counter()
                    jax.block_until_ready(draws[name](keys, logits))
                    times[name].append(time.perf_counter() - t)
            ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
            print(
                f"draw [{batch}, {vocab}]: "
                + ", ".join(f"{name} {t:.2f} ms" for name, t in ms.items())
                + f"; gumbel/ours {ms['gumbel'] / ms['ours']:.1f}x, "
                f"jax.random.categorical/ours {ms['jax.random.categorical'] / ms['ours']:.1f}x",
                flush=True,
            )


def bench_generate(model_name, batches, n, repeats):
    model, tokenizer = fg.load_model(model_name)
    ids = tokenizer(PROMPT)["input_ids"][:16]
    temperature = [fg.processors.Temperature(0.8)]
    variants = {
        "gumbel": (temperature, GumbelMultinomial()),
        "ours": (temperature, fg.samplers.Multinomial()),
        "greedy": ((), fg.samplers.Greedy()),
    }

    def call(name, batch, steps):
        processors, sampler = variants[name]
        t = time.perf_counter()
        state = fg.generate_token_ids(
            model,
            [ids] * batch,
            max_new_tokens=steps,
            eos_token_id=(),
            processors=processors,
            sampler=sampler,
            key=jax.random.key(0),
        )
        jax.block_until_ready(state)
        return time.perf_counter() - t

    for batch in batches:
        for name in variants:  # compile both lengths
            call(name, batch, 1)
            call(name, batch, n)
        rates = {name: [] for name in variants}
        for r in range(repeats):
            for name in variants if r % 2 == 0 else list(variants)[::-1]:
                t1 = call(name, batch, 1)
                tn = call(name, batch, n)
                rates[name].append(batch * (n - 1) / (tn - t1))
        med = {name: statistics.median(v) for name, v in rates.items()}
        print(
            f"{model_name} batch {batch} ({n} tokens): "
            + ", ".join(f"{name} {v:.1f} tok/s" for name, v in med.items())
            + f"; ours/gumbel {med['ours'] / med['gumbel']:.3f}x, "
            f"ours/greedy {med['ours'] / med['greedy']:.3f}x; runs "
            + str({k: [round(x, 1) for x in v] for k, v in rates.items()}),
            flush=True,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draws-only", action="store_true")
    args = parser.parse_args(argv)
    bench_draws(args.batches)
    if not args.draws_only:
        for model_name in args.models:
            bench_generate(model_name, args.batches, args.new_tokens, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
