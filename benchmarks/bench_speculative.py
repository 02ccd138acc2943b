"""Speculative decoding on the default model: tokens/s with and without each proposer, the
acceptance rate, and transformers' `prompt_lookup_num_tokens` on the same prompts, in one run.

    .venv/bin/python benchmarks/bench_speculative.py [--new-tokens 128] [--batches 1 8]
        [--precisions float32 int8] [--no-transformers] [--quick] [--limit N]
        [--systems plain lookup early-exit] [--num-tokens 10] [--rounds 1]

Tasks (chat prompts, greedy, SmolLM2-135M-Instruct):

- grounded (`GROUNDED`, 24 prompts): rewrite or extract from a given text, edit a given code
  snippet; the answer copies long spans of the prompt, which prompt lookup guesses;
- open-ended (`OPEN`, 8 prompts): stories and explanations, little to copy.

Systems: `plain` (no speculation), `lookup` (`PromptLookup(num_tokens=10, max_ngram_size=3)`,
adaptive), `early-exit` (`EarlyExit(num_layers=8, num_tokens=4)`, opt-in), and `hf-lookup` /
`hf-plain`: transformers' `generate(prompt_lookup_num_tokens=10)` and plain `generate` (batch 1 only:
transformers' assisted generation takes one row), float32, 2 threads. `DraftModel` is not
measured: no second model with SmolLM2's vocabulary is installed.

Every figure is generated tokens / wall time of whole calls (prefill included, the same for
every system; compilation excluded: every group runs once untimed first, cut after a token),
rows of one task batched `B` at a time, our systems taking turns per group (interleaved, since
2026-11-26 19:10 UTC; before, each system ran every group before the next began, so a change of
load between them moved the ratios), `--rounds` passes over the prompts. `max_new_tokens` is `--new-tokens`, EOS ends a row (so the counts of
rows differ; the table gives the mean). The acceptance rate is emitted guesses / verified
guesses; `tok/step` is tokens per target call. The bandwidth bound of plain decoding,
`B * bandwidth / weight bytes` (bandwidth measured now, as `bench_generate.py`), is printed:
speculation may pass it, since one target call emits several tokens.

`--quick` (a check that the script works): 2 prompts, 32 tokens, batch 1, float32. `--limit N`
keeps the first `N` prompts of each task; `--systems` picks our systems (default `plain
lookup`; add `early-exit` to measure `EarlyExit`, which at about 0.3x plain would take longer
than the rest of the run).

Duration of the default full run, estimated from quiet-machine rates (float32 decode 19 ms per
step at batch 1, 78 ms at batch 8): per precision, batch 1 times about 32 prompts x 120 tokens
at 50 tok/s plain and faster with lookup (about 2.5 min), batch 8 4 groups x 128 steps
(about 1.5 min); compilation (each group runs once with a budget of one token first: the same
program, cut short) about 20-40 s per prompt-length bucket, batch and system; transformers
about 2 min. About 10-12 minutes in all; `--no-transformers` saves 2.
Since the padded verification widths (0, 3, 7, 15 guesses and a compaction branch: 5 model
calls per compiled step instead of 3) compilation of a `lookup` group takes longer; not yet
timed on a quiet machine. To stay under 15 minutes: `--precisions float32` halves the run,
`--limit 8` keeps 8 prompts per task, `--no-transformers` saves 2 minutes.

`--num-tokens 10 15` (2026-11-26, `--limit 4`, float32, a machine at load 10 on 2 cores, so only
the per-step figures are worth reading): batch 1 grounded, 1.95 tokens per step at
`num_tokens=10` (acceptance 0.39), 1.92 at 15 (0.29); both verify at the same 16-position width,
so the default stays 10 (transformers' default).

Before / after the cost model and `switch_in_place` (2026-11-26, `--no-transformers`, batch 8
with `--limit 8`, batch 1 with `--limit 2`; a machine at load 10-16 on 2 cores, each
configuration run before then after, so only lookup / plain ratios, and those move by +-0.3):

| precision | batch | task | before | after | after: accept, tok/step |
|---|---|---|---|---|---|
| float32 | 1 | grounded | 0.90 | 1.16 | 0.43, 1.77 |
| float32 | 1 | open | 1.13 | 1.29 | 0.17, 1.02 |
| float32 | 8 | grounded | 0.75 | 1.21 | -, 1.00 (no guess verified) |
| float32 | 8 | open | 0.39 | 0.74 | -, 1.00 (no guess verified) |
| int8 | 8 | grounded | 0.70 | 0.91 | 0.41, 1.78 |
| int8 | 8 | open | 0.62 | 0.67 | 0.47, 1.14 |

At float32 batch 8 the cost model verifies nothing (a call over 4 positions costs 2.86 plain
steps), so both rows are plain decoding and their spread (1.21 and 0.74) is the machine's
noise: `profile_speculative_step.py`, interleaved in one process, gave 1.01x a plain step. The
int8 batch-8 run used a table of bare-call costs (1.15-1.51x) that proved too low in generation;
`VERIFY_COST` now holds the costs that run implies (1.7-2.0x). Int8 at batch 1 was not rerun.

Latest match, no budget cut under the cost model, exploration (2026-11-26, `--limit 3`, a machine
at load 8-10 on 2 cores). Tokens per step, which do not depend on the load (greedy outputs and
the policy are deterministic), before -> after: float32 batch 1 grounded 1.64 -> 2.02, open
1.28 -> 1.32; float32 with 3 rows grounded 1.00 -> 1.36 (exploration made it verify; 3 rows
cost less per verification than 8), open 1.00 -> 1.04; int8 batch 1 grounded 1.00 -> 1.11-1.44
(it never verified before; 1.44 with exploration every 8 steps at 0.7, 1.11 with the final
every 16 at 0.6), open 1.00 -> 1.18-1.20. Speed, as lookup / plain in ONE process with plain,
the old policy and the new taking turns per prompt (two rounds; `PromptLookup` subclassed to
restore the old `propose`): float32 batch 1 grounded 1.07 (old) vs 1.23 (new), open 1.02 vs
1.08; int8 batch 1 grounded 1.03 vs 0.82, open 0.99 vs 0.98. The int8 grounded figure comes from
112 tokens (the first 3 grounded prompts end after 21-55 tokens) on a loaded machine, where an
int8 verification cost about 4.5 plain steps against the table's 1.94 (a quiet machine's):
rerun it quiet with `--limit 6`. Int8 at batch 8 (8 rows per task, one round, same way):
grounded 0.94 (old, 1.08 tokens per row-step) vs 0.83 (new, 1.66), open 0.86 vs 1.02: the new
policy verifies more, which pays at the table's (quiet) costs and not at a loaded machine's.
The bench's own runs that day (not interleaved) moved by
+-0.4 for identical programs (float32 at batch 8 with nothing verified: 0.60x and 1.04x).

Before / after the skipped lookup and the first step without a target call (2026-11-26
19:55-20:08 UTC, `--limit 3 --batches 1 --precisions int8 float32 --no-transformers --rounds
2`, interleaved: plain, lookup and the search before the change (`Speculative._speculate` as
the whole step, subclassed in the driver) taking turns per prompt; load 2-4 on 2 cores; two
runs):

| precision | batch | task | before (run 1, run 2) | after (run 1, run 2) | tok/step |
|---|---|---|---|---|---|
| int8 | 1 | grounded | 0.98, 0.99 | 0.99, 1.00 | 1.00 |
| int8 | 1 | open | 0.99, 0.99 | 1.00, 1.01 | 1.00 |
| float32 | 1 | grounded | 1.53, 1.56 | 1.55, 1.57 | 1.72 |
| float32 | 1 | open | 1.17, 1.12 | 1.16, 1.12 | 1.31 |

A third run (20:10-20:14 UTC, int8 only, `--batches 1 8`, load about 2): batch 1 grounded 1.01
before / 0.99 after, open 1.02 / 1.04; 3 rows (one group of `--limit 3`) grounded 1.00 / 1.00,
open 1.02 / 1.01 (tokens per step 1.00 everywhere): within the noise of each other.

Int8 at batch 1 still never verifies (a 4-position call costs 5.2 plain steps in
`VERIFY_COST`): it now costs about nothing against plain. The same tokens per step before and
after (the change decides nothing differently; only the work of deciding is skipped).
"""

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from bench_generate import measure_bandwidth

