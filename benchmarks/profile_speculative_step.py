"""The cost of one speculative step against one plain decode step, in ONE process, interleaved
(the machine is shared: compare the ratios, not the milliseconds).

    .venv/bin/python benchmarks/profile_speculative_step.py [--batch 8] [--steps 16] [--reps 5]
        [--num-tokens 7 15] [--guess 3 7] [--bare 1 4 8] [--only plain guess-3 ...]
        [--ops 20] [--ops-of plain guess-3] [--dump-hlo DIR]

SmolLM2-135M-Instruct, float32 (`--quantization int8`: int8 weights), greedy, the first `--batch` open-ended prompts of
`bench_speculative.py`. Each system runs `--steps` steps of its `Step` inside a jitted
`lax.while_loop` (as `generate` runs them: the state a loop carry), from the same prefilled
state; the median of `--reps` runs, the systems taking turns. Systems:

- `plain`: `Sample(Greedy())`, one decode step;
- `no-guess`: `Speculative` with a proposer that never guesses: every step takes the 0-guess
  branch of the width switch (what an open-ended batch pays when nobody guesses); it should
  cost no more than `plain`;
- `verify-0`: the same 0-guess verification called directly, without the switch (what
  the branch costs by itself; the switch's cost is `no-guess` less this);
- `lookup-k`: `PromptLookup(num_tokens=k, adaptive=False)` on the same prompts (ms per step;
  the tokens per step are printed);
- `adaptive-k` (`--adaptive k`): the default `PromptLookup(num_tokens=k, max_ngram_size=3)`
  with its cost model, as `generate` runs it (on these open prompts it rarely verifies: what
  the lookup costs a step that verifies nothing);
- `guess-k` (`--guess k`): a proposer that guesses `k` tokens every step, so that every step
  verifies at the width holding `k` guesses (`verify_widths`): what a verifying step costs
  against a plain step, whatever is accepted;
- `bare-w` (`--bare w`): a bare jitted model call over `w` positions on the prefilled cache, the
  cache not donated (as `bench_verify_width.py` measures `VERIFY_COST`), timed in the same turns.

`--only NAME ...` keeps those systems (compilation is most of a run); `--ops N` traces one run
of each system (`--ops-of` picks them) with `jax.profiler` and prints, per loop step, the time
by kind of op, the `N` longest ops and the `N` longest ops that are not dots, loops or copies
(the work of the speculative step beside the model call), as `profile_decode_ops.py` does.

Measured 2026-11-26 on a machine loaded by other jobs (load average 8 on 2 cores; ratios only):
before the widths and compaction change, `no-guess` 2.94x a plain step (the verification
branch copied every cache buffer 3 times per step: the loop carry into the switch, the
compaction `lax.cond`'s identity branch in a transposed layout, the write back); after it,
1.90x (one copy into the switch branch and one out, `--dump-hlo`); `verify-0` 2.4x in one run
(unexplained: the same ops as a plain step in the HLO, no cache copies; measure it again on a
quiet machine before trusting it).

After `switch_in_place` replaced the `lax.switch` (2026-11-26, loaded machine, batch 8,
`--num-tokens 10 --steps 12 --reps 3`): `no-guess` 1.01x a plain step (before it, 1.54x in a
run minutes earlier), and the HLO of the width branches holds no copy of a cache buffer (before:
120 per step, one into and one out of the taken branch; the compaction branch still copies,
it is a gather of the whole cache by nature).

Where a verifying step's time goes (2026-11-26, load 5-10 on 2 cores: ratios only, and they
move between runs). Batch 1, `--reps 9`: plain 1.00, `guess-3` 1.77, `guess-7` 2.36 plain steps;
`bare-1` 1.14, `bare-4` 2.03, `bare-8` 2.31 (so `bare-4 / bare-1` 1.78, the same as `guess-3`
against plain: the step adds little beyond its model call, and a bare one-position call, the
unit of `VERIFY_COST`, costs more than the plain step inside the loop: its cache is copied, not
donated). Op tables (`--ops`): inside the width-3 branch the dots took 64 ms and every other
op 3.2 ms, of which 1.3 ms was the argmax over the 4 positions (XLA's value-index pair
reduction, not vectorised: 0.35 ms per 49,152 logits; 2.9 ms at width 7); nothing else over
0.3 ms (no cache copies: the `copy_dynamic-update-slice` fusions copy only the written keys'
transpose). Batch 8, width 3 (32 rows): that argmax took 61 ms of a 148 ms step in the trace (7
ms alone on the same arrays; 3.1 ms for plain's 8 rows). `Speculative` now takes the maximum and
the first index equal to it (`first_argmax`: 2.5 ms for 32 rows, 0.4 ms for 8) and computes only
the chosen tokens' logprobs. The rest of the batch-8 4-position call is the model: the head
(49152x576 over 32 tokens, 28-34 ms against 15-19 ms for 8) and attention's elementwise work
(masks, softmax over `[8, 3, 3, 4, slots]` per layer: about 20 ms against 5), i.e. the dots'
efficiency at 32 tokens (XLA/YNNPACK options: `models/`) rather than speculative bookkeeping.

Before / after `first_argmax` (2026-11-26, load about 10, `--steps 8 --reps 5 --guess 3 --only
plain guess-3`, the old and new checkouts in alternating processes, twice): batch 8, a
width-3 step cost 2.37 and 2.87 plain steps before, 1.86 and 1.56 after; batch 1, 1.67 and
1.54 before, 1.68 and 2.17 after (no change beyond the noise: 1.3 ms of a 45 ms step).
`VERIFY_COST` (bare calls, no argmax in them) is unchanged; measured in units of the plain step
inside the loop as here, its float32 batch-8 4-position entry would be about 1.7, not 2.86, but
on a loaded machine: measure it quiet before the cost model relies on it.

Int8 at batch 1 (2026-11-26 19:03-19:09 UTC, a quiet machine, `--quantization int8 --batch 1
--steps 32 --adaptive 10`, medians of 7-11): plain 5.3-5.9 ms a step; `no-guess` 1.02-1.05x,
`verify-0` 1.04x, `adaptive-10` 1.05-1.06x (tokens per step 1.00: it never verifies). The
traced op tables hold no large op of the speculative step's own: the lookup is ~36 tiny
fusions (0.035 ms of compute a step, traced), the width switch 5 one-trip `while`s; the loss is
their count (a few microseconds each on an 8 ms step). Whole calls lost more than the loop
steps: the first step of every call fed nothing to its target call (the prefill had fed the
prompt; `Speculative` feeds a row's last token one step late), one wasted decode call per
`generate` (int8, budget of 1-2 tokens: 15-20 ms more than plain). Since then the search skips
the lookup where no acceptance could pay (`LookupCarry.ceiling`; int8 at batch 1 never pays
at `VERIFY_COST`) and calls no target when nothing is pending.

Float32 at batch 1, a verifying step over 4 positions (`--guess 3 --ops 40`, 2026-11-26 19:33
UTC, load 8 on 2 cores: guess-3 2.34x plain there, 1.37x quiet): the plain step's dots are
XLA's own (`dot.*` ops: the head 5.4 ms, the layers 0.2-0.9 ms each, traced), the 4-position
call's dots are YNNPACK's (`ynn_fusion.*`: the head 11.0 ms, the layers 0.4-1.2 ms), and every
other op of the verifying step took 1.6 ms a step (the largest, a compare over the logits, 0.22
ms; the concatenations of the logits 0.05 ms each): the verification cost is the dot kernel that
XLA picks for more than one row, not the speculative bookkeeping. A micro-benchmark at the same
load (30 dots of [576 -> 1536] and the [576 -> 49152] head, jitted, medians of 15): M=1 5.0 /
2.9 ms, M=4 16.7 / 19.4 ms with YNNPACK, 35.9 / 156 ms with it off (XLA's own GEMM); YNNPACK's
threads suffer most from a loaded machine, which is why a verification's cost ratio moves with
the load. Making a many-row dot as cheap as a one-row one is `models/`' business (compiler
options, `quantization.matmul_row_blocks`), not the search's.

`--dump-hlo DIR` writes the optimised HLO of each loop (look for `copy` of the cache buffers
inside the `while` body and its `conditional` branches).
"""

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))

