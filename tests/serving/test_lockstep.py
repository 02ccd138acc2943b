"""The engine's lockstep slot cache (one shared write index, prompts right-aligned at it, the
cache compacted when the index runs out or a shorter attention length becomes possible), on a
tiny random Gemma 3 text model whose sliding window (8 tokens, a ring of 40 slots) the requests
cross: every slot's tokens equal `fg.generate` of that prompt alone, however the slots were
interleaved and compacted."""

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import DecoderForCausalLM, config_from_hf

from ..helpers import tiny_tokenizer

transformers = pytest.importorskip("transformers")

VOCAB = 101


@pytest.fixture(scope="module")
def tiny_gemma():
    """`(model, tokenizer)`: Gemma 3 text, 3 layers (2 sliding of window 8, 1 global), random
    weights."""
    hf_config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=100, pad_token_id=0,
        sliding_window=8, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    model = DecoderForCausalLM(config_from_hf(hf_config), key=jax.random.key(0))
    return model, tiny_tokenizer(VOCAB)


def alone(model, tokenizer, ids, n):
    """Greedy tokens (an EOS included) and raw logprobs of `fg.generate` on the prompt `ids`
    alone."""
    state = fg.SequenceState.from_token_ids([ids], vocab_size=VOCAB, tokenizer=tokenizer)
    out = fg.generate(model, tokenizer, state, max_new_tokens=n, logprobs_mode="raw")
    k = int(out.state.arrays.length[0]) - len(ids)
    return [int(t) for t in out.token_ids[0, :k]], np.asarray(out.logprobs[0, :k])


def serve(engine, schedule):
    """Run `schedule` (a list of `(dispatch, slot, request)`: insert `request` into `slot`
    before dispatch number `dispatch`) until every request is done; per request its tokens and
    logprobs."""
    state = engine.init_decode_state()
    got = {i: ([], []) for i in range(len(schedule))}
    running: dict[int, int] = {}  # slot -> request index
    dispatch = 0
    while dispatch <= max(d for d, _, _ in schedule) or running:
        for i, (d, slot, request) in enumerate(schedule):
            if d == dispatch:
                assert slot not in running
                state = engine.insert(engine.prefill(request), state, slot)
                running[slot] = i
        state, out = engine.generate(state)
        for slot, i in list(running.items()):
            for t, lp in zip(out.token_ids[:, slot].tolist(), out.logprobs[:, slot].tolist()):
                if t >= 0:
                    got[i][0].append(t)
                    got[i][1].append(lp)
            if bool(out.done[slot]):
                del running[slot]
        dispatch += 1
    return [got[i] for i in range(len(schedule))]


def prompt(length, seed):
    return np.random.default_rng(seed).integers(2, VOCAB - 1, length).tolist()


def test_interleaved_slots_cross_the_ring_and_compact(tiny_gemma):
    """Three slots of a 96-slot cache, requests arriving at different dispatches (one into a
    slot freed by another) with 60-70 new tokens each: the shared write index runs out several
    times (compactions), the rings wrap, and each request's tokens equal `fg.generate` alone."""
    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=3, max_len=96)
    specs = [(0, 0, 5, 70), (2, 2, 11, 70), (5, 1, 20, 60), (19, 0, 9, 70), (24, 1, 7, 70),
             (26, 2, 30, 50)]  # fmt: skip
    schedule = [(d, s, engine.request(prompt(n, i), m)) for i, (d, s, n, m) in enumerate(specs)]
    results = serve(engine, schedule)
    assert engine.compactions >= 2
    for (_, _, request), (tokens, logprobs) in zip(schedule, results):
        want, want_lps = alone(model, tokenizer, list(request.token_ids), request.max_new_tokens)
        assert tokens == want
        np.testing.assert_allclose(logprobs, want_lps, atol=1e-5)


def test_a_bfloat16_cache_serves_what_generate_gives_with_one(tiny_gemma):
    """`Engine(..., kv_cache_dtype="bfloat16")`: the slots' cache is bfloat16 and each request's
    tokens and logprobs are those of `fg.generate` alone with the same cache dtype (the rings
    crossed: 40 new tokens past an 8-token window)."""
    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=2, max_len=64, kv_cache_dtype="bfloat16", decode_widths=()
    )
    assert engine.model.kv_cache_dtype == "bfloat16" and model.kv_cache_dtype == "float32"
    state = engine.init_decode_state()
    assert {x.dtype.name for x in state.generation.cache.k} == {"bfloat16"}
    schedule = [(0, 0, engine.request(prompt(6, 3), 40)), (1, 1, engine.request(prompt(9, 4), 40))]
    half = model.with_kv_cache_dtype("bfloat16")
    for (_, _, request), (tokens, logprobs) in zip(schedule, serve(engine, schedule)):
        want, want_lps = alone(half, tokenizer, list(request.token_ids), request.max_new_tokens)
        assert tokens == want
        # 1e-4, not the float32 tests' 1e-5: two programs that round a key differently in float32
        # can store bfloat16 values one bfloat16 step apart (seen: 4.1e-5 at a logprob of -4.2,
        # the suite's -O0 compile of both programs, tests/fast_compile.py)
        np.testing.assert_allclose(logprobs, want_lps, atol=1e-4)


