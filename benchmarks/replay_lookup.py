"""Prompt lookup replayed offline: how many guesses each lookup rule and verification policy
would get accepted along plain greedy outputs, without timing anything.

    .venv/bin/python benchmarks/replay_lookup.py [--precision float32] [--batches 1 8]
        [--outputs PATH] [--limit N]

1. Plain greedy outputs (128 new tokens, EOS ends a row) of `bench_speculative.py`'s grounded
   and open prompts are generated once with `fg.generate` and kept in `--outputs` (default: the
   temporary directory; the precision is in the name).
2. Every guess verified (transformers' way): for each lookup rule, the tokens per verifying
   step, the acceptance (kept / verified guesses) and the share of steps that verify.
3. Policies (rows in lockstep, `--batches`): which guesses a step verifies, from
   `PromptLookup`'s rules re-implemented in numpy — the old per-row budget, the cost model
   alone (`cost.choose_width` over `verify_widths`, the per-n-gram-size Beta estimate),
   exploration (`EXPLORE_EVERY`, `EXPLORE_ACCEPTANCE`) — and the speed-up they would give if a
   step cost only its model call (`verify_cost`'s table; plain decoding: 1 per step). The
   speculative step's own overhead is not modelled, so measured speed-ups are lower
   (`bench_speculative.py`).

Lookup rules: `first` / `latest` occurrence of the longest n-gram from `N` down to `nmin`;
`longest` (the longest suffix match of any size up to 32, latest); `prompt` (matches in the
prompt only); `oracle` (of all matches, the one whose continuation is accepted longest).
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_speculative import GROUNDED, OPEN, chat

import functional_gen as fg
from functional_gen.generation.speculative import verify_widths
from functional_gen.speculative.cost import verify_cost
from functional_gen.speculative.proposers import (
    ACCEPTANCE_DECAY,
    ACCEPTANCE_PRIOR,
    EXPLORE_ACCEPTANCE,
    EXPLORE_EVERY,
    EXPLORE_TOKENS,
)

K = 10
RULES = {
    "first, n 3..1 (transformers)": dict(pick="first", N=3, nmin=1),
    "latest, n 3..1": dict(pick="latest", N=3, nmin=1),
    "first, n 3..2": dict(pick="first", N=3, nmin=2),
    "latest, n 3..2": dict(pick="latest", N=3, nmin=2),
    "latest, n 4..1": dict(pick="latest", N=4, nmin=1),
    "latest, n 5..1": dict(pick="latest", N=5, nmin=1),
    "longest (up to 32), latest": dict(pick="longest", N=32, nmin=1),
    "first, prompt only": dict(pick="first", N=3, nmin=1, prompt_only=True),
    "oracle": dict(pick="oracle", N=32, nmin=1),
}
POLICIES = {
    "budget + cost model (before)": dict(rule="first, n 3..1 (transformers)", budget=True),
    "cost model, first": dict(rule="first, n 3..1 (transformers)"),
    "cost model, latest": dict(rule="latest, n 3..1"),
    "cost model, latest, explore (now)": dict(rule="latest, n 3..1", explore=True),
}


def outputs(precision: str, path: Path) -> dict[str, list[np.ndarray]]:
    """Per task, each row's prompt followed by its plain greedy output (up to its EOS)."""
    if not path.exists():
        load = {"quantization": "int8"} if precision == "int8" else {}
        model, tokenizer = fg.load_model(**load)
        rows = {}
        for task, prompts in (("grounded", GROUNDED), ("open", OPEN)):
            for i in range(0, len(prompts), 8):
                group = prompts[i : i + 8]
                result = fg.generate(model, tokenizer, [chat(p) for p in group], max_new_tokens=128)
                for j, p in enumerate(group):
                    ids = tokenizer.apply_chat_template(chat(p), add_generation_prompt=True)
                    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                    gen = np.asarray(result.token_ids[j])
                    ends = np.flatnonzero(np.isin(gen, np.asarray(tokenizer.eos_token_id)))
                    gen = gen[: ends[0] + 1] if result.finish_reasons[j] == "eos" else gen
                    rows[f"{task}/{i + j}/prompt"] = np.asarray(ids, np.int32)
                    rows[f"{task}/{i + j}/output"] = gen.astype(np.int32)
        np.savez(path, **rows)
    data = np.load(path)
    tasks: dict[str, list] = {"grounded": [], "open": []}
    for key in sorted(data.files, key=lambda k: (k.split("/")[0], int(k.split("/")[1]))):
        task, _, part = key.split("/")
        if part == "prompt":
            tasks[task].append((data[key], data[key.replace("prompt", "output")]))
    return tasks