import equinox as eqx
import jax
import jax.numpy as jnp
from bench_speculative import OPEN, chat
from profile_decode_ops import category, trace_ops

import functional_gen as fg
from functional_gen.generation.planning import plan_call
from functional_gen.generation.program import start_prepared
from functional_gen.generation.speculative import Speculative
from functional_gen.speculative.proposers import AbstractProposer


class VerifyZero(eqx.Module):
    """A search that runs `Speculative._verify` at width 0 directly (no `lax.switch`)."""

    inner: Speculative

    def __call__(self, step, state):
        spec, rows = self.inner, state.batch_size
        active = ~state.done & ~state.search_state.finished
        settle = ~state.done & state.search_state.finished
        keys = jax.vmap(jax.random.fold_in)(state.key, state.key_step + state.num_generated)
        drafts = jnp.zeros((rows, spec.num_tokens), jnp.int32)
        none = jnp.zeros((rows,), jnp.int32)
        return spec._verify(state, step, drafts, None, none, active, settle, keys, width=0)


class NoGuess(AbstractProposer):
    """Never guesses (every guess `-1`): the speculative step's 0-guess branch."""

    num_tokens: int = eqx.field(static=True, default=7)

    def init(self, target, rows, capacity):
        return None

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        return carry, jnp.full((length.shape[0], self.num_tokens), -1, jnp.int32), None

    def update(self, carry, token_ids, length):
        return carry


