"""Benchmark of the grammar pushdown automaton (`functional_gen.structured.pushdown`), every
comparison measured in one run (ratios, since the machine is shared).

1. Build time of five recursive grammars at stack depth 32 (JSON, arithmetic, a tiny SQL, a
   Lisp, function calls), against the bounded-depth DFA of the same grammar at max_depth 4.
   Target: the Lark JSON grammar with depth 32 builds in under 1 s.
2. Decode step on the default model (SmolLM2-135M-Instruct, float32), batch 1 and 8: the
   JSON grammar as a pushdown automaton (stack depth 32) and as the bounded DFA (max_depth 4)
   vs no processor; 16 steps inside one jitted `fori_loop`, rounds interleaved, best round
   kept. Target: pushdown / unconstrained < 1.10.

Recorded on 2026-11-22 on the shared 2-core machine (load average 6-11, so builds vary 2x):
JSON grammar, stack depth 32, built alone in 0.5-0.65 s (the target is 1 s); the other four
grammars 0.03-0.9 s. Decode step, 16 steps, best of 3 interleaved rounds: batch 1 15.4 ms
unconstrained vs 15.3 ms pushdown (ratio 0.995, median 1.014); batch 8 64.0 vs 62.9 ms (0.982,
median 0.985); the DFA at depth 4: 0.990 and 1.119. The mask's cost (a bitmask row, <= 12
candidate walks, the previous token's bytes) is below the noise of the model's step.
Again on 2026-11-25 (quiet, `--rounds 5`, two runs): JSON grammar built in 33 ms; batch 1
22.0-22.3 ms unconstrained vs 22.2-22.6 pushdown (ratio 1.006-1.013), batch 8 34.3-34.8 vs
34.6 (0.995-1.010); the bandwidth bound (printed since then) 16.8-21.7 ms per step.

3. (`--json-schema`, alone) Decode step of a small JSON Schema with a free-form value
   (`SMALL_FREE_FORM`), as the token automaton (`free_form_depth=1`) and as a pushdown
   automaton (`free_form_depth=None`), batch 1 and 8, rounds interleaved. Recorded on
   2026-11-23 (CPU, 16 steps): at 04:34 UTC (load 1.1, `--rounds 5`) pushdown / DFA best
   1.051 (median 0.977) at batch 1, 1.039 (0.992) at batch 8; at 04:53 UTC (load 3.5-4.9,
   `--rounds 9`) 0.952 (0.846) and 0.909 (0.886). Within noise of each other: the pushdown's
   per-step work (bitmask row, <= 8 candidate walks, the previous token's bytes) is small
   beside the model's step, so decoding does not argue against `free_form_depth=None`.

4. (`--forks`, alone) Greedy generation at batch 1 (`--steps`, default 64) under llama.cpp's
   `c.gbnf` (a grammar with forks, parallel stacks) with `fork_reach` and with
   `every_fork_token=True` (the mask before `fork_reach`, the same masks), and under
   `json.gbnf`, each against no processor, rounds interleaved. Target: c.gbnf /
   unconstrained within 1.25 (before `fork_reach`: 1.7-1.8). Recorded on 2026-11-28 on the
   shared 2-core machine at load average 13-18 (unconstrained 117-165 ms a step against 22
   quiet, so only the order holds): `--rounds 3 --steps 48`, best ratios json.gbnf 1.142,
   c.gbnf every fork token 1.682, c.gbnf `fork_reach` 1.259; `--rounds 5 --steps 32`: 0.875,
   1.150, 0.917. The greedy text never reached a fork position (0 steps walked fork tokens),
   so `fork_reach` walked none; at the `else` position it walks 873 (28 chunks of 32).
   Again on 2026-12-02 01:47 UTC (load average 1.2-1.6: one other single-core test process;
   bandwidth 24.7 GB/s measured in the run, bound 21.8 ms a step), `--rounds 5 --steps 48`:
   unconstrained 29.5 ms a step; best / median ratios json.gbnf 1.031 / 1.004, c.gbnf every
   fork token 1.850 / 1.758, **c.gbnf `fork_reach` 1.056 / 1.032** (target 1.25: met); 968
   fork tokens, 3 of 152 positions reach a fork, `fork_reach` 19,456 bytes.

Run: `python benchmarks/bench_pushdown.py [--rounds 5] [--json-schema | --forks [--steps 64]]`
(about 2-4 minutes on 2 CPU cores).
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import equinox as eqx
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_structured import step_timer, table

import functional_gen as fg
from functional_gen.structured import pushdown_automaton, vocabulary_from_tokenizer
from functional_gen.structured.grammar import grammar_automaton
from functional_gen.structured.pushdown import ParallelPushdownConstraint
from tests.structured.cases import C_GBNF, JSON_GBNF, PUSHDOWN_GRAMMARS


def builds(vocabulary, repeat: int):
    rows = []
    for name, grammar in PUSHDOWN_GRAMMARS.items():
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            pda = pushdown_automaton(grammar, vocabulary, stack_depth=32, cache=False)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        dfa = grammar_automaton(grammar, vocabulary, max_depth=4, cache=False)
        dfa_time = time.perf_counter() - start
        real = (pda.candidates < pda.vocab_size).sum(-1).max()
        rows.append(
            [
                name,
                f"{min(times) * 1e3:.0f}",
                pda.num_positions,
                f"{real} (padded {pda.candidates.shape[-1]})",
                pda.masks.shape[0],
                f"{pda.nbytes / 2**20:.2f}",
                f"{dfa_time * 1e3:.0f}",
                dfa.num_states,
                f"{dfa.nbytes / 2**20:.2f}",
            ]
        )
    print("## 1. Build: pushdown automaton (stack depth 32) vs bounded-depth DFA (max_depth 4)\n")
    table(
        [
            "grammar",
            "PDA build ms (best)",
            "positions",
            "candidates per (position, top)",
            "bitmask rows",
            "PDA MiB",
            "DFA build ms",
            "DFA states",
            "DFA MiB",
        ],
        rows,
    )


def weight_read_ms(model) -> float:
    """The memory-bandwidth bound of one decode step, ms: the model's weight bytes over the read
    bandwidth measured now (`bench_generate.measure_bandwidth`); printed once."""
    from bench_generate import measure_bandwidth

    bandwidth = measure_bandwidth()
    weight_bytes = sum(w.size * w.dtype.itemsize for w in model.named_weights().values())
    bound = weight_bytes / (bandwidth * 1e9) * 1e3
    print(
        f"memory bandwidth {bandwidth:.1f} GB/s (measured now): one read of the weights takes "
        f"{bound:.1f} ms, the bound of a decode step at any batch\n"
    )
    return bound


def decode_step(model, tokenizer, rounds: int, steps: int = 16):
    json_grammar = PUSHDOWN_GRAMMARS["json"]
    pushdown = fg.processors.Grammar(json_grammar, tokenizer)
    bounded = fg.processors.Grammar(json_grammar, tokenizer, max_depth=4)
    assert pushdown.pushdown is not None and bounded.pushdown is None
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a cat as a nested JSON value."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )

    def runner(processors, batch):
        return step_timer(model, prompt, processors, batch, steps)

    bound = weight_read_ms(model)
    rows = []
    for batch in (1, 8):
        runs = {
            "none": runner([], batch),
            "pda": runner([pushdown], batch),
            "dfa": runner([bounded], batch),
        }
        samples = {k: [] for k in runs}
        for _ in range(rounds):
            for k, f in runs.items():
                samples[k].append(f())
        plain = min(samples["none"])
        ratio = min(samples["pda"]) / plain
        rows.append(
            [
                batch,
                f"{plain * 1e3:.1f}",
                f"{min(samples['pda']) * 1e3:.1f}",
                f"{ratio:.3f}",
                "yes" if ratio < 1.10 else "NO",
                f"{statistics.median(samples['pda']) / statistics.median(samples['none']):.3f}",
                f"{min(samples['dfa']) / plain:.3f}",
                f"{bound:.1f}",
            ]
        )
    print("## 2. Decode step (ms per step; JSON grammar vs no processor)\n")
    table(
        [
            "batch",
            "unconstrained",
            "pushdown",
            "ratio (best)",
            "< 1.10",
            "ratio (median)",
            "DFA depth 4 ratio (best)",
            "bandwidth bound",
        ],
        rows,
    )


def interleaved(runs: dict, rounds: int) -> tuple[dict, dict]:
    """`(best, median)` seconds per step of each timer in `runs` (name -> `step_timer`
    function), over `rounds` rounds that call every timer once in turn."""
    samples = {k: [] for k in runs}
    for _ in range(rounds):
        for k, f in runs.items():
            samples[k].append(f())
    best = {k: min(v) for k, v in samples.items()}
    return best, {k: statistics.median(v) for k, v in samples.items()}


SMALL_FREE_FORM = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
    "required": ["name"],
}
"""A small schema with a free-form value (`tags`: an array without `items`)."""


def json_schema_step(model, tokenizer, rounds: int, steps: int = 16):
    """Decode step of `SMALL_FREE_FORM` as the token automaton of its regex
    (`JsonSchema(free_form_depth=1)`, free-form values one level deep) and as a pushdown
    automaton (`free_form_depth=None`, as deep as the stack), vs no processor; rounds
    interleaved, best and median ratios."""
    dfa = fg.processors.JsonSchema(SMALL_FREE_FORM, tokenizer, free_form_depth=1)
    pda = fg.processors.JsonSchema(SMALL_FREE_FORM, tokenizer, free_form_depth=None)
    assert dfa.pushdown is None and pda.pushdown is not None
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give a user with a name and nested tags as JSON."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    bound = weight_read_ms(model)
    rows = []
    for batch in (1, 8):
        runs = {
            "none": step_timer(model, prompt, [], batch, steps),
            "dfa": step_timer(model, prompt, [dfa], batch, steps),
            "pda": step_timer(model, prompt, [pda], batch, steps),
        }
        best, median = interleaved(runs, rounds)
        rows.append(
            [
                batch,
                f"{best['none'] * 1e3:.1f}",
                f"{best['dfa'] * 1e3:.1f}",
                f"{best['pda'] * 1e3:.1f}",
                f"{best['pda'] / best['dfa']:.3f}",
                f"{median['pda'] / median['dfa']:.3f}",
                f"{best['dfa'] / best['none']:.3f}",
                f"{bound:.1f}",
            ]
        )
    print("## 3. Decode step of a small JSON Schema with a free-form value (ms per step)\n")
    table(
        [
            "batch",
            "unconstrained",
            "free_form_depth=1 (DFA)",
            "None (pushdown)",
            "pushdown / DFA (best)",
            "pushdown / DFA (median)",
            "DFA / unconstrained (best)",
            "bandwidth bound",
        ],
        rows,
    )


C_PROMPT = "Write a C function that sums the numbers from 1 to n with a while loop and an if."


def fork_generation(model, tokenizer, rounds: int, steps: int):
    """Section 4: greedy generation of `steps` tokens at batch 1 under llama.cpp's `c.gbnf`
    (a grammar with forks: `ParallelPushdownConstraint`, 4 stacks) with `fork_reach` (only the
    fork tokens that may reach a fork from the row's positions walked over every stack) and
    with `every_fork_token=True` (every fork token walked every step: the mask before
    `fork_reach`, identical masks), and under `json.gbnf` (one stack), each against no
    processor; rounds interleaved, best and median ratios. Also printed: the generated C text,
    the steps that walked fork tokens, and `fork_reach`'s size. Target: c.gbnf / unconstrained
    within 1.25."""
    c_grammar = fg.processors.Grammar.from_gbnf(C_GBNF, tokenizer)
    json_grammar = fg.processors.Grammar.from_gbnf(JSON_GBNF, tokenizer)
    reached = c_grammar.pushdown
    assert isinstance(reached, ParallelPushdownConstraint) and not reached.every_fork_token
    automaton = pushdown_automaton(
        fg.structured.gbnf_to_lark(C_GBNF.read_text()),
        vocabulary_from_tokenizer(tokenizer),
        forks=True,
    )
    every = ParallelPushdownConstraint(
        automaton, reached.constraint_id, reached.num_stacks, every_fork_token=True
    )
    c_every = eqx.tree_at(lambda g: g.tables.pushdown, c_grammar, every)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": C_PROMPT}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    result = fg.generate(
        model,
        tokenizer,
        [[{"role": "user", "content": C_PROMPT}]],
        max_new_tokens=steps,
        processors=[c_grammar],
        sampler=fg.samplers.Greedy(),
    )
    text = result.texts[0]
    bits = np.unpackbits(automaton.fork_reach.view(np.uint8), axis=1, bitorder="little")
    walked, data = 0, b""
    for token in np.asarray(result.token_ids[0][: result.num_tokens[0]]).tolist():
        walked += any(bits[p].any() for p, _ in automaton.walk_all(data))
        data += automaton.token_bytes[token, : automaton.token_length[token]].tobytes()
    num_tokens = int((automaton.fork_tokens < automaton.vocab_size).sum())
    print(
        f"c.gbnf: {num_tokens} fork tokens, {int(bits.any(axis=1).sum())} of "
        f"{automaton.num_positions} positions reach a fork; fork_reach "
        f"{automaton.fork_reach.nbytes:,} bytes; greedy text ({walked} steps walked fork "
        f"tokens):\n\n```c\n{text}\n```\n"
    )
    bound = weight_read_ms(model)
    runs = {
        "none": step_timer(model, prompt, [], 1, steps),
        "json.gbnf": step_timer(model, prompt, [json_grammar], 1, steps),
        "c.gbnf every fork token (before)": step_timer(model, prompt, [c_every], 1, steps),
        "c.gbnf fork_reach": step_timer(model, prompt, [c_grammar], 1, steps),
    }
    best, median = interleaved(runs, rounds)
    rows = [
        [
            k,
            f"{best[k] * 1e3:.1f}",
            f"{best[k] / best['none']:.3f}",
            f"{median[k] / median['none']:.3f}",
            "" if k == "none" else ("yes" if best[k] / best["none"] <= 1.25 else "NO"),
        ]
        for k in runs
    ]
    print(f"## 4. Greedy generation at batch 1, {steps} steps (ms per step; bound {bound:.1f})\n")
    table(["processor", "ms per step (best)", "ratio (best)", "ratio (median)", "<= 1.25"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of the decode-step timing"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each build timing")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument(
        "--json-schema",
        action="store_true",
        help="only section 3: a small schema's decode step, free_form_depth=1 vs None",
    )
    parser.add_argument(
        "--forks",
        action="store_true",
        help="only section 4: greedy generation under c.gbnf (forks) and json.gbnf, batch 1",
    )
    parser.add_argument("--steps", type=int, default=64, help="generated tokens of section 4")
    args = parser.parse_args()
    model, tokenizer = fg.load_model()
    vocabulary = vocabulary_from_tokenizer(tokenizer)
    print(f"# Pushdown automaton benchmark ({jax.devices()[0].platform}, {os.cpu_count()} CPUs)\n")
    if args.json_schema:
        json_schema_step(model, tokenizer, args.rounds)
        return
    if args.forks:
        fork_generation(model, tokenizer, args.rounds, args.steps)
        return
    builds(vocabulary, args.repeat)
    if not args.skip_decode:
        decode_step(model, tokenizer, args.rounds)


if __name__ == "__main__":
    main()
