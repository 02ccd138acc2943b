"""How much a chain of common logits processors adds to a decode step of the default model.

Run: `python benchmarks/bench_processors.py [--rounds 5] [--steps 64]`

The decode step is timed inside `fg.generate_token_ids` (one compiled `while_loop`): a run of
`1 + steps` new tokens minus a run of 1 new token, divided by `steps`, is the cost of one step
(prefill and dispatch cancel out). Configurations are interleaved round by round and the fastest
run of each is used, since the machine is shared (interference only adds time). A first table
times each processor alone on `[batch, 49152]` random logits (jitted, vmapped as in the step;
on such flat logits `TopP` alone must search the whole vocabulary; after `TopK` it never does).

Speed target: the chain adds at most 10% at batch 1 and 20% at batch 8.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
import functional_gen as fg
from functional_gen.processors.base import Context, init_states, process_all, vmap_rows

P = fg.processors
PROMPT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
)


def chain():
    """The six common processors of the speed target, in transformers' order (penalties before
    the sampling filters, so a banned n-gram cannot leave every token filtered out)."""
    return [
        P.RepetitionPenalty(1.1),
        P.NoRepeatNGram(3),
        P.Temperature(0.7),
        P.TopK(50),
        P.TopP(0.9),
        P.MinP(0.05),
    ]


def time_generation(model, prompts, processors, max_new_tokens, key):
    start = time.perf_counter()
    state = fg.generate_token_ids(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        processors=processors,
        sampler=fg.samplers.Multinomial(),
        key=key,
        eos_token_id=(),
    )
    jax.block_until_ready(state.token_ids)
    return time.perf_counter() - start


def decode_table(model, tokenizer, rounds, steps):
    prompt = tokenizer(PROMPT)["input_ids"][:32]
    key = jax.random.key(0)
    configs = [
        (b, name, procs) for b in (1, 8) for name, procs in (("none", ()), ("chain", chain()))
    ]
    runs = {}
    for batch, name, procs in configs:  # compile every program first
        for n in (1, 1 + steps):
            time_generation(model, [prompt] * batch, procs, n, key)
            runs[batch, name, n] = []
    for _ in range(rounds):
        for batch, name, procs in configs:
            for n in (1, 1 + steps):
                runs[batch, name, n].append(time_generation(model, [prompt] * batch, procs, n, key))

    def per_step(batch, name):  # the fastest run of each length: interference only adds time
        return (min(runs[batch, name, 1 + steps]) - min(runs[batch, name, 1])) / steps * 1e3

    print(
        f"\nDecode step, SmolLM2-135M float32: (fastest of {rounds} runs of {1 + steps} tokens - "
        f"fastest of {rounds} runs of 1 token) / {steps}, ms/step"
    )
    print(
        f"{'batch':>5} | {'no processors':>13} | {'6-processor chain':>17} | {'ratio':>6} | target"
    )
    print("-" * 62)
    for batch in (1, 8):
        base, with_chain = per_step(batch, "none"), per_step(batch, "chain")
        target = 1.10 if batch == 1 else 1.20
        verdict = "ok" if with_chain / base <= target else "MISSED"
        print(
            f"{batch:>5} | {base:>13.2f} | {with_chain:>17.2f} | {with_chain / base:>6.3f} | <= {target:.2f} {verdict}"
        )


def processor_table(vocab, max_len=160, repeats=30):
    rng = np.random.default_rng(0)
    print(
        f"\nEach processor alone on [batch, {vocab}] logits, context of {max_len} tokens (median ms/call)"
    )
    print(f"{'processor':>18} | {'batch 1':>8} | {'batch 8':>8}")
    print("-" * 42)
    others = [P.TypicalP(0.9), P.DRY(0.8, dry_penalty_last_n=64), P.XTC(0.1, 0.5)]
    for processor in [chain()] + [[p] for p in chain() + others]:
        label = "6-processor chain" if len(processor) > 1 else type(processor[0]).__name__
        times = []
        for batch in (1, 8):
            logits = jnp.asarray(rng.normal(size=(batch, vocab)) * 3, jnp.float32)
            token_ids = jnp.asarray(rng.integers(0, vocab, size=(batch, max_len)), jnp.int32)
            contexts = Context(
                token_ids=token_ids,
                length=jnp.full((batch,), max_len - 20, jnp.int32),
                prompt_length=jnp.full((batch,), 32, jnp.int32),
                max_new_tokens=jnp.full((batch,), 128, jnp.int32),
                key=jax.random.split(jax.random.key(0), batch),
            )

            @eqx.filter_jit
            def run(procs, logits, contexts):
                def one_row(procs, logits, context):
                    return process_all(procs, init_states(procs, context), logits, context)[1]

                return vmap_rows(one_row, procs, logits.shape[0])(logits, contexts)

            jax.block_until_ready(run(processor, logits, contexts))
            ts = []
            for _ in range(repeats):
                start = time.perf_counter()
                jax.block_until_ready(run(processor, logits, contexts))
                ts.append(time.perf_counter() - start)
            times.append(statistics.median(ts) * 1e3)
        print(f"{label:>18} | {times[0]:>8.3f} | {times[1]:>8.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--skip-decode", action="store_true", help="only the per-processor table")
    parser.add_argument("--skip-table", action="store_true", help="only the decode-step table")
    args = parser.parse_args()
    model, tokenizer = fg.load_model()
    print(f"functional_gen from {Path(fg.__file__).parent}, jax {jax.__version__}, {jax.devices()}")
    if not args.skip_table:
        processor_table(model.config.vocab_size)
    if not args.skip_decode:
        decode_table(model, tokenizer, args.rounds, args.steps)


if __name__ == "__main__":
    main()
