"""Decode attention designs A/B: the bare model's jitted loop of decode steps over a cache of
`max_len` slots with `written` slots already written, one process, variants interleaved (compare
ratios; absolute ms move with the machine's load).

    .venv/bin/python benchmarks/bench_decode_attention.py [--batch 8] [--max-len 512 2048]
        [--written 32 100 200 400] [--rounds 5] [--steps 4] [--variants today fine flash128]

SmolLM2-135M-Instruct, float32. The cache is filled with random keys/values (the timing does not
depend on their values); each dispatch runs `--steps` greedy decode steps from `written` and the
cache's length is reset afterwards, so every dispatch reads the same slots. ms per step = the
fastest of `--rounds` dispatches per variant (alternated) / steps.

    .venv/bin/python benchmarks/bench_decode_attention.py --engine [--max-len 512]
        [--dispatches 56] [--variants today fine]

`--engine`: the serving engine's jitted `generate` program (8 busy greedy slots, short story
prompts, EOS disabled, `Engine.num_steps` steps per dispatch, no compaction) compiled once per
variant; dispatches alternate between the variants, each from its own state, so the shared write
index climbs from the prompts' width by `num_steps` per dispatch; ms per step = the fastest
dispatch in each range of written slots.

Variants (each traced with `functional_gen.models.attention` patched, then compiled):

- `today`: the checkout's `attention_lengths` / `_attend_written`.
- `fine`: `attention_lengths` with 64 and 128 before 256 where the cache has branches at all
  (max_len >= 512), so a step with <= 64 / 128 written slots reads that slice.
- `fine2`: `fine` with 192 too.
- `b384`: today's lengths with 384 too in a 512-slot cache (the serving engine's default).
- `flashB`: `attend_blocks` with `B`-slot blocks (flash-decoding style: online softmax over a
  `fori_loop` of `dynamic_slice`d blocks, stopping at the written length, no static branches).
"""

import argparse
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
import functional_gen as fg
from functional_gen.models import attention as attn_mod
from functional_gen.models.kv_cache import KVCache

TODAY_LENGTHS = attn_mod.attention_lengths
TODAY_WRITTEN = attn_mod.Attention._attend_written


def fine_lengths(max_len):
    base = TODAY_LENGTHS(max_len)
    if len(base) == 1:
        return base
    return tuple(n for n in (64, 128) if 2 * n <= max_len) + base


def fine2_lengths(max_len):
    base = TODAY_LENGTHS(max_len)
    if len(base) == 1:
        return base
    return tuple(n for n in (64, 128, 192) if 2 * n <= max_len) + base


def b384_lengths(max_len, batch=1):
    base = TODAY_LENGTHS(max_len, batch)
    return tuple(sorted({*base, 384})) if max_len == 512 and len(base) > 1 else base


def patched(variant):
    """Context: set the module's attention functions for `variant`."""

    class Ctx:
        def __enter__(self):
            attn_mod.attention_lengths = TODAY_LENGTHS
            attn_mod.Attention._attend_written = TODAY_WRITTEN
            if variant == "fine":
                attn_mod.attention_lengths = fine_lengths
            elif variant == "fine2":
                attn_mod.attention_lengths = fine2_lengths
            elif variant == "b384":
                attn_mod.attention_lengths = b384_lengths
            elif variant.startswith("flash"):
                block = int(variant[5:])

                def written(self, q, k, v, kvp, pos, prefix, used):
                    return attend_blocks(self, q, k, v, kvp, pos, prefix, used, block)

                attn_mod.Attention._attend_written = written

        def __exit__(self, *a):
            attn_mod.attention_lengths = TODAY_LENGTHS
            attn_mod.Attention._attend_written = TODAY_WRITTEN

    return Ctx()


