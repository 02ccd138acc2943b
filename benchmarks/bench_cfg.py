"""What classifier-free guidance (the processor form and the 2x-batch form) costs against plain
decoding.

Run: `python benchmarks/bench_cfg.py [--rounds 5] [--steps 32] [--transformers]`

`ClassifierFreeGuidance` runs a second decode call of the model per row and step, on the
negative branch's own `KVCache` (in the processor state, vmapped per row). The decode step is
timed inside `fg.generate_token_ids` (one compiled `while_loop`) as in `bench_processors.py`: a
run of `1 + steps` new tokens minus a run of 1 new token, divided by `steps` (prefill, the
negative prompt's prefill and dispatch cancel out). Configurations are interleaved round by
round and the fastest run of each is used (the machine is shared; interference only adds time).

`--transformers` adds the same ratio for transformers' PyTorch `generate(guidance_scale=1.5)`
against its plain greedy decoding (eager, float32), as a reference point.

Speed targets (issue #10): the processor form costs at most 2.1x plain decoding, the 2x-batch
form (`GuidedModel`: both branches in one model call) at most 1.5x at batch 1.
"""

import argparse
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
import functional_gen as fg

PROMPT = "Today, a dragon flew over Paris, France,"
NEGATIVE = "A very happy event happened,"
BATCHES = (1, 4)


def time_generation(model, prompts, processors, max_new_tokens, guided_model=None):
    start = time.perf_counter()
    state = fg.generate_token_ids(
        guided_model or model,
        prompts,
        max_new_tokens=max_new_tokens,
        processors=processors,
        eos_token_id=(),
    )
    jax.block_until_ready(state.token_ids)
    return time.perf_counter() - start


def decode_table(model, tokenizer, rounds, steps):
    prompt = tokenizer(PROMPT)["input_ids"]
    negative = tokenizer(NEGATIVE)["input_ids"]
    from functional_gen.generation.guidance import GuidedModel

    cfg = fg.processors.ClassifierFreeGuidance(model, 1.5, negative_prompt_ids=negative)
    batched = GuidedModel(model, 1.5, negative)
    forms = (("plain", (), None), ("cfg", [cfg], None), ("batched", (), batched))
    configs = [(b, name, procs, m) for b in BATCHES for name, procs, m in forms]
    runs = {}
    for batch, name, procs, m in configs:  # compile every program first
        for n in (1, 1 + steps):
            time_generation(model, [prompt] * batch, procs, n, m)
            runs[batch, name, n] = []
    for _ in range(rounds):
        for batch, name, procs, m in configs:
            for n in (1, 1 + steps):
                runs[batch, name, n].append(time_generation(model, [prompt] * batch, procs, n, m))

    def per_step(batch, name):
        return (min(runs[batch, name, 1 + steps]) - min(runs[batch, name, 1])) / steps * 1e3

    print(
        f"\nDecode step, SmolLM2-135M float32, greedy: (fastest of {rounds} runs of {1 + steps} "
        f"tokens - fastest of {rounds} runs of 1 token) / {steps}, ms/step"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generate import measure_bandwidth

    bandwidth = measure_bandwidth()
    weight_bytes = sum(w.size * w.dtype.itemsize for w in model.named_weights().values())
    bound_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    print(
        f"bandwidth {bandwidth:.1f} GB/s: one read of the weights takes {bound_ms:.1f} ms (the "
        "bound of a decode step)"
    )
    print(
        "| batch | plain | CFG processor | ratio (target <= 2.1) | CFG batched | ratio (target <= 1.5) | bound |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in BATCHES:
        base = per_step(batch, "plain")
        proc, bat = per_step(batch, "cfg"), per_step(batch, "batched")
        print(
            f"| {batch} | {base:.2f} | {proc:.2f} | {proc / base:.3f} | {bat:.2f} | "
            f"{bat / base:.3f} | {bound_ms:.1f} |"
        )


def transformers_table(tokenizer, rounds, steps):
    import torch
    from transformers import AutoModelForCausalLM

    from functional_gen.loading import default_gguf_path

    torch.set_num_threads(2)
    path = default_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompt = tokenizer(PROMPT)["input_ids"]
    negative = tokenizer(NEGATIVE)["input_ids"]

    def run(batch, scale, n):
        ids = torch.tensor([prompt] * batch)
        kwargs = {}
        if scale != 1:
            kwargs = dict(
                guidance_scale=scale, negative_prompt_ids=torch.tensor([negative] * batch)
            )
        start = time.perf_counter()
        with torch.no_grad():
            hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                min_new_tokens=n,
                max_new_tokens=n,
                **kwargs,
            )
        return time.perf_counter() - start

    runs = {(b, s, n): [] for b in BATCHES for s in (1.0, 1.5) for n in (1, 1 + steps)}
    for _ in range(rounds):
        for key in runs:
            runs[key].append(run(*key))

    def per_step(batch, scale):
        return (min(runs[batch, scale, 1 + steps]) - min(runs[batch, scale, 1])) / steps * 1e3

    print("\nReference: transformers (PyTorch eager, float32) generate, same measure, ms/step")
    print(f"{'batch':>5} | {'plain':>8} | {'guidance_scale=1.5':>18} | {'ratio':>6}")
    print("-" * 46)
    for batch in BATCHES:
        base, guided = per_step(batch, 1.0), per_step(batch, 1.5)
        print(f"{batch:>5} | {base:>8.2f} | {guided:>18.2f} | {guided / base:>6.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--transformers", action="store_true", help="add transformers' ratio")
    args = parser.parse_args()
    model, tokenizer = fg.load_model()
    print(f"functional_gen from {Path(fg.__file__).parent}, jax {jax.__version__}, {jax.devices()}")
    decode_table(model, tokenizer, args.rounds, args.steps)
    if args.transformers:
        transformers_table(tokenizer, max(1, args.rounds // 2), args.steps)


if __name__ == "__main__":
    main()
