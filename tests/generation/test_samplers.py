"""`Multinomial`'s draw (`functional_gen.reductions.categorical`, inverse transform sampling over
blocks) against independent references: the exact categorical distribution computed by NumPy
in float64 (and transformers' `TemperatureLogitsWarper` / `TopPLogitsWarper` in PyTorch for a
processed row), checked by a chi-square goodness-of-fit test and a total-variation bound over
fixed-seed draws, and zero-probability entries (`-inf` logits) never drawn.

Statistical thresholds: each chi-square test asserts p-value > 1e-4 (the draws use fixed keys,
so a test either always passes or always fails; a correct sampler fails one such test with
probability 1e-4 over the choice of seed, a wrong block or entry choice of a few percent
makes the p-value ~0). The total-variation bound is 4x the expected total variation of an
exact sampler's empirical distribution at that number of draws (sum over entries of
sqrt(p (1 - p) / draws) * sqrt(2 / pi) / 2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

import functional_gen as fg
import functional_gen.processors as P
from functional_gen.reductions import (
    BLOCK,
    _first_above,
    categorical,
    categorical_without_replacement,
)

DRAWS = 20_000
P_VALUE = 1e-4


def _draw(logits, draws=DRAWS, seed=0):
    """`draws` tokens from one row of `logits` with the sampler as `generate` calls it (jitted,
    vmapped over one key per row)."""
    keys = jax.random.split(jax.random.key(seed), draws)
    one = jax.vmap(lambda k, lg: fg.samplers.Multinomial()(lg, key=k), in_axes=(0, None))
    return np.asarray(jax.jit(one)(keys, jnp.asarray(logits)))


def _probabilities(logits):
    """softmax in float64 (NumPy): the exact distribution; 0 where the logit is -inf."""
    x = np.asarray(logits, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def _check_fit(drawn, probs, bins=None):
    """Chi-square goodness of fit of the draws' counts (optionally grouped by `bins`, an array
    mapping each entry to a bin) against `probs`, total variation within 4x its expectation,
    and no draw of a zero-probability entry."""
    assert probs[drawn].min() > 0, "a zero-probability entry was drawn"
    counts = np.bincount(drawn, minlength=len(probs)).astype(np.float64)
    if bins is not None:
        counts = np.bincount(bins, weights=counts)
        probs = np.bincount(bins, weights=probs)
    keep = probs > 0
    counts, probs = counts[keep], probs[keep]
    n = counts.sum()
    assert probs.min() * n >= 5, "bins too thin for a chi-square test"
    p_value = scipy.stats.chisquare(counts, probs * n).pvalue
    assert p_value > P_VALUE, f"chi-square p-value {p_value:.2e}"
    tv = 0.5 * np.abs(counts / n - probs).sum()
    expected_tv = 0.5 * np.sqrt(2 / np.pi) * np.sqrt(probs * (1 - probs) / n).sum()
    assert tv < 4 * expected_tv, f"total variation {tv:.4f} (expected ~{expected_tv:.4f})"


def test_small_vocab_exact_distribution():
    logits = np.asarray([0.3, -1.0, 2.0, -np.inf, 0.0, 1.2, -0.5, -np.inf, 1.9, -2.5], np.float32)
    drawn = _draw(logits)
    _check_fit(drawn, _probabilities(logits))


def test_a_wrong_distribution_fails_the_fit():
    """The check itself can fail: draws from slightly other logits (one entry 5% more likely)."""
    logits = np.asarray([0.3, -1.0, 2.0, 0.0, 1.2, -0.5, 1.9, -2.5], np.float32)
    other = logits.copy()
    other[2] += np.log(1.05)
    with pytest.raises(AssertionError, match="chi-square"):
        _check_fit(_draw(other, draws=80_000), _probabilities(logits))


def test_blocks_with_a_padded_tail():
    """Mass in a few entries of several blocks, the last block short (vocab not a multiple of
    `BLOCK`): the hierarchical draw picks blocks and entries in proportion."""
    n = 5 * BLOCK + 37
    logits = np.full(n, -np.inf, np.float32)
    where = [0, BLOCK - 1, BLOCK, 2 * BLOCK + 500, 4 * BLOCK + 3, 5 * BLOCK, n - 1]
    logits[where] = [1.0, 0.5, -0.3, 2.0, 0.0, 1.5, 0.7]
    _check_fit(_draw(logits), _probabilities(logits))


def test_gemma_vocab_with_mass_spread_over_blocks():
    """262,144 entries: 30 likely tokens in scattered blocks (the last included) on a background
    holding ~half the mass over every entry; draws tallied per likely token and per 16 groups of
    16 blocks of the background, against NumPy's float64 probabilities."""
    n = 262_144
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(n).astype(np.float32) - 2.0
    likely = np.concatenate([rng.choice(n - BLOCK, 29, replace=False), [n - 2]])
    logits[likely] = rng.uniform(7.0, 9.0, len(likely)).astype(np.float32)
    probs = _probabilities(logits)
    assert 0.3 < probs[likely].sum() < 0.7
    bins = np.arange(n) // (16 * BLOCK)  # 16 background bins
    bins[likely] = 16 + np.arange(len(likely))  # one bin per likely token
    _check_fit(_draw(logits), probs, bins)


