"""Preemption on the paged engine: a pool too small for every request's worst case, served with
worst-case reservations (`Engine(preemption=False)`) and with on-demand blocks and preemption
(`preemption=True`, the default), in one run.

    .venv/bin/python benchmarks/bench_preemption.py [--tiny] [--slots 8] [--requests 16]
        [--prompt 16] [--new 64] [--budget N] [--block-size 16] [--max-len 128] [--num-blocks N]

The trace: `--requests` greedy requests of `--prompt`-token prompts and `--new` new tokens
(`--budget`: the `max_new_tokens` they ask, default `--new`; a request ends after `--new`
tokens, as at a stop string, so a budget larger than `--new` is the chat client that asks for
more than the answer takes), all queued at once, admitted first come first served into free slots through the engine's own
calls (`admit`, `prefill`, `insert`, `make_room`, `generate`, as the orchestrator drives them; a
preempted request goes back to the front of the queue). The pool defaults to three requests'
worst cases (`3 x ceil((prompt + budget) / block_size)` blocks), so worst-case reservation runs
three at a time while on demand runs as many as their current lengths fit. Each engine runs
the trace once to compile (not timed) and once timed; the table gives the wall time, the
dispatches, the mean busy slots per dispatch, the preemptions and the prompt tokens prefilled
again (recomputation; those taken back from the prefix cache are not). The tokens of both
engines must be equal (greedy).

Default model: SmolLM2-135M-Instruct; `--tiny`: a random 2-layer Llama (the scheduling only).

The paged engine runs every dispatch at `--slots` rows, so a dispatch costs about the same
however many slots are busy: the dispatch count is the figure that carries over to other
machines; the wall time adds the recomputation (and, on a shared CPU, noise).

Measured 2026-11-30 on the 2-core CPU while another job ran (load average ~3), SmolLM2-135M,
12 requests of 16 prompt tokens, 8 slots, blocks of 16, `--max-len 96`, one timed run each:

| trace | admission | wall (s) | dispatches | mean busy slots | preemptions | re-prefilled |
|---|---|---|---|---|---|---|
| 48 new tokens, `--budget 80`, `--num-blocks 16` | worst case | 24.16 | 72 | 2.00 | 0 | 0 |
| | on demand | 6.90 | 32 | 4.50 | 4 | 144 |
| 48 new tokens = budget, 12 blocks (3 worst cases) | worst case | 16.10 | 48 | 3.00 | 0 | 0 |
| | on demand | 14.34 | 44 | 3.27 | 4 | 160 |

A request that asks for more tokens than it takes (the first trace, a chat client's
`max_tokens`) is where worst-case reservation wastes the pool; when every request runs to its
budget (the second) the pool is full either way and the gain is small.
"""

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax

import functional_gen as fg


def run(engine, prompts, new, budget):
    """The trace once. **Returns:** `(tokens per request, wall s, dispatches, busy slots summed
    over dispatches, preemptions, prompt tokens prefilled)`."""
    state = engine.init_decode_state()
    paged = engine.paged
    preempted, prefilled = paged.preemptions, paged.prefilled_tokens
    queue = [(i, engine.request(p, budget)) for i, p in enumerate(prompts)]
    got = {i: [] for i in range(len(prompts))}
    running: dict[int, int] = {}
    dispatches = busy = 0
    start = time.perf_counter()
    while queue or running:
        while queue and len(running) < engine.max_slots:
            slot = min(set(range(engine.max_slots)) - set(running))
            i, request = queue[0]
            admission = engine.admit(request, slot)
            if admission is None:
                break
            state = engine.insert(engine.prefill(request, admission, state), state, slot)
            running[slot] = queue.pop(0)[0]
        state, preemptions = engine.make_room(state)
        for p in preemptions:  # newest first: the oldest ends up at the front
            queue.insert(0, (running.pop(p.slot), p.request))
        state, out = engine.generate(state)
        dispatches += 1
        busy += len(running)
        ids, done = jax.device_get((out.token_ids, out.done))
        for slot, i in list(running.items()):
            got[i] += [int(t) for t in ids[:, slot] if t >= 0]
            if done[slot] or len(got[i]) >= new:  # its end, or `new` tokens: a stop string's
                del got[i][new:]
                if not done[slot]:
                    state = engine.free(state, slot)
                del running[slot]
                engine.release(slot)
    wall = time.perf_counter() - start
    paged.allocator.check()
    return (
        [got[i] for i in range(len(prompts))],
        wall,
        dispatches,
        busy,
        paged.preemptions - preempted,
        paged.prefilled_tokens - prefilled,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--budget", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--num-blocks", type=int, default=None)
    args = parser.parse_args()
    if args.tiny:
        from functional_gen.testing import tiny_config

        model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
        tokenizer = None
        vocab = model.vocab_size
    else:
        model, tokenizer = fg.load_model()
        vocab = model.vocab_size
    budget = args.budget or args.new
    blocks = args.num_blocks or 3 * -(-(args.prompt + budget) // args.block_size)
    rng = jax.random.key(1)
    prompts = [
        jax.random.randint(jax.random.fold_in(rng, i), (args.prompt,), 3, vocab - 1).tolist()
        for i in range(args.requests)
    ]
    print(
        f"{args.requests} requests of {args.prompt} + {args.new} tokens (max_new_tokens "
        f"{budget}), {args.slots} slots, {blocks} blocks of {args.block_size}"
    )
    print("| admission | wall (s) | dispatches | mean busy slots | preemptions | re-prefilled |")
    print("|---|---|---|---|---|---|")
    results = {}
    for preemption in (False, True):
        engine = fg.serving.Engine(
            model,
            tokenizer,
            max_slots=args.slots,
            max_len=args.max_len,
            block_size=args.block_size,
            num_blocks=blocks,
            preemption=preemption,
            decode_widths=(),
        )
        run(engine, prompts, args.new, budget)  # compiles
        tokens, wall, dispatches, busy, preempted, prefilled = run(
            engine, prompts, args.new, budget
        )
        results[preemption] = tokens
        name = "on demand, preemption" if preemption else "worst case"
        print(
            f"| {name} | {wall:.2f} | {dispatches} | {busy / dispatches:.2f} | {preempted} | "
            f"{prefilled - args.requests * args.prompt} |"
        )
    assert results[False] == results[True], "the two engines' greedy tokens differ"
    print("tokens equal")


if __name__ == "__main__":
    main()
