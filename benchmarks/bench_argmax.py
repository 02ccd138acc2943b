"""`jnp.argmax` against `functional_gen.reductions.argmax`, alone and inside `generate`, in ONE
process with the two alternating (the machine is shared: compare the ratios of one run).

    .venv/bin/python benchmarks/bench_argmax.py [--model gemma-3-270m] [--batches 1 8]
        [--new-tokens 33] [--repeats 3] [--quantization int8] [--sampler greedy|multinomial]

Printed: the time of one argmax over `[batch, vocab]` random logits (best of 20, vmapped per row
as the samplers run it), then decode tokens/s of `generate_token_ids` (EOS off, a 16-token
prompt) with the sampler taking `jnp.argmax` ("jnp") or `reductions.argmax` ("ours"):
`B * (N - 1) / (T_N - T_1)`, median of `--repeats`, and whether both produced the same tokens.
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

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray
from profile_decode import fastest

import functional_gen as fg
from functional_gen.reductions import argmax

PROMPT = "The history of the Roman Empire spans many centuries, from the founding of the city"


class JnpGreedy(fg.samplers.AbstractSampler):
    """`Greedy` as it was: `jnp.argmax`."""

    needs_key: bool = False

    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        return jnp.argmax(logits).astype(jnp.int32)


class JnpMultinomial(fg.samplers.AbstractSampler):
    """`Multinomial` as it was: `jax.random.categorical`."""

    needs_key: bool = True

    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        return jax.random.categorical(key, logits).astype(jnp.int32)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampler", choices=["greedy", "multinomial"], default="greedy")
    args = parser.parse_args(argv)
    kwargs = {"quantization": args.quantization} if args.quantization else {}
    model, tokenizer = fg.load_model(args.model, **kwargs)
    vocab = model.vocab_size
    for batch in args.batches:
        x = jax.random.normal(jax.random.key(0), (batch, vocab))
        old = fastest(jax.jit(jax.vmap(jnp.argmax)), x, repeats=20)
        new = fastest(jax.jit(jax.vmap(argmax)), x, repeats=20)
        print(f"argmax [{batch}, {vocab}]: jnp {old * 1e3:.2f} ms, ours {new * 1e3:.2f} ms")
    if args.sampler == "greedy":
        samplers = {"jnp": JnpGreedy(), "ours": fg.samplers.Greedy()}
    else:
        samplers = {"jnp": JnpMultinomial(), "ours": fg.samplers.Multinomial()}
    ids = tokenizer(PROMPT)["input_ids"][:16]

    def call(name, batch, n):
        t = time.perf_counter()
        state = fg.generate_token_ids(
            model,
            [ids] * batch,
            max_new_tokens=n,
            eos_token_id=(),
            sampler=samplers[name],
            key=jax.random.key(0),
        )
        jax.block_until_ready(state)
        return time.perf_counter() - t, np.asarray(state.token_ids)

    n = args.new_tokens
    for batch in args.batches:
        tokens = {}
        for name in samplers:  # compile both lengths
            call(name, batch, 1)
            tokens[name] = call(name, batch, n)[1]
        rates = {name: [] for name in samplers}
        for r in range(args.repeats):
            for name in samplers if r % 2 == 0 else list(samplers)[::-1]:
                t1 = call(name, batch, 1)[0]
                tn = call(name, batch, n)[0]
                rates[name].append(batch * (n - 1) / (tn - t1))
        same = bool((tokens["jnp"] == tokens["ours"]).all())
        old, new = (statistics.median(rates[k]) for k in ("jnp", "ours"))
        print(
            f"{args.model} {args.quantization or 'float32'} {args.sampler} batch {batch}: "
            f"jnp {old:.1f} tok/s, ours {new:.1f} tok/s ({new / old:.3f}x); same tokens: {same}; "
            f"runs jnp {[round(v, 1) for v in rates['jnp']]} ours {[round(v, 1) for v in rates['ours']]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