def test_minus_inf_entries_are_never_drawn():
    n = 3 * BLOCK + 5
    cases = {}
    one = np.full(n, -np.inf, np.float32)
    one[2 * BLOCK + 7] = -3.0  # all mass in one entry
    cases["one entry"] = one
    last = np.full(n, -np.inf, np.float32)
    last[[n - 2, n - 1]] = [0.0, -1.0]  # mass only in the (short) last block
    cases["last block"] = last
    tiny = np.full(n, -np.inf, np.float32)
    tiny[[3, BLOCK + 1, n - 1]] = [0.0, -87.0, -102.0]  # exp: 1, ~1.6e-38, ~5e-45 (subnormal)
    cases["tiny"] = tiny
    first = np.full(n, -np.inf, np.float32)
    first[0] = 5.0  # everything after the drawn entry is -inf: the rounding edge's fallback
    cases["first entry"] = first
    for name, logits in cases.items():
        drawn = np.unique(_draw(logits, draws=4000, seed=1))
        assert np.isfinite(logits[drawn]).all(), name
    assert _draw(one, draws=50).tolist() == [2 * BLOCK + 7] * 50
    assert _draw(first, draws=50).tolist() == [0] * 50


def test_rounding_edge_never_picks_a_zero_term():
    """The threshold at or above the total (a uniform number rounded up to 1): the last entry
    whose term is nonzero, never a trailing zero; strictly greater otherwise (hand-computed)."""
    running = jnp.asarray([0.0, 0.25, 0.25, 1.0, 1.0, 1.0])  # terms 0, .25, 0, .75, 0, 0
    for threshold, want in [(0.0, 1), (0.2, 1), (0.25, 3), (0.99, 3), (1.0, 3), (1.5, 3)]:
        assert int(_first_above(running, jnp.asarray(threshold))) == want, threshold
    assert int(_first_above(jnp.zeros(4), jnp.asarray(0.0))) == 0  # nothing nonzero


def test_special_rows_dtypes_and_errors():
    key = jax.random.key(0)
    assert int(categorical(key, jnp.full((3000,), -jnp.inf))) == 0  # as jax.random.categorical
    inf = jnp.zeros((3000,)).at[jnp.asarray([1234, 2000])].set(jnp.inf)
    assert int(categorical(key, inf)) in (1234, 2000)
    drawn = categorical(key, jnp.zeros((3000,), jnp.bfloat16).at[5].set(100.0))
    assert drawn.dtype == jnp.int32 and int(drawn) == 5
    # ValueError, or jaxtyping's TypeCheckError (a TypeError) where the test suite's import hook
    # checks the annotations first
    with pytest.raises((ValueError, TypeError), match=r"\(2, 3\)|f32\[2,3\]"):
        categorical(key, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="shape \\(0,\\)"):
        categorical(key, jnp.zeros((0,)))
    with pytest.raises((ValueError, TypeError), match=r"int32|i32\[3\]"):
        categorical(key, jnp.zeros((3,), jnp.int32))