import functional_gen as fg
from functional_gen.generation.planning import plan_call
from functional_gen.generation.program import run_prepared

PASSAGES = [
    "The river Thames flows through London. It is 346 kilometres long and passes Oxford, "
    "Reading and Windsor before it reaches the North Sea. Many bridges cross it in the city.",
    "Marie Curie was born in Warsaw in 1867. She moved to Paris in 1891, studied physics and "
    "mathematics, and won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.",
    "Our meeting is on Tuesday at 10 am in room 4B. Please bring the quarterly report, the "
    "budget draft and your laptop. Lunch will be served at noon in the main hall.",
    "The recipe needs two cups of flour, one cup of sugar, three eggs, half a cup of butter and a "
    "teaspoon of vanilla. Bake it at 180 degrees for forty minutes.",
]
CODE = [
    "def total(items):\n    s = 0\n    for i in items:\n        s = s + i\n    return s\n",
    "def greet(name):\n    print('Hello ' + name)\n    print('Welcome ' + name)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "def mean(values):\n    total = sum(values)\n    count = len(values)\n    return total / count\n",
]
GROUNDED = (
    [f"Rewrite this text in the past tense, keeping every detail:\n\n{p}" for p in PASSAGES]
    + [f"Repeat this text exactly, then list its key facts:\n\n{p}" for p in PASSAGES]
    + [f"Rewrite this text with every sentence on its own line:\n\n{p}" for p in PASSAGES]
    + [f"Rename the variables of this code to longer names and show the code:\n\n{c}" for c in CODE]
    + [f"Add a docstring to this function and show the whole code:\n\n{c}" for c in CODE]
    + [f"Add type hints to this code and show the whole code:\n\n{c}" for c in CODE]
)
OPEN = [
    "Write a short story about a dragon who learns to cook.",
    "Explain why the sky is blue.",
    "Write a poem about autumn.",
    "What are three tips for learning a new language?",
    "Describe a day in the life of a lighthouse keeper.",
    "Tell me about the history of chess.",
    "Write a letter to a friend about a recent trip.",
    "Explain how a bicycle works.",
]


