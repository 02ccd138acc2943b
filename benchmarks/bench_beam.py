"""Beam search speed against transformers' PyTorch `generate(num_beams=...)`, in one run.

    .venv/bin/python benchmarks/bench_beam.py [--beams 4] [--new-tokens 64] [--repeats 3]

SmolLM2-135M-Instruct (the embedded default model), float32, on the CPU; a 32-token prompt
(batch 1) or two (batch 2), EOS disabled so that every search runs all `--new-tokens` steps.
Tokens/s counts the returned sequence's tokens per prompt: `batch * new_tokens / seconds`.
Each figure is the median of `--repeats` calls after a warm-up call (which compiles ours); the
systems alternate so that machine drift hits both. The memory-bandwidth bound of one decode
step (every weight read once per step, for all beams together) is printed beside the figures.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import numpy as np

import functional_gen as fg
from functional_gen.samplers import BeamSearch

TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
) * 4


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from functional_gen.loading import default_gguf_path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_generate import measure_bandwidth

    torch.set_num_threads(2)
    model, tokenizer = fg.load_model()
    path = default_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompt = tokenizer(TEXT)["input_ids"][:32]
    n = args.new_tokens
    bandwidth = measure_bandwidth()
    weight_bytes = sum(w.size * w.dtype.itemsize for w in model.named_weights().values())
    bound = bandwidth * 1e9 / weight_bytes  # decode steps per second
    print(f"bandwidth {bandwidth:.1f} GB/s: at most {bound:.1f} decode steps/s")

    def ours(batch):
        state = fg.SequenceState.from_token_ids([prompt] * batch, vocab_size=model.vocab_size)
        out = fg.generate(
            model,
            tokenizer,
            state,
            max_new_tokens=n,
            eos_token_id=(),
            sampler=BeamSearch(args.beams),
        )
        jax.block_until_ready(out.token_ids)
        return np.asarray(out.token_ids)

    def theirs(batch):
        ids = torch.as_tensor([prompt] * batch)
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                num_beams=args.beams,
                do_sample=False,
                early_stopping=False,
                pad_token_id=2,
            )
        return out[:, 32:].numpy()

    rows = []
    for batch in (1, 2):
        a, b = ours(batch), theirs(batch)  # warm-up (compiles ours)
        same = a.tolist() == b.tolist()
        times = {"ours": [], "transformers": []}
        for _ in range(args.repeats):
            for name, fn in (("ours", ours), ("transformers", theirs)):
                t = time.perf_counter()
                fn(batch)
                times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        tps = {k: batch * n / v for k, v in med.items()}
        steps_per_s = n / med["ours"]
        rows.append(
            (
                batch,
                tps["ours"],
                tps["transformers"],
                tps["ours"] / tps["transformers"],
                steps_per_s / bound,
                same,
            )
        )
    print(
        f"\nbeam search, {args.beams} beams, {n} new tokens, float32 (tokens/s of returned text):"
    )
    print("| batch | functional_gen | transformers | ratio | our steps/s vs bound | same tokens |")
    print("|---|---|---|---|---|---|")
    for batch, ours_tps, hf_tps, ratio, frac, same in rows:
        print(f"| {batch} | {ours_tps:.1f} | {hf_tps:.1f} | {ratio:.2f}x | {frac:.0%} | {same} |")


if __name__ == "__main__":
    main()