def test_a_rows_draw_depends_only_on_its_key_and_logits():
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.standard_normal((6, 49_152)), jnp.float32)
    keys = jax.random.split(jax.random.key(9), 6)
    together = jax.jit(jax.vmap(categorical))(keys, logits)
    alone = [int(jax.jit(categorical)(keys[i], logits[i])) for i in range(6)]
    assert together.tolist() == alone
    other = logits.at[1:].set(logits[::-1][:-1])  # other batch mates, row 0 unchanged
    assert int(jax.jit(jax.vmap(categorical))(keys, other)[0]) == alone[0]


def test_temperature_and_top_p_pipeline_keeps_transformers_distribution():
    """Processed by our `Temperature(0.8)` and `TopP(0.9)`, then drawn: the distribution that
    transformers' warpers and `softmax` give in PyTorch (float64), and nothing outside its
    nucleus."""
    vocab = 3000
    raw = np.random.default_rng(2).standard_normal(vocab).astype(np.float32) * 3
    scores = torch.from_numpy(raw.astype(np.float64))[None]
    for warper in (TemperatureLogitsWarper(0.8), TopPLogitsWarper(0.9)):
        scores = warper(None, scores)
    want = torch.softmax(scores, -1)[0].numpy()
    processed = P.apply(
        [P.Temperature(0.8), P.TopP(0.9)], jnp.asarray(raw)[None], np.zeros((1, 1), int)
    )
    np.testing.assert_array_equal(np.isinf(np.asarray(processed[0])), want == 0)
    drawn = _draw(processed[0])
    kept = np.flatnonzero(want)
    assert 10 < len(kept) < vocab // 2
    bins = np.zeros(
        vocab, np.int64
    )  # the 15 likeliest tokens alone, the rest of the nucleus together
    order = kept[np.argsort(-want[kept])]
    bins[order[:15]] = 1 + np.arange(15)
    _check_fit(drawn, want, bins)


def test_draws_without_replacement_follow_successive_sampling():
    """Ordered pairs drawn without replacement: P(i, then j) = p_i p_j / (1 - p_i), enumerated
    (the distribution of the Gumbel-top-k trick and of `torch.multinomial(p, 2)`)."""
    logits = np.asarray([1.0, -np.inf, 0.2, 1.5, -0.7, 0.0], np.float32)
    p = _probabilities(logits)
    n = len(p)
    pairs = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and p[i] < 1:
                pairs[i, j] = p[i] * p[j] / (1 - p[i])
    keys = jax.random.split(jax.random.key(4), DRAWS)
    draw = jax.jit(jax.vmap(lambda k: categorical_without_replacement(k, jnp.asarray(logits), 2)))
    drawn = np.asarray(draw(keys))
    assert (drawn[:, 0] != drawn[:, 1]).all()
    _check_fit(drawn[:, 0] * n + drawn[:, 1], pairs.reshape(-1))


def test_draws_without_replacement_over_blocks_and_running_out():
    n = 4 * BLOCK + 9
    logits = np.full(n, -np.inf, np.float32)
    finite = [2, BLOCK + 3, BLOCK + 4, 3 * BLOCK, n - 1]
    logits[finite] = [0.0, 1.0, -1.0, 2.0, 0.5]
    keys = jax.random.split(jax.random.key(6), 200)
    draw = jax.jit(jax.vmap(lambda k: categorical_without_replacement(k, jnp.asarray(logits), 7)))
    drawn = np.asarray(draw(keys))
    assert (np.sort(drawn[:, :5], axis=1) == finite).all()  # every finite entry once, in 5 draws
    assert (drawn[:, 5:] == -1).all()  # then nothing left
    first = np.bincount(np.searchsorted(finite, drawn[:, 0]), minlength=5) / 200
    assert abs(first[3] - _probabilities(logits)[3 * BLOCK]) < 0.1  # the likeliest first, ~0.58
    with pytest.raises(ValueError, match="k=0"):
        categorical_without_replacement(jax.random.key(0), jnp.zeros(5), 0)
