"""`PagedKVCache`: decode through block tables gives the logits of a contiguous cache.

Reference: the same model's prefill over each row alone (`KVCache`, every position's logits),
which the family tests compare with transformers. The paged calls feed each row's tokens at its
own positions into blocks of 4 scattered over a shared pool (a first call of 3 tokens per row,
then one token per call; rows of different lengths, one row idle), under both
`ExecutionPlan.paged_attention` forms: the gather and jax's Pallas paged-attention kernel (in
Pallas's interpret mode: the kernel the GPU plan runs, on the CPU). Families: Llama (grouped
queries), Gemma 3 (sliding-window layers: the kernel's plan keeps the gather there) and Gemma 2
(attention soft-capping, applied by the kernel).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from functional_gen.models import PagedKVCache
from functional_gen.models.paged_cache import (
    gather_blocks,
    gather_window_blocks,
    pallas_blocking,
    write_blocks,
    written_length,
)

from .test_execution_plan import CPU, GPU_BF16, primitives, tiny

BLOCK = 4
TABLES = np.array([[5, 2, 9, 0], [7, 11, -1, -1], [-1, -1, -1, -1]], np.int32)  # 12 blocks
LENGTHS = (13, 6, 0)  # row 0 crosses 3 blocks into its 4th, row 1 two, row 2 idle
FIRST = 3  # the first paged call feeds 3 tokens per row


@eqx.filter_jit
def _call(model, ids, pos, cache):
    return model(ids, pos, cache)


@eqx.filter_jit
def _prefill(model, ids, pos):
    return model.prefill(ids, pos, max_len=ids.shape[1], logits_to_keep=0)[0]


def paged_logits(model, tokens: np.ndarray, dtype) -> dict[tuple[int, int], np.ndarray]:
    """Per (row, position) the logits after that position, from paged calls."""
    config = model.config
    kvh, hd = config.num_key_value_heads, config.head_dim
    pools = tuple(jnp.zeros((kvh, 12, BLOCK, hd), dtype) for _ in range(config.num_hidden_layers))
    cache = PagedKVCache(pools, pools, jnp.asarray(TABLES), jnp.zeros((3,), jnp.int32))
    got, start = {}, 0
    for seq in [FIRST] + [1] * (max(LENGTHS) - FIRST):
        pos = np.arange(start, start + seq)[None].repeat(3, 0)
        pos = np.where(pos < np.asarray(LENGTHS)[:, None], pos, -1)
        ids = np.where(pos >= 0, np.take_along_axis(tokens, np.maximum(pos, 0), 1), 0)
        logits, cache = _call(model, jnp.asarray(ids), jnp.asarray(pos, jnp.int32), cache)
        for r, c in zip(*np.nonzero(pos >= 0)):
            got[(int(r), int(pos[r, c]))] = np.asarray(logits[r, c], np.float32)
        start += seq
    assert list(np.asarray(cache.length)) == list(LENGTHS)
    return got


@pytest.mark.parametrize("family", ["llama-llama3-rope", "gemma3_text", "gemma2"])
@pytest.mark.parametrize("form", ["gather", "pallas_interpret"])
def test_paged_decode_equals_the_contiguous_cache(family, form):
    model = tiny(family).with_plan(CPU.replace(paged_attention=form))
    tokens = np.random.default_rng(1).integers(3, model.config.vocab_size, (3, max(LENGTHS)))
    got = paged_logits(model, tokens, jnp.float32)
    assert len(got) == sum(LENGTHS)
    for r, n in enumerate(LENGTHS):
        if not n:
            continue
        ids = jnp.asarray(tokens[r : r + 1, :n])
        want = np.asarray(_prefill(model, ids, jnp.arange(n, dtype=jnp.int32)[None])[0])
        for p in range(n):
            np.testing.assert_allclose(got[(r, p)], want[p], atol=2e-4, rtol=2e-4)


def kernel_calls(jaxpr) -> int:
    """Calls of jax's jitted `paged_attention` in a (closed) jaxpr, sub-jaxprs included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == "paged_attention":
            count += 1
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    count += kernel_calls(sub)
    return count