def test_compaction_shortens_attention(tiny_gemma):
    """With a 1,024-slot cache (attention reads 256, 512 or 1,024 slots), a long request that
    ends while a later one runs leaves hundreds of dead leading slots: `generate` compacts them
    away so that attention reads 256 slots again, and the later request's tokens are those it
    gets alone."""
    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=2, max_len=1024, num_steps=8)
    first = engine.request(prompt(16, 0), 300)
    later = engine.request(prompt(12, 1), 120)
    results = serve(engine, [(0, 0, first), (30, 1, later)])
    assert engine.compactions == 1
    want, _ = alone(model, tokenizer, list(later.token_ids), 120)
    assert results[1][0] == want
    want, _ = alone(model, tokenizer, list(first.token_ids), 300)
    assert results[0][0] == want


@pytest.mark.parametrize(("write", "dead"), [(96, 1), (96, 40), (70, 5), (33, 32)])
def test_compact_moves_live_slots(tiny_gemma, write, dead):
    """`compact` moves every full layer's slots `[dead, write)` to the front (numpy's slice of
    the same buffers), keeps the ring layers as they are, and shifts positions and the write
    index by `dead`; blocks of 32 slots (96 = 3 x 32), a shift of 1 overlapping its own block."""
    import dataclasses

    import equinox as eqx
    import jax.numpy as jnp

    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=3, max_len=96)
    state = engine.init_decode_state()
    cache = state.generation.cache
    keys = jax.random.split(jax.random.key(1), 2 * len(cache.k))
    k = tuple(jax.random.normal(keys[i], x.shape, x.dtype) for i, x in enumerate(cache.k))
    v = tuple(jax.random.normal(keys[-1 - i], x.shape, x.dtype) for i, x in enumerate(cache.v))
    positions = np.full(cache.positions.shape, -1, np.int32)
    for row, start in enumerate([dead, min(dead + 7, write - 1), min(dead + 2, write - 1)]):
        positions[row, start:write] = np.arange(write - start)
    cache = dataclasses.replace(
        cache,
        k=k,
        v=v,
        positions=jnp.asarray(positions),
        length=jnp.full_like(cache.length, write),
    )
    gen = dataclasses.replace(state.generation, cache=cache, done=jnp.zeros((3,), bool))
    want_k, want_v = [np.asarray(x) for x in k], [np.asarray(x) for x in v]
    out = engine.compact(eqx.tree_at(lambda s: s.generation, state, gen)).generation.cache
    live = write - dead
    assert out.ring_layers
    for i in range(len(k)):
        for got, want in ((out.k[i], want_k[i]), (out.v[i], want_v[i])):
            if i in out.ring_layers:
                np.testing.assert_array_equal(np.asarray(got), want)
            else:
                np.testing.assert_array_equal(np.asarray(got)[:, :, :live], want[:, :, dead:write])
    want_positions = np.full_like(positions, -1)
    want_positions[:, :live] = positions[:, dead:write]
    np.testing.assert_array_equal(np.asarray(out.positions), want_positions)
    np.testing.assert_array_equal(np.asarray(out.length), write - dead)


@pytest.mark.parametrize("budget", [0, -3, True])
def test_prefill_budget_must_be_positive(tiny_gemma, budget):
    """`Orchestrator(prefill_budget=...)` refuses what is not a positive integer, naming it."""
    from functional_gen.serving.orchestrator import Orchestrator

    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=2, max_len=96)
    with pytest.raises(
        ValueError, match=f"`prefill_budget` must be a positive integer, got {budget!r}"
    ):
        Orchestrator(engine, prefill_budget=budget)
    assert Orchestrator(engine).prefill_budget == engine.prefill_chunk


@pytest.mark.parametrize("until_finish", [False, True])
def test_dispatch_until_a_slot_finishes(tiny_gemma, until_finish):
    """`generate(until_finish=True)` (the orchestrator's dispatch while requests wait) ends after
    the step in which a busy slot finishes: a request of 2 new tokens beside one of 9, 4 steps
    per dispatch, stops the first dispatch after 2 steps (the rest `-1` for every slot) instead
    of decoding the long one for 4; the slot freed before the dispatch (idle from the start)
    does not count, and either way each request's tokens are those it gets alone."""
    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=3, max_len=96, num_steps=4)
    short, long = engine.request(prompt(6, 3), 2), engine.request(prompt(9, 4), 9)
    state = engine.init_decode_state()
    state = engine.insert(engine.prefill(short), state, 0)
    state = engine.insert(engine.prefill(long), state, 1)
    state = engine.insert(engine.prefill(engine.request(prompt(5, 5), 9)), state, 2)
    state = engine.free(state, 2)  # finished before the dispatch: not a slot that frees in it
    got: dict[int, list[int]] = {0: [], 1: []}
    steps = []
    while not bool(np.asarray(state.generation.done).all()):
        state, out = engine.generate(state, until_finish=until_finish)
        taken = np.asarray(out.token_ids)
        steps.append(int((taken >= 0).any(axis=1).sum()))
        assert (taken[:, 2] == -1).all()
        for slot in got:
            got[slot] += [int(t) for t in taken[:, slot] if t >= 0]
    assert steps == ([2, 4, 3] if until_finish else [4, 4, 1])
    for slot, request in ((0, short), (1, long)):
        want, _ = alone(model, tokenizer, list(request.token_ids), request.max_new_tokens)
        assert got[slot] == want