def attend_blocks(self, q, k_cache, v_cache, kv_positions, positions, prefix_length, used, block):
    """`Attention._attend` over the slots `[0, used)` in `block`-slot blocks, online softmax
    (causal / prefix-LM masks, sliding window and softcap as `_attend`)."""
    kvh, groups, hd, batch, seq = q.shape
    slots = k_cache.shape[-2]
    q_cols = q.transpose(3, 0, 2, 1, 4).reshape(batch, kvh, hd, groups * seq)
    count = jnp.minimum((used + block - 1) // block, slots // block)
    low = jnp.finfo(jnp.float32).min

    def body(i, carry):
        m, total, acc = carry
        k = jax.lax.dynamic_slice_in_dim(k_cache, i * block, block, axis=2)
        v = jax.lax.dynamic_slice_in_dim(v_cache, i * block, block, axis=2)
        kv_pos = jax.lax.dynamic_slice_in_dim(kv_positions, i * block, block, axis=1)[:, None]
        scores = jnp.matmul(k, q_cols, preferred_element_type=jnp.float32)
        scores = scores.reshape(batch, kvh, block, groups, seq).transpose(0, 1, 3, 4, 2)
        scores = scores * ((self.query_pre_attn_scalar or self.head_dim) ** -0.5)
        if self.softcap is not None:
            scores = self.softcap * jnp.tanh(scores / self.softcap)
        q_pos = positions[:, :, None]
        visible = kv_pos <= q_pos
        if prefix_length is not None:
            visible = visible | ((kv_pos < prefix_length[:, None, None]) & (q_pos >= 0))
        allowed = (kv_pos >= 0) & visible
        if self.sliding_window is not None:
            allowed = allowed & (q_pos - kv_pos < self.sliding_window)
        allowed = allowed[:, None, None]
        scores = jnp.where(allowed, scores, low)
        m_new = jnp.maximum(m, scores.max(-1))
        p = jnp.where(allowed, jnp.exp(scores - m_new[..., None]), 0.0)
        fix = jnp.exp(m - m_new)
        acc = acc * fix[..., None] + jnp.einsum("bkgst,bktd->bkgsd", p.astype(v.dtype), v)
        return m_new, total * fix + p.sum(-1), acc

    m = jnp.full((batch, kvh, groups, seq), low)
    init = (m, jnp.zeros_like(m), jnp.zeros((batch, kvh, groups, seq, hd), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, count, body, init)
    out = (acc / jnp.where(total > 0, total, 1.0)[..., None]).astype(v_cache.dtype)
    return out.transpose(1, 2, 4, 0, 3)


def filled_cache(model, batch, max_len, written, key):
    cache = KVCache.init(model.config, batch, max_len)
    keys = jax.random.split(key, 2 * len(cache.k))
    k = tuple(
        jnp.where(jnp.arange(max_len)[:, None] < written, jax.random.normal(kk, c.shape), 0.0)
        for kk, c in zip(keys[::2], cache.k)
    )
    v = tuple(
        jnp.where(jnp.arange(max_len)[:, None] < written, jax.random.normal(kk, c.shape), 0.0)
        for kk, c in zip(keys[1::2], cache.v)
    )
    slots = jnp.arange(max_len)
    positions = jnp.broadcast_to(jnp.where(slots < written, slots, -1), (batch, max_len))
    return eqx.tree_at(
        lambda c: (c.k, c.v, c.positions, c.length),
        cache,
        (k, v, positions.astype(jnp.int32), jnp.full((batch,), written, jnp.int32)),
    )


def program(model, cache, token, steps, written):
    def run(m, cache, token):
        def body(carry):
            i, cache, token = carry
            logits, cache = m(token, jnp.full(token.shape, written) + i, cache)
            return i + 1, cache, jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)

        return jax.lax.while_loop(lambda c: c[0] < steps, body, (0, cache, token))[1:]

    return eqx.filter_jit(run, donate="all-except-first").lower(model, cache, token).compile()


def engine_ab(model, tokenizer, args):
    from functional_gen.serving import Engine, programs

    words = ["cat", "dog", "fox", "owl", "bee", "ant", "elk", "yak"]
    prompts = [f"Write a long story about a {w} who travels far." for w in words]
    engine = Engine(model, tokenizer, max_slots=8, max_len=args.max_len[0])
    engine.eos_token_id = ()
    n = engine.num_steps
    budget = engine.max_len - engine.prefill_width(max(len(tokenizer.encode(p)) for p in prompts))

    def call():
        return n, jnp.asarray(n, jnp.int32), engine.eos_token_id, engine.pad_token_id

    held, compiled = {}, {}
    for variant in args.variants:
        state = engine.init_decode_state()
        for slot, prompt in enumerate(prompts):
            request = engine.request(tokenizer.encode(prompt), budget)
            state = engine.insert(engine.prefill(request), state, slot)
        with patched(variant):
            compiled[variant] = programs.generate_jit.lower(model, state, *call()).compile()
        held[variant] = state
    write = int(programs.layout_jit(held[args.variants[0]])[0])
    best = {}
    for _ in range(args.dispatches):
        if write + n > engine.max_len:
            break
        band = next(b for b in (64, 128, 256, 512, 1 << 30) if write + n <= b)
        for variant in args.variants:
            start = time.perf_counter()
            held[variant], out = compiled[variant](model, held[variant], *call())
            jax.block_until_ready(out.token_ids)
            took = (time.perf_counter() - start) / n
            best[band, variant] = min(best.get((band, variant), float("inf")), took)
        write += n
    ref = args.variants[0]
    for band in sorted({b for b, _ in best}):
        line = " ".join(
            f"{v}={1e3 * best[band, v]:.1f}ms({best[band, v] / best[band, ref]:.2f}x)"
            for v in args.variants
        )
        print(f"engine max_len {engine.max_len} written <= {band}: {line}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-len", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--written", type=int, nargs="+", default=[32, 100, 200, 400])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=["today", "fine", "flash128"])
    parser.add_argument("--engine", action="store_true", help="the engine's program, see above")
    parser.add_argument("--dispatches", type=int, default=56, help="--engine: per variant")
    args = parser.parse_args()
    model, tokenizer = fg.load_model()
    if args.engine:
        return engine_ab(model, tokenizer, args)
    for max_len in args.max_len:
        for written in args.written:
            if written + args.steps > max_len:
                continue
            held, compiled, best, compile_s = {}, {}, {}, {}
            for variant in args.variants:
                cache = filled_cache(model, args.batch, max_len, written, jax.random.key(0))
                token = jnp.full((args.batch, 1), 42, jnp.int32)
                start = time.perf_counter()
                with patched(variant):
                    compiled[variant] = program(model, cache, token, args.steps, written)
                compile_s[variant] = time.perf_counter() - start
                held[variant] = [cache, token]
                best[variant] = float("inf")
            outs = {}
            for r in range(args.rounds + 1):
                for variant in args.variants:
                    h = held[variant]
                    start = time.perf_counter()
                    cache, token = compiled[variant](model, h[0], h[1])
                    jax.block_until_ready(token)
                    took = time.perf_counter() - start
                    if r == 0:
                        outs[variant] = token
                    else:
                        best[variant] = min(best[variant], took)
                    h[0] = eqx.tree_at(
                        lambda c: (c.length, c.positions),
                        cache,
                        (
                            jnp.full((args.batch,), written, jnp.int32),
                            filled_cache_positions(args.batch, max_len, written),
                        ),
                    )
                    h[1] = jnp.full((args.batch, 1), 42, jnp.int32)
            ref = args.variants[0]
            line = " ".join(
                f"{v}={1e3 * best[v] / args.steps:.1f}ms({best[v] / best[ref]:.2f}x,"
                f"compile {compile_s[v]:.1f}s,{'same' if (outs[v] == outs[ref]).all() else 'DIFF'})"
                for v in args.variants
            )
            print(f"batch {args.batch} max_len {max_len} written {written}: {line}", flush=True)


def filled_cache_positions(batch, max_len, written):
    slots = jnp.arange(max_len)
    return jnp.broadcast_to(jnp.where(slots < written, slots, -1), (batch, max_len)).astype(
        jnp.int32
    )


if __name__ == "__main__":
    main()
