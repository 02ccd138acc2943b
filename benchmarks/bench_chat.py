"""A multi-turn chat: time per turn with KV-cache reuse, against re-prefilling the whole history
and against transformers with `past_key_values` reuse, in one run.

    .venv/bin/python benchmarks/bench_chat.py [--turns 6] [--new-tokens 60] [--repeats 4]

SmolLM2-135M-Instruct (the embedded default model), float32, greedy, EOS suppressed (ours:
`MinNewTokens`, transformers: `min_new_tokens`) so that every turn generates exactly
`--new-tokens` tokens and both write the same tokens. Each turn appends a user message with the chat
template's continuation and generates the assistant's answer:

- `reuse`: `fg.generate(model, tokenizer, state + [message])`: only the new turn is prefilled.
- `re-prefill`: the same tokens, but a fresh `SequenceState` each turn: the whole history is
  prefilled again (what a one-shot API does).
- `transformers`: `model.generate(history_ids, past_key_values=cache)` with the `DynamicCache`
  returned by the previous turn, so transformers also prefills only the new tokens.

The whole conversation runs `--repeats` times; the first pass compiles every shape (reported
separately), the table is the median over the later passes. Turn 1 includes the system prompt.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax

import functional_gen as fg

QUESTIONS = [
    "Tell me about the Roman Empire.",
    "Who was its first emperor?",
    "What did he build in Rome?",
    "How did the empire end in the west?",
    "And what happened in the east?",
    "Summarise all of this in two sentences.",
    "What should I read to learn more?",
    "Thank you!",
]


def ours(model, tokenizer, turns, n, reuse):
    # EOS suppressed as transformers' `min_new_tokens` does, so both write the same tokens
    keep = [fg.processors.MinNewTokens(n, model.eos_token_id)]
    state, times = None, []
    for q in QUESTIONS[:turns]:
        message = [{"role": "user", "content": q}]
        t = time.perf_counter()
        if state is None:
            result = fg.generate(
                model, tokenizer, [message], max_new_tokens=n, eos_token_id=(), processors=keep
            )
        else:
            nxt = state + message
            if not reuse:
                nxt = fg.SequenceState.from_token_ids(
                    nxt.row_token_ids(), vocab_size=model.vocab_size, tokenizer=tokenizer
                )
            result = fg.generate(
                model, tokenizer, nxt, max_new_tokens=n, eos_token_id=(), processors=keep
            )
        jax.block_until_ready(result.state.arrays)
        times.append(time.perf_counter() - t)
        state = result.state
    return times, state.row_token_ids()[0]


def transformers_chat(hf, tokenizer, turns, n):
    import torch

    history, cache, times = [], None, []
    ids = None
    for q in QUESTIONS[:turns]:
        history.append({"role": "user", "content": q})
        t = time.perf_counter()
        new = tokenizer.apply_chat_template(
            history[-1:] if ids is not None else history,
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        if ids is not None:
            # the continuation of the template after an assistant turn (as fg's state + message)
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\ue000"}]
                + history[-1:],
                tokenize=False,
                add_generation_prompt=True,
            )
            tail = text[text.index("\ue000") + 1 :]
            new = tokenizer(tail, return_tensors="pt", add_special_tokens=False)["input_ids"]
        ids = new if ids is None else torch.cat([ids, new], dim=1)
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                past_key_values=cache,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.eos_token_id,
            )
        cache = out.past_key_values
        ids = out.sequences
        times.append(time.perf_counter() - t)
        history.append({"role": "assistant", "content": tokenizer.decode(ids[0, -n:])})
    return times, ids[0].tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    model, tokenizer = fg.load_model()
    systems = {
        "reuse": lambda: ours(model, tokenizer, args.turns, args.new_tokens, True),
        "re-prefill": lambda: ours(model, tokenizer, args.turns, args.new_tokens, False),
    }
    if not args.no_transformers:
        import torch
        from transformers import AutoModelForCausalLM

        from functional_gen.loading import default_gguf_path

        torch.set_num_threads(2)
        path = default_gguf_path()
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
        systems["transformers"] = lambda: transformers_chat(
            hf, tokenizer, args.turns, args.new_tokens
        )
    runs = {name: [] for name in systems}
    tokens = {}
    for r in range(args.repeats):
        for name, fn in systems.items():  # alternate, so machine drift hits every system
            times, toks = fn()
            runs[name].append(times)
            tokens[name] = toks
            print(f"pass {r + 1} {name:12s} " + " ".join(f"{t:6.2f}" for t in times), flush=True)
    later = {name: t[1:] if len(t) > 1 else t for name, t in runs.items()}
    median = {
        name: [statistics.median(p[i] for p in passes) for i in range(args.turns)]
        for name, passes in later.items()
    }
    print(
        f"\nseconds per turn ({args.new_tokens} new tokens, greedy, float32), median of passes 2+:"
    )
    header = "| turn | " + " | ".join(systems) + " | reuse vs transformers |"
    print(header)
    print("|" + "---|" * (len(systems) + 2))
    for i in range(args.turns):
        row = [f"{median[name][i]:.2f}" for name in systems]
        ratio = (
            f"{median['transformers'][i] / median['reuse'][i]:.2f}x"
            if "transformers" in median
            else "-"
        )
        print(f"| {i + 1} | " + " | ".join(row) + f" | {ratio} |")
    flat = median["reuse"][-1] / median["reuse"][0]
    per_pass = statistics.median(p[-1] / p[0] for p in later["reuse"])
    print(
        f"\nreuse: turn {args.turns} / turn 1 = {flat:.2f} (medians; target within 1.2), "
        f"median of per-pass ratios {per_pass:.2f}"
    )
    print(
        "first pass (compiles included): "
        + ", ".join(f"{n} {sum(p[0]):.1f} s" for n, p in runs.items())
    )
    if "transformers" in tokens:
        same = tokens["reuse"] == tokens["transformers"]
        print(f"reuse and transformers produced the same tokens: {same}")
    print(
        f"reuse and re-prefill produced the same tokens: {tokens['reuse'] == tokens['re-prefill']}"
    )


if __name__ == "__main__":
    main()
