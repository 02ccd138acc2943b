"""Speculative sampling's draws by `jax.random.categorical` (Gumbel-max, one random number per
vocabulary entry: how the residual / bonus token of `rejection_sample` and `DraftModel`'s
sampled guesses were drawn) against `reductions.categorical` (inverse transform, two uniform
numbers: how they are drawn now), in ONE process, the two taking turns (ratios only).

    .venv/bin/python benchmarks/bench_speculative_draw.py [--draws-only]
        [--models smollm2-135m-instruct gemma-3-270m] [--batch 8] [--rounds 4]
        [--systems lookup early-exit] [--new-tokens 32]

1. `rejection_sample` vmapped over `[8, k + 1, vocab]` target probabilities (one-hot proposals,
   as `PromptLookup`'s), jitted; median of 21 calls.
2. `generate` with `Temperature(0.8)` and `Multinomial()`, `--new-tokens` tokens (EOS off), the
   first `--batch` grounded prompts of `bench_speculative.py` as raw text (Gemma 3's GGUF
   tokenizer has no chat template), with each proposer; whole calls, a new seed each round
   (the same for both variants: the two draw different tokens, so a round's acceptance differs
   between them, not its distribution), the loop steps printed. Each variant is compiled by
   its own `eqx.filter_jit` of the generation program while the modules' `categorical` is that
   variant's draw (the draw is looked up when the program is traced; `filter_jit` caches per
   wrapped function, so each variant wraps its own).

2026-11-26 23:36-23:48 UTC, this 2-core machine shared with two other sessions (ratios only):

| what | old (jax.random.categorical) | new | old / new |
|---|---|---|---|
| `rejection_sample`, [8, 11, 49,152] | 6.08 ms | 0.61 ms | 9.9x |
| `rejection_sample`, [8, 5, 262,144] | 32.2 ms | 3.17 ms | 10.2x |
| Gemma 3 270M f32, `PromptLookup(10)`, batch 8, 32 tokens | 2.86-3.05 s | 2.14-2.35 s | 1.32x (rounds 1.22-1.38) |
| SmolLM2 f32, `PromptLookup(10)`, batch 8, 32 tokens (23:40) | 1.52-1.64 s | 1.41-1.52 s | 1.11x (rounds 1.07-1.11) |
| SmolLM2 f32, `EarlyExit(8, 4)`, batch 8, 32 tokens (23:42) | 4.65-5.10 s | 4.32-4.77 s | 1.13x (rounds 1.04-1.18) |
| Gemma 3 270M f32, `EarlyExit(8, 4)`, batch 8, 32 tokens (23:45) | 13.2-23.2 s | 9.6-11.7 s | 1.34x (rounds 1.33-1.99) |

(`rejection_sample` alone in the later runs: 8.0-14.4x and 9.5-13.0x.) On these raw-text
prompts at `Temperature(0.8)` both models accepted almost nothing: 31-32 loop steps for 32 tokens, so the
gain is mostly the draw of the token after the accepted guesses (over `p_1` in `PromptLookup`'s
0-guess steps), plus, with `EarlyExit`, the draft's sampled guesses.
An earlier attempt with both variants wrapping `program._generate_jit` itself measured the same
program twice (`filter_jit` had cached the first variant's compilation): its 0.9-1.08x were
noise around 1.0.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from bench_speculative import GROUNDED

import functional_gen as fg
from functional_gen.generation import program
from functional_gen.generation.token_ids import generate_state
from functional_gen.reductions import categorical
from functional_gen.speculative import acceptance, proposers


def gumbel_categorical(key, logits):
    """The draw as it was: `jax.random.categorical` (Gumbel-max)."""
    return jax.random.categorical(key, logits).astype(jnp.int32)


DRAWS = {"old": gumbel_categorical, "new": categorical}


def use(name):
    """Point the speculative modules' draw at variant `name` (takes effect when tracing)."""
    acceptance.categorical = proposers.categorical = DRAWS[name]