@pytest.mark.parametrize("family", ["llama-llama3-rope", "gemma3_text"])
def test_the_kernel_runs_where_the_plan_asks_and_a_window_keeps_the_gather(family):
    """Under `paged_attention="pallas_interpret"` a decode step's program calls the Pallas
    kernel once per layer without a sliding window (every layer of the tiny Llama; the tiny
    Gemma 3's global ones only), and the gather plan not at all: the equality above is the
    kernel's."""
    model = tiny(family)
    kvh, hd = model.config.num_key_value_heads, model.config.head_dim
    pools = (jnp.zeros((kvh, 12, BLOCK, hd)),) * model.config.num_hidden_layers
    cache = PagedKVCache(pools, pools, jnp.asarray(TABLES), jnp.zeros((3,), jnp.int32))
    ids, pos = jnp.zeros((3, 1), jnp.int32), jnp.zeros((3, 1), jnp.int32)
    counts = {}
    for form in ("gather", "pallas_interpret"):
        m = model.with_plan(CPU.replace(paged_attention=form))
        jaxpr = jax.make_jaxpr(lambda c, m=m: m(ids, pos, c))(cache)
        counts[form] = kernel_calls(jaxpr)
        assert ("pallas_call" in primitives(jaxpr)) == (form != "gather")
    windows = model.config.sliding_window
    kernels = sum(w is None for w in windows)
    assert kernels > 0 and (kernels < len(windows)) == (family == "gemma3_text")
    assert counts == {"gather": 0, "pallas_interpret": kernels}


def test_paged_decode_under_the_gpu_plan_in_bfloat16():
    """The GPU plan's bfloat16 compute with a bfloat16 pool, kernel and gather, against the same
    plan's contiguous prefill: within 2% of its largest logit (the bfloat16 bound that
    test_execution_plan applies; the kernel keeps its softmax weights in float32 where the
    gather's product casts them to bfloat16, so the two differ by rounding)."""
    base = tiny("llama-llama3-rope", "bfloat16", std=0.05)
    tokens = np.random.default_rng(2).integers(3, base.config.vocab_size, (3, max(LENGTHS)))
    want = _prefill(base.with_plan(GPU_BF16), jnp.asarray(tokens[:1]), jnp.arange(13)[None])
    want = np.asarray(want[0])
    scale = np.abs(want).max()
    for form in ("gather", "pallas_interpret"):
        got = paged_logits(
            base.with_plan(GPU_BF16.replace(paged_attention=form)), tokens, jnp.bfloat16
        )
        err = max(np.abs(got[(0, p)] - want[p]).max() for p in range(LENGTHS[0]))
        assert err < 0.02 * scale, (form, err, scale)


def test_write_gather_and_lengths_by_hand():
    """Hand-checked: tokens land at `table[p // 4]`, offset `p % 4`; padding and positions with
    no block are dropped; the gather puts position `c` at column `c`, masked from the length."""
    pool = jnp.zeros((1, 3, BLOCK, 1))
    tables = jnp.asarray([[2, 0], [1, -1]], jnp.int32)
    new = jnp.asarray([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])[:, None, :, None]
    positions = jnp.asarray([[3, 4, -1], [0, 5, 2]], jnp.int32)  # row 1's 5: no block there
    out = np.asarray(write_blocks(pool, new, tables, positions))[0, :, :, 0]
    want = np.zeros((3, BLOCK))
    want[2, 3], want[0, 0], want[1, 0], want[1, 2] = 10, 11, 20, 22
    np.testing.assert_array_equal(out, want)
    length = written_length(jnp.asarray([2, 1], jnp.int32), positions)
    assert list(np.asarray(length)) == [5, 6]
    rows, cols = gather_blocks(jnp.asarray(want)[None, :, :, None], tables, length)
    assert rows.shape == (2, 1, 2 * BLOCK, 1)
    np.testing.assert_array_equal(np.asarray(rows)[0, 0, :, 0], [0, 0, 0, 10, 11, 0, 0, 0])
    assert list(np.asarray(cols[0])) == [0, 1, 2, 3, 4, -1, -1, -1]
    assert list(np.asarray(cols[1])) == [0, 1, 2, 3, 4, 5, -1, -1]