class AlwaysGuess(AbstractProposer):
    """Guesses the row's last token `num_tokens` times every step: every step verifies at the
    width that holds `num_tokens` guesses (what a verifying step costs, whatever is accepted)."""

    num_tokens: int = eqx.field(static=True, default=3)

    def init(self, target, rows, capacity):
        return None

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        last = jnp.take_along_axis(token_ids, jnp.maximum(length - 1, 0)[:, None], axis=1)
        return carry, jnp.broadcast_to(last, (length.shape[0], self.num_tokens)), None

    def update(self, carry, token_ids, length):
        return carry


def op_table(run, steps: int, top: int) -> str:
    """Time per compiled op of `run()` (one traced call of `steps` loop steps), per step: the
    kinds (as `profile_decode_ops.py` sorts them) and the `top` longest ops."""
    total, count = trace_ops(run, steps)
    kinds = collections.Counter()
    for name, ms in total.items():
        kinds[category(name)] += ms
    lines = [f"  {kind:<26} {ms:9.2f}" for kind, ms in kinds.most_common()]
    lines += [
        f"  {ms:9.3f}  {count[name] / steps:6.1f}  {name}" for name, ms in total.most_common(top)
    ]
    others = [(name, ms) for name, ms in total.most_common() if category(name) == "other fusions"]
    others = [(name, ms) for name, ms in others if not name.startswith("dot.")]  # one-token dots
    lines.append(f"  the {top} longest other ops (not dots, loops or copies):")
    lines += [f"  {ms:9.3f}  {count[name] / steps:6.1f}  {name}" for name, ms in others[:top]]
    return "\n".join(lines)


@eqx.filter_jit
def bare_call(model, token_ids, positions, cache):
    """One model call (the cache not donated, as `bench_verify_width.py` calls it)."""
    return model(token_ids, positions, cache)