@pytest.mark.parametrize("widths", [None, (1,)])
def test_narrow_dispatches_match_alone(tiny_gemma, monkeypatch, widths):
    """`decode_widths`: a dispatch whose busy slots fit a narrower width runs them gathered into
    a state of that width (padded with idle slots) and written back. Four slots, requests that
    start alone, overlap, cross the rings and compact: each request's tokens and logprobs equal
    `fg.generate` of its prompt alone, narrow dispatches did run,
    and an idle slot reads `-1` / done in a narrow dispatch's output. Default widths for 4
    slots: 1 and 2; `(1,)`: only 1."""
    from functional_gen.serving import engine as engine_module

    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=4, max_len=96, decode_widths=widths)
    assert engine.decode_widths == ((1, 2, 4) if widths is None else (1, 4))
    seen = []
    narrow = engine_module.narrow_jit

    def spy(state, rows):
        seen.append(np.asarray(rows).tolist())
        return narrow(state, rows)

    monkeypatch.setattr(engine_module, "narrow_jit", spy)
    specs = [(0, 3, 5, 30), (9, 1, 11, 70), (11, 0, 8, 20), (12, 2, 6, 12), (30, 2, 9, 60)]
    schedule = [
        (d, s, engine.request(prompt(n, 10 + i), m)) for i, (d, s, n, m) in enumerate(specs)
    ]
    results = serve(engine, schedule)
    assert engine.compactions >= 1
    widths_seen = {len(rows) for rows in seen}
    assert widths_seen == ({1, 2} if widths is None else {1})
    assert all(len(set(rows)) == len(rows) for rows in seen)  # distinct slots
    assert [3] in seen  # the first request alone, in its slot
    for (_, _, request), (tokens, logprobs) in zip(schedule, results):
        want, want_lps = alone(model, tokenizer, list(request.token_ids), request.max_new_tokens)
        assert tokens == want
        np.testing.assert_allclose(logprobs, want_lps, atol=1e-5)

    state = engine.insert(
        engine.prefill(engine.request(prompt(7, 3), 3)), engine.init_decode_state(), 2
    )
    state, out = engine.generate(state)
    assert np.asarray(out.token_ids).shape == (engine.num_steps, 4)
    assert (np.asarray(out.token_ids)[:, [0, 1, 3]] == -1).all()
    np.testing.assert_array_equal(np.asarray(out.done), [True, True, True, True])
    lengths = np.asarray(state.generation.cache.length)
    assert (lengths == lengths[0]).all()  # the shared write index moved for every slot


def test_a_wide_narrow_dispatch_is_written_back_in_a_loop(tiny_gemma):
    """A narrower width above `programs.WIDEN_UNROLL` (16 of 24 slots) writes its rows back in a
    `fori_loop` instead of unrolled writes: requests in scattered slots (the width padded with
    idle ones) get `fg.generate`'s tokens alone."""
    from functional_gen.serving.programs import WIDEN_UNROLL

    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(model, tokenizer, max_slots=24, max_len=48, decode_widths=(16,))
    assert WIDEN_UNROLL < 16
    schedule = [
        (0, 21, engine.request(prompt(5, 40), 12)),
        (1, 3, engine.request(prompt(9, 41), 9)),
    ]
    for (_, _, request), (tokens, _) in zip(schedule, serve(engine, schedule)):
        want, _ = alone(model, tokenizer, list(request.token_ids), request.max_new_tokens)
        assert tokens == want


@pytest.mark.parametrize("widths", [(0,), (5,), (True,)])
def test_decode_widths_are_checked(tiny_gemma, widths):
    """`decode_widths` entries must be integers in `[1, max_slots]`: the bad one is named."""
    model, tokenizer = tiny_gemma
    with pytest.raises(ValueError, match=rf"\[1, max_slots=4\], got {widths[0]!r}"):
        fg.serving.Engine(model, tokenizer, max_slots=4, max_len=96, decode_widths=widths)
    assert fg.serving.Engine(model, tokenizer, max_slots=3, max_len=96).decode_widths == (3,)
    assert fg.serving.Engine(model, tokenizer, max_slots=4, decode_widths=()).decode_widths == (4,)
    assert fg.serving.Engine(model, tokenizer, max_slots=8).decode_widths == (1, 2, 4, 8)