def test_a_window_gathers_only_the_blocks_it_can_reach():
    """Hand-checked, blocks of 4, tables of 6 blocks, window 5, one query per row: a query at
    position 13 sees positions 9-13, in logical blocks 2-3; `span = ceil(4 / 4) + 1 = 2` blocks
    from block `(13 - 4) // 4 = 2`: columns hold positions 8-15, those not yet written (14, 15:
    length 14) at -1. A query at 2 starts at block 0; an idle row (-1) too; a row whose table
    lacks block 1 marks its columns -1."""
    pool = jnp.arange(8 * BLOCK, dtype=jnp.float32).reshape(1, 8, BLOCK, 1)
    tables = jnp.asarray([[5, 4, 3, 2, 1, 0], [6, 7, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1],
                          [1, -1, -1, -1, -1, -1]], jnp.int32)  # fmt: skip
    length = jnp.asarray([14, 3, 0, 2], jnp.int32)
    positions = jnp.asarray([[13], [2], [-1], [1]], jnp.int32)
    rows, cols = gather_window_blocks(pool, tables, length, positions, window=5)
    assert rows.shape == (4, 1, 2 * BLOCK, 1)
    assert list(np.asarray(cols[0])) == [8, 9, 10, 11, 12, 13, -1, -1]
    want = np.concatenate([np.arange(3 * BLOCK, 4 * BLOCK), np.arange(2 * BLOCK, 3 * BLOCK)])
    np.testing.assert_array_equal(np.asarray(rows)[0, 0, :, 0], want)  # blocks 3, then 2
    assert list(np.asarray(cols[1])) == [0, 1, 2, -1, -1, -1, -1, -1]
    assert list(np.asarray(cols[2])) == [-1] * 8
    assert list(np.asarray(cols[3])) == [0, 1, -1, -1, -1, -1, -1, -1]


@pytest.mark.parametrize(
    "blocks, want",
    [(4, (1, 4)), (16, (2, 8)), (128, (16, 8)), (160, (4, 8)), (12, (1, 4)), (7, (1, 1))],
)
def test_pallas_blocking_divides_the_tables(blocks, want):
    assert pallas_blocking(blocks) == want
    splits, per = want
    assert blocks % splits == 0 and (blocks // splits) % per == 0


def test_a_paged_cache_refuses_prefill_chunks_and_prefix_lm():
    model = tiny("llama-llama3-rope")
    kvh, hd = model.config.num_key_value_heads, model.config.head_dim
    pools = (jnp.zeros((kvh, 2, BLOCK, hd)),) * model.config.num_hidden_layers
    cache = PagedKVCache(pools, pools, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1,), jnp.int32))
    ids, pos = jnp.zeros((1, 2), jnp.int32), jnp.arange(2, dtype=jnp.int32)[None]
    with pytest.raises(ValueError, match="decode calls only"):
        model(ids, pos, cache, prefix_length=jnp.asarray([1], jnp.int32))


def test_a_paged_cache_of_mismatched_parts_is_refused_by_name():
    pool, tables, length = jnp.zeros((2, 6, 4, 8)), jnp.zeros((3, 2), jnp.int32), jnp.zeros(3)
    with pytest.raises(ValueError, match="one key and one value pool per layer, got 2 key and 1"):
        PagedKVCache((pool, pool), (pool,), tables, length.astype(jnp.int32))
    # beartype checks one random item of a tuple: the tests' jaxtyping may refuse it first
    with pytest.raises(
        (ValueError, jaxtyping.TypeCheckError),
        match=r"layer 1: key pool \(2, 6, 2, 8\)|Type-check error",
    ):
        PagedKVCache(
            (pool, jnp.zeros((2, 6, 2, 8))), (pool, pool), tables, length.astype(jnp.int32)
        )
    # one length too few: the tests' jaxtyping checks (the `batch` dimension) refuse it before
    # `__check_init__` does (its ValueError is what a user without them gets)
    with pytest.raises((ValueError, jaxtyping.TypeCheckError), match="length"):
        PagedKVCache((pool,), (pool,), tables, jnp.zeros(2, jnp.int32))