@eqx.filter_jit(donate="all-except-first")  # the state; `n` is static
def run_steps(step, state, n):
    """`n` steps of `step` from `state`, in a `while_loop` (rows finishing early just stop)."""

    def body(carry):
        i, s = carry
        return i + 1, step(s)

    return jax.lax.while_loop(lambda c: (c[0] < n) & ~jnp.all(c[1].done), body, (0, state))[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[7])
    parser.add_argument("--dump-hlo", type=Path, default=None)
    parser.add_argument(
        "--quantization",
        default=None,
        choices=[None, "int8"],
        help="load the model with this weight quantization (int8: VERIFY_COST's int8 rows)",
    )
    parser.add_argument(
        "--adaptive",
        type=int,
        nargs="*",
        default=[],
        help="add `adaptive-K` systems: the default PromptLookup(num_tokens=K, "
        "max_ngram_size=3) with its cost model (on open prompts: the no-guess overhead)",
    )
    parser.add_argument(
        "--guess",
        type=int,
        nargs="*",
        default=[],
        help="add `guess-K` systems: K guesses every step (every step verifies K guesses)",
    )
    parser.add_argument(
        "--bare",
        type=int,
        nargs="*",
        default=[],
        help="also time bare model calls over W positions on the prefilled cache (as "
        "bench_verify_width.py does; `bare-1` is the unit of VERIFY_COST)",
    )
    parser.add_argument("--only", nargs="*", default=None, help="time only these systems")
    parser.add_argument("--ops-of", nargs="*", default=None, help="the systems --ops traces")
    parser.add_argument(
        "--ops", type=int, default=0, help="print each system's N longest ops (jax.profiler)"
    )
    args = parser.parse_args(argv)
    load = {"quantization": args.quantization} if args.quantization else {}
    model, tokenizer = fg.load_model(**load)
    prompts = [chat(p) for p in (OPEN * 4)[: args.batch]]
    no_guess = NoGuess(num_tokens=max(args.num_tokens))
    systems = {"plain": None, "no-guess": no_guess, "verify-0": no_guess}
    for k in args.num_tokens:
        systems[f"lookup-{k}"] = fg.speculative.PromptLookup(num_tokens=k, adaptive=False)
    for k in args.adaptive:
        systems[f"adaptive-{k}"] = fg.speculative.PromptLookup(num_tokens=k, max_ngram_size=3)
    for k in args.guess:
        systems[f"guess-{k}"] = AlwaysGuess(num_tokens=k)
    if args.only:
        systems = {name: spec for name, spec in systems.items() if name in args.only}
    starts = {}
    for name, spec in systems.items():
        _, _, prepared = plan_call(
            model, tokenizer, prompts, max_new_tokens=256, speculative=spec, eos_token_id=[]
        )
        step = prepared.step
        if name == "verify-0":
            step = eqx.tree_at(lambda s: s.search, step, VerifyZero(step.search))
        starts[name] = (step, prepared)
    n = args.steps  # static

    def fresh(name):
        step, prepared = starts[name]
        return step, start_prepared(prepared)[1]

    for name in systems:  # compile
        step, state = fresh(name)
        jax.block_until_ready(run_steps(step, state, n))
        if args.dump_hlo is not None:
            args.dump_hlo.mkdir(parents=True, exist_ok=True)
            step, state = fresh(name)
            text = run_steps.lower(step, state, n).compile().compiled.as_text()
            (args.dump_hlo / f"{name}.hlo.txt").write_text(text)
    bare = {}
    if args.bare:
        cache, length = fresh("plain")[1].cache, fresh("plain")[1].length
        for w in args.bare:
            ids = jnp.ones((args.batch, w), jnp.int32)
            pos = length[:, None] - 1 + jnp.arange(w)[None, :]
            bare[f"bare-{w}"] = (ids, pos)
            jax.block_until_ready(bare_call(model, ids, pos, cache))
    times = {name: [] for name in [*systems, *bare]}
    per_step = {}
    for _ in range(args.reps):
        for name, (ids, pos) in bare.items():
            t = time.perf_counter()
            for _ in range(n):
                jax.block_until_ready(bare_call(model, ids, pos, cache))
            times[name].append(time.perf_counter() - t)
            per_step[name] = (n, 1.0)
        for name in systems:
            step, state = fresh(name)
            jax.block_until_ready(state)
            t = time.perf_counter()
            final = jax.block_until_ready(run_steps(step, state, n))
            times[name].append(time.perf_counter() - t)
            spec = final.search_state
            steps = int(spec.steps.max()) if spec is not None else args.steps
            tokens = float(final.num_generated.mean())
            per_step[name] = (steps, tokens / max(steps, 1))
    base = statistics.median(times["plain"]) / args.steps
    precision = args.quantization or "float32"
    print(f"{precision}, batch {args.batch}, {args.steps} steps, median of {args.reps}")
    print("| system | ms/step | x plain step | tokens/step/row | tokens/s x plain |")
    print("|---|---|---|---|---|")
    for name in [*systems, *bare]:
        steps, tps = per_step[name]
        ms = statistics.median(times[name]) / max(steps, 1)
        rate = tps / ms / (1 / base)
        print(f"| {name} | {ms * 1e3:.1f} | {ms / base:.2f} | {tps:.2f} | {rate:.2f} |")
    if args.ops:
        for name in args.ops_of or systems:
            step, state = fresh(name)
            jax.block_until_ready(state)
            table = op_table(
                lambda s=step, t=state: jax.block_until_ready(run_steps(s, t, n)), n, args.ops
            )
            print(
                f"\n{name}: ms per loop step by kind, then the {args.ops} longest ops "
                f"(ms per step, calls per step)\n{table}"
            )
        for name, (ids, pos) in bare.items():

            def calls(ids=ids, pos=pos):
                for _ in range(n):
                    jax.block_until_ready(bare_call(model, ids, pos, cache))

            print(
                f"\n{name}: ms per call by kind, then the longest ops\n{op_table(calls, n, args.ops)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
