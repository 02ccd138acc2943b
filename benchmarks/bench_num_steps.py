"""Decode steps per `Engine.generate` dispatch (`num_steps`): tokens/s and inter-token latency
at 8 busy slots, one run for every `num_steps` (the figures behind `DEFAULT_NUM_STEPS`).

Every slot holds a request that never ends within the run; each `num_steps` first compiles its
dispatch, then runs dispatches for `--tokens` tokens per slot. Reported per `num_steps`: output
tokens/s over all slots, the mean time per decode step, and the gap a client sees between two
bursts of tokens (one dispatch: `num_steps` tokens arrive together), mean and largest.

    python benchmarks/bench_num_steps.py [--slots 8] [--tokens 48] [--max-len 256]
        [--random-weights]

`--random-weights`: a model of SmolLM2-135M's shape with random weights and no tokenizer (for a
machine without the model file, e.g. an accelerator; the step costs the same).

On a shared machine compare the rows as ratios within one run.
"""

import argparse
import time

import jax
import transformers

import functional_gen as fg
from functional_gen.models.config import config_from_hf
from functional_gen.models.decoder import DecoderForCausalLM

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                    max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
                    eos_token_id=[2, 0], pad_token_id=2)  # fmt: skip
"""SmolLM2-135M-Instruct's `config.json` (its shape; `--random-weights`)."""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per slot per setting")
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--num-steps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args(argv)

    if args.random_weights:
        config = config_from_hf(transformers.LlamaConfig(**SMOLLM2_135M))
        model, tokenizer = DecoderForCausalLM(config, key=jax.random.key(0)), None
        prompts = [[1] + [100 + i] * 8 for i in range(args.slots)]
    else:
        model, tokenizer = fg.load_model()
        prompts = [
            tokenizer(f"Story {i}: once upon a time")["input_ids"] for i in range(args.slots)
        ]
    engine = fg.serving.Engine(model, tokenizer, max_slots=args.slots, max_len=args.max_len)
    rows = []
    for n in args.num_steps:
        state = engine.init_decode_state()
        for slot in range(args.slots):
            ids = prompts[slot % len(prompts)]
            max_new = engine.max_len - engine.prefill_width(len(ids))
            request = engine.request(ids, max_new, temperature=0.0)
            state = engine.insert(engine.prefill(request), state, slot)
        state, out = engine.generate(state, n)  # compile
        jax.block_until_ready(out)
        gaps, tokens = [], 0
        start = time.perf_counter()
        while tokens < args.tokens * args.slots:
            t = time.perf_counter()
            state, out = engine.generate(state, n)
            out = jax.device_get(out)
            gaps.append(time.perf_counter() - t)
            tokens += int((out.token_ids >= 0).sum())
        total = time.perf_counter() - start
        steps = len(gaps) * n
        rows.append((n, tokens / total, 1e3 * total / steps, 1e3 * sum(gaps) / len(gaps),
                     1e3 * max(gaps)))  # fmt: skip
    device = jax.devices()[0].device_kind
    print(
        f"{args.slots} busy slots, max_len {args.max_len}, {args.tokens} tokens per slot, {device}"
    )
    print("num_steps  tokens/s  ms/step  burst gap ms (mean, max)")
    base = rows[0][1]
    for n, tps, per_step, gap, worst in rows:
        print(f"{n:9d}  {tps:8.1f}  {per_step:7.1f}  {gap:8.1f} {worst:8.1f}   x{tps / base:.2f}")


if __name__ == "__main__":
    main()