def alternate(fns, *args, repeats):
    """Median seconds of each `fns[name](*args)`, the functions taking turns."""
    times = {name: [] for name in fns}
    for r in range(repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t = time.perf_counter()
            jax.block_until_ready(fns[name](*args))
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def bench_draws(batch):
    for vocab, k in ((49_152, 10), (262_144, 4)):
        p = jax.nn.softmax(jax.random.normal(jax.random.key(0), (batch, k + 1, vocab)) * 3, -1)
        drafts = jax.random.randint(jax.random.key(1), (batch, k), 0, vocab)
        num = jnp.full((batch,), k)
        keys = jax.random.split(jax.random.key(2), batch)
        fns = {}
        for name in DRAWS:
            use(name)
            fns[name] = jax.jit(
                jax.vmap(lambda p, d, n, key: acceptance.rejection_sample(p, None, d, n, key=key))
            )
            jax.block_until_ready(fns[name](p, drafts, num, keys))  # traced with this draw
        med = alternate(fns, p, drafts, num, keys, repeats=21)
        print(
            f"rejection_sample [{batch}, {k + 1}, {vocab}]: old {med['old'] * 1e3:.2f} ms, "
            f"new {med['new'] * 1e3:.2f} ms, old/new {med['old'] / med['new']:.1f}x",
            flush=True,
        )
    use("new")


def _program(name):
    """A jitted generation program of its own for variant `name`: `eqx.filter_jit` caches its
    compilations per wrapped function, so each variant wraps a function of its own."""

    def run(*args):
        return program._generate_jit(*args)

    run.__name__ = run.__qualname__ = f"generate_with_{name}_draw"
    return eqx.filter_jit(run)


def bench_generate(model_name, system, batch, rounds, n):
    model, tokenizer = fg.load_model(model_name)
    prompts = list(GROUNDED[:batch])
    spec = {
        "lookup": lambda: fg.speculative.PromptLookup(num_tokens=10, max_ngram_size=3),
        "early-exit": lambda: fg.speculative.EarlyExit(num_layers=8, num_tokens=4),
    }[system]()
    jits = {name: _program(name) for name in DRAWS}

    def call(name, seed):
        use(name)
        program.run_generation = jits[name]
        t = time.perf_counter()
        state = generate_state(
            model,
            tokenizer,
            prompts,
            max_new_tokens=n,
            eos_token_id=(),
            processors=[fg.processors.Temperature(0.8)],
            sampler=fg.samplers.Multinomial(),
            speculative=spec,
            key=jax.random.key(seed),
        )
        jax.block_until_ready(state.token_ids)
        seconds = time.perf_counter() - t
        steps = int(np.asarray(state.search_state.steps)[:batch].max())
        return seconds, steps, np.asarray(state.token_ids)[:batch]

    original = program.run_generation
    try:
        first = {name: call(name, 0)[2] for name in DRAWS}  # compile
        if np.array_equal(first["old"], first["new"]):
            print("warning: both variants drew the same tokens (was the draw patched?)")
        runs = {name: [] for name in DRAWS}
        for r in range(rounds):  # a new seed per round, the same for both variants
            for name in list(DRAWS) if r % 2 == 0 else list(DRAWS)[::-1]:
                runs[name].append(call(name, r + 1)[:2])
    finally:
        program.run_generation = original
        use("new")
    secs = {name: [s for s, _ in v] for name, v in runs.items()}
    steps = {name: [k for _, k in v] for name, v in runs.items()}
    med = {name: statistics.median(v) for name, v in secs.items()}
    print(
        f"{model_name} {system} batch {batch}, {n} tokens: whole calls (s) "
        + str({k: [round(x, 2) for x in v] for k, v in secs.items()})
        + f", loop steps {steps}; old/new {med['old'] / med['new']:.3f}x, rounds "
        + str([round(a / b, 2) for a, b in zip(secs["old"], secs["new"])]),
        flush=True,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--systems", nargs="*", default=["lookup", "early-exit"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--draws-only", action="store_true")
    args = parser.parse_args(argv)
    bench_draws(args.batch)
    if not args.draws_only:
        for model_name in args.models:
            for system in args.systems:
                bench_generate(model_name, system, args.batch, args.rounds, args.new_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