def chat(prompt: str):
    return [{"role": "user", "content": prompt}]


def run_ours(model, tokenizer, prompts, batch, new_tokens, systems, rounds=1):
    """Every system of `systems` (name -> `speculative`, `None` for plain) on `prompts`, `batch`
    rows per call, the systems taking turns per group of rows (interleaved, so that the load of
    the shared machine falls on all of them alike), `rounds` times over.

    **Returns:** per system name, `(generated tokens, seconds, emitted guesses, verified
    guesses, target steps)`, summed over the groups and rounds."""

    def call(rows, speculative, warm_up=False):
        _, _, prepared = plan_call(
            model,
            tokenizer,
            [chat(p) for p in rows],
            max_new_tokens=new_tokens,
            speculative=speculative,
        )
        # the warm-up compiles the same program (the budget is an array) but stops after a step
        if warm_up:
            prepared = dataclasses.replace(prepared, budget=jnp.minimum(prepared.budget, 1))
        final, _, _ = run_prepared(prepared)
        jax.block_until_ready(final)
        return final, len(rows)

    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    for speculative in systems.values():  # warm-up: compile every shape (buckets differ)
        for rows in groups:
            call(rows, speculative, warm_up=True)
    totals = {name: [0, 0.0, 0, 0, 0] for name in systems}
    for _ in range(rounds):
        for rows in groups:
            for name, speculative in systems.items():
                t = time.perf_counter()
                final, n = call(rows, speculative)
                total = totals[name]
                total[1] += time.perf_counter() - t
                total[0] += int(np.sum(np.asarray(final.num_generated)[:n]))
                spec = final.search_state
                if spec is not None:
                    total[2] += int(np.sum(np.asarray(spec.accepted)[:n]))
                    total[3] += int(np.sum(np.asarray(spec.proposed)[:n]))
                    total[4] += int(np.sum(np.asarray(spec.steps)[:n]))
    return {name: tuple(total) for name, total in totals.items()}