def suffix_matches(ids: np.ndarray, length: int, cap: int) -> np.ndarray:
    """`m[i]`: how many tokens ending at `i` equal the last ones of `ids[:length]` (up to
    `cap`), for `i < length - 1` (a continuation starts at `i + 1`)."""
    m = np.zeros(length - 1, np.int32)
    alive = np.ones(length - 1, bool)
    for t in range(cap):
        at = np.arange(length - 1) - t
        alive &= at >= 0
        alive[alive] = ids[at[alive]] == ids[length - 1 - t]
        m += alive
        if not alive.any():
            break
    return m


def kept(guesses, truth, length) -> int:
    """Guesses that equal the true continuation, up to the first that does not."""
    n = 0
    while n < len(guesses) and length + n < len(truth) and truth[length + n] == guesses[n]:
        n += 1
    return n


def lookup(rule: dict, truth: np.ndarray, length: int, prompt_length: int):
    """`(guesses, n)`: up to `K` guesses and the size of the match that made them (0: none)."""
    if length < 2:
        return [], 0
    m = suffix_matches(truth, length, rule["N"])
    if rule.get("prompt_only"):
        m = np.where(np.arange(1, length) < prompt_length, m, 0)

    def after(i):
        return list(truth[i + 1 : min(i + 1 + K, length)])

    if rule["pick"] == "oracle":
        candidates = np.flatnonzero(m >= rule["nmin"])
        best = max(candidates, key=lambda i: kept(after(i), truth, length), default=None)
        return ([], 0) if best is None else (after(best), int(m[best]))
    if rule["pick"] == "longest":
        n = int(m.max(initial=0))
        return ([], 0) if n < rule["nmin"] else (after(np.flatnonzero(m == n)[-1]), n)
    for n in range(rule["N"], rule["nmin"] - 1, -1):
        at = np.flatnonzero(m >= n)
        if len(at):
            return after(at[0] if rule["pick"] == "first" else at[-1]), n
    return [], 0


def verify_all(rows, rule: dict) -> str:
    """Every guess verified: tokens per verifying step, acceptance, share of verifying steps."""
    steps = verifying = verified_tokens = accepted = guessed = 0
    for prompt, output in rows:
        truth = np.concatenate([prompt, output])
        length = len(prompt)
        while length < len(truth):
            guesses, _ = lookup(rule, truth, length, len(prompt))
            n = kept(guesses, truth, length)
            emitted = min(n + 1, len(truth) - length)
            steps += 1
            if guesses:
                verifying += 1
                verified_tokens += emitted
                accepted += n
                guessed += len(guesses)
            length += emitted
    return (
        f"{verified_tokens / max(verifying, 1):.2f} | {accepted / max(guessed, 1):.2f} | "
        f"{verifying / steps:.2f}"
    )


def replay_policy(rows, policy: dict, batch: int, precision: str) -> str:
    """Rows in lockstep, `batch` at a time: the verified widths chosen by the cost model;
    tokens per row-step and the speed-up over plain decoding at the modelled costs."""
    rule = RULES[policy["rule"]]
    widths = verify_widths(K, batch)
    costs = [verify_cost(precision, batch, w + 1) for w in widths]
    cost = plain = 0.0
    for g in range(0, len(rows), batch):
        group = rows[g : g + batch]
        truth = [np.concatenate(r) for r in group]
        prompt_lengths = [len(p) for p, _ in group]
        length = list(prompt_lengths)
        budget = [K] * len(group)
        hits = np.zeros((len(group), 32))
        misses = np.zeros((len(group), 32))
        idle = [0] * len(group)
        plain += max(len(o) for _, o in group)
        while any(length[r] < len(truth[r]) for r in range(len(group))):
            live = [r for r in range(len(group)) if length[r] < len(truth[r])]
            guesses, sizes, plan = {}, {}, {}
            for r in live:
                g_r, n = lookup(rule, truth[r], length[r], prompt_lengths[r])
                if policy.get("budget"):
                    explore = EXPLORE_TOKENS if n >= rule["N"] else 0
                    g_r = g_r[: budget[r] if budget[r] > 0 else explore]
                guesses[r], sizes[r] = g_r, max(n, 1) - 1
                prior_hits, prior_misses = ACCEPTANCE_PRIOR
                h, m = hits[r, sizes[r]], misses[r, sizes[r]]
                plan[r] = (h + prior_hits) / (h + m + prior_hits + prior_misses)
            due = [
                r for r in live if policy.get("explore") and guesses[r] and idle[r] >= EXPLORE_EVERY
            ]
            if due:  # one row at a time, the longest idle
                pick = max(due, key=lambda r: (idle[r], -r))
                plan[pick] = max(plan[pick], EXPLORE_ACCEPTANCE)
            rates = []
            for w, c in zip(widths, costs):
                a = {r: min(plan[r], 0.999) for r in live}
                tokens = sum((1 - a[r] ** (min(len(guesses[r]), w) + 1)) / (1 - a[r]) for r in live)
                rates.append(tokens / c)
            width = widths[int(np.argmax(np.asarray(rates) >= max(rates) * (1 - 1e-6)))]
            widest = max(min(len(guesses[r]), width) for r in live)
            cost += costs[next(i for i, w in enumerate(widths) if w >= widest)]
            for r in live:
                verified = guesses[r][:width]
                n = kept(verified, truth[r], length[r])
                if verified:
                    budget[r] = K if n >= len(verified) else n
                    hits[r, sizes[r]] = ACCEPTANCE_DECAY * hits[r, sizes[r]] + n
                    misses[r, sizes[r]] = ACCEPTANCE_DECAY * misses[r, sizes[r]] + (
                        n < len(verified)
                    )
                    idle[r] = 0
                elif guesses[r]:
                    idle[r] += 1
                length[r] += min(n + 1, len(truth[r]) - length[r])
    return f"{plain / cost:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="float32", choices=["float32", "int8"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--outputs", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="the first N rows per task")
    args = parser.parse_args(argv)
    path = args.outputs or Path(tempfile.gettempdir()) / f"replay_lookup_{args.precision}.npz"
    tasks = outputs(args.precision, path)
    if args.limit is not None:
        tasks = {task: rows[: args.limit] for task, rows in tasks.items()}
    print(f"# {args.precision}, num_tokens={K}, every guess verified")
    print("| task | rule | tokens / verifying step | acceptance | verifying steps |")
    print("|---|---|---|---|---|")
    for task, rows in tasks.items():
        for name, rule in RULES.items():
            print(f"| {task} | {name} | {verify_all(rows, rule)} |", flush=True)
    print(f"\n# {args.precision}, policies: speed-up over plain at the modelled costs")
    print("| task | batch | policy | x plain |")
    print("|---|---|---|---|")
    for batch in args.batches:
        for task, rows in tasks.items():
            for name, policy in POLICIES.items():
                speedup = replay_policy(rows, policy, batch, args.precision)
                print(f"| {task} | {batch} | {name} | {speedup} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