def run_hf(hf, tokenizer, prompts, new_tokens, lookup):
    import torch

    tokens = seconds = 0
    for i, p in enumerate(prompts):
        ids = tokenizer.apply_chat_template(
            chat(p), add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        kwargs = dict(prompt_lookup_num_tokens=10, max_matching_ngram_size=3) if lookup else {}
        with torch.inference_mode():
            t = time.perf_counter()
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                pad_token_id=2,
                **kwargs,
            )
            if i > 0:  # the first call warms up
                seconds += time.perf_counter() - t
                tokens += out.shape[1] - ids.shape[1]
    return tokens, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--precisions", nargs="+", default=["float32", "int8"])
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, batch 1")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timed passes over the prompts (the systems take turns per group in each)",
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts per task")
    parser.add_argument(
        "--systems",
        nargs="+",
        default=["plain", "lookup"],
        help="ours to run: plain, lookup, early-exit (opt-in: at 0.3x plain it alone would take "
        "longer than the rest of the run)",
    )
    parser.add_argument(
        "--num-tokens",
        type=int,
        nargs="+",
        default=[10],
        help="PromptLookup's num_tokens: one `lookup` system per value (named `lookup-K` when "
        "more than one)",
    )
    args = parser.parse_args(argv)
    tasks = {"grounded": GROUNDED, "open": OPEN}
    if args.quick:
        tasks = {"grounded": GROUNDED[:2], "open": OPEN[:2]}
        args.new_tokens, args.batches, args.precisions = 32, [1], ["float32"]
    if args.limit is not None:
        tasks = {name: prompts[: args.limit] for name, prompts in tasks.items()}
    known = {"plain", "lookup", "early-exit"}
    unknown = sorted(set(args.systems) - known)
    if unknown or "plain" not in args.systems:
        parser.error(f"--systems: unknown {unknown}; 'plain' is required (the x plain column)")
    systems = {"plain": None}
    if "lookup" in args.systems:
        for k in args.num_tokens:
            name = "lookup" if len(args.num_tokens) == 1 else f"lookup-{k}"
            systems[name] = fg.speculative.PromptLookup(num_tokens=k, max_ngram_size=3)
    if "early-exit" in args.systems:
        systems["early-exit"] = fg.speculative.EarlyExit(num_layers=8, num_tokens=4)
    bandwidth = measure_bandwidth()
    print(
        f"# speculative decoding, SmolLM2-135M-Instruct, {args.new_tokens} new tokens at most; "
        f"jax {jax.__version__}, {os.cpu_count()} CPUs, bandwidth {bandwidth:.1f} GB/s (now)"
    )
    print("| precision | batch | task | system | tok/s | x plain | accept | tok/step | bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision in args.precisions:
        load = {"quantization": "int8"} if precision == "int8" else {}
        model, tokenizer = fg.load_model(**load)
        weight_bytes = sum(w.nbytes for w in model.named_weights().values())
        for batch in args.batches:
            bound = batch * bandwidth * 1e9 / weight_bytes
            for task, prompts in tasks.items():
                plain_rate = None
                results = run_ours(
                    model, tokenizer, prompts, batch, args.new_tokens, systems, args.rounds
                )
                for name, (tokens, seconds, acc, prop, steps) in results.items():
                    rate = tokens / seconds
                    plain_rate = plain_rate or rate
                    accept = f"{acc / prop:.2f}" if prop else "-"
                    per_step = f"{tokens / steps:.2f}" if steps else "1"
                    print(
                        f"| {precision} | {batch} | {task} | {name} | {rate:.1f} | "
                        f"{rate / plain_rate:.2f} | {accept} | {per_step} | {bound:.1f} |",
                        flush=True,
                    )
    if not args.no_transformers:
        import torch
        from transformers import AutoModelForCausalLM

        from functional_gen.loading import ensure_default_checkpoint

        torch.set_num_threads(2)
        hf = AutoModelForCausalLM.from_pretrained(
            str(ensure_default_checkpoint()), dtype=torch.float32
        ).eval()
        _, tokenizer = fg.load_model()
        for task, prompts in tasks.items():
            rates = {}
            for name, lookup in (("hf-plain", False), ("hf-lookup", True)):
                tokens, seconds = run_hf(hf, tokenizer, prompts, args.new_tokens, lookup)
                rates[name] = tokens / seconds if seconds else float("nan")
                print(
                    f"| float32 | 1 | {task} | {name} | {rates[name]:.1f} | "
                    f"{rates[name] / rates['hf-plain']:.2f} | - | - | - |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
