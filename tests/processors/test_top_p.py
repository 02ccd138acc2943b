"""`TopP`'s two ways to the cut (among the 64 largest logits, or by bisection over all of them)
agree with a full sort, and the compiled step searches only inside its fallback loop (parity
with transformers is in `test_transformers_parity.py`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen.processors as P
from functional_gen.processors._common import smallest_reaching
from functional_gen.processors.base import Context
from functional_gen.processors.top_p import CANDIDATES

VOCAB = 2000
# Normal logits times these scales keep ~5, ~170 and ~1570 of 2,000 tokens at top_p=0.9.
PEAKED, MEDIUM, FLAT = 8.0, 3.0, 0.5
# These processors ignore the context; one row's context, for their signature.
CONTEXT = Context(
    jnp.zeros((4,), jnp.int32), jnp.int32(1), jnp.int32(1), jnp.int32(8), jax.random.key(0)
)


@eqx.filter_jit
def by_sorting(processor, logits):
    """transformers' computation: sort ascending, cumulative softmax, cut at `1 - top_p`."""
    ascending = jnp.sort(logits)
    cumulative = jnp.cumsum(jax.nn.softmax(ascending))
    num_removed = jnp.sum(cumulative <= 1 - processor.top_p)
    num_removed = jnp.minimum(num_removed, logits.shape[-1] - processor.min_tokens_to_keep)
    return jnp.where(logits < ascending[num_removed], -jnp.inf, logits)


@eqx.filter_jit
def filtered(processor, logits):
    return processor(logits, CONTEXT)


@eqx.filter_jit
def found_among_candidates(processor, logits):
    return processor._threshold_among_top_k(logits, CANDIDATES)[0]


@eqx.filter_jit
def by_search(processor, logits):
    return jnp.where(logits < processor._threshold_by_search(logits), -jnp.inf, logits)


def logits_of(scale, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(1, VOCAB)) * scale, jnp.float32)


@pytest.mark.parametrize(
    "scale, among_candidates", [(PEAKED, True), (MEDIUM, False), (FLAT, False)]
)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 1.0])
def test_both_ways_equal_sorting(scale, among_candidates, top_p):
    processor = P.TopP(top_p)
    for seed in range(2):
        logits = logits_of(scale, seed)[0]
        if top_p == 0.9:
            assert bool(found_among_candidates(processor, logits)) == among_candidates
        expected = np.asarray(by_sorting(processor, logits))
        np.testing.assert_array_equal(np.asarray(filtered(processor, logits)), expected)
        np.testing.assert_array_equal(np.asarray(by_search(processor, logits)), expected)


def test_a_batch_mixing_both_ways():
    top_p = np.asarray([0.9, 0.9, 0.5, 0.99, 0.9], np.float32)
    scales = [PEAKED, FLAT, MEDIUM, PEAKED, MEDIUM]
    logits = jnp.concatenate([logits_of(s, i) for i, s in enumerate(scales)])
    out = P.apply([P.TopP(top_p)], logits, np.zeros((5, 1), int))
    for i in range(5):
        np.testing.assert_array_equal(
            np.asarray(out[i]), np.asarray(by_sorting(P.TopP(top_p[i]), logits[i]))
        )


@pytest.mark.parametrize("min_keep", [3, CANDIDATES + 5])
def test_min_tokens_to_keep(min_keep):
    out = np.asarray(filtered(P.TopP(0.01, min_tokens_to_keep=min_keep), logits_of(MEDIUM)[0]))
    assert np.isfinite(out).sum() == min_keep


def test_smallest_reaching_is_the_cut_of_a_sorted_cumulative_sum():
    values = jnp.asarray([3.0, -1.0, 0.5, -np.inf, 2.0, 0.5, -7.25])
    weights = jnp.asarray([0.125, 0.25, 0.125, 0.0, 0.25, 0.125, 0.125])
    # ascending, cumulative: -inf 0, -7.25 0.125, -1 0.375, 0.5 (twice) 0.625, 2 0.875, 3 1.0
    cases = [  # target, first value with cumulative > target, ... >= target
        (0.0, -7.25, -np.inf),
        (0.125, -1.0, -7.25),
        (0.5, 0.5, 0.5),
        (0.875, 3.0, 2.0),
        (1.0, np.inf, 3.0),
        (1.5, np.inf, np.inf),
    ]
    for target, strict, inclusive in cases:
        assert (
            float(smallest_reaching(values, weights, jnp.float32(target), inclusive=False))
            == strict
        )
        assert (
            float(smallest_reaching(values, weights, jnp.float32(target), inclusive=True))
            == inclusive
        )


def computations_with(hlo_text, *needles):
    """Names of the HLO computations with an instruction line containing all `needles`."""
    found, current = set(), None
    for line in hlo_text.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            current = "ENTRY" if line.startswith("ENTRY") else line.split()[0]
        elif all(n in line for n in needles):
            found.add(current)
    return found


def test_under_vmap_the_search_stays_inside_its_loop():
    # XLA hoists loop-invariant work out of while loops; were the bisection (the while loop over
    # uint32 float keys) hoisted, it would run at every step even when no row needs it.
    step = jax.vmap(lambda x: P.TopP(0.9)(P.TopK(50)(x, CONTEXT), CONTEXT))
    hlo = jax.jit(step).lower(jnp.zeros((2, 4096))).compile().as_text()
    search = computations_with(hlo, " while(", "u32[")
    assert search and "ENTRY" not in search
    assert "ENTRY" in computations_with(hlo, "custom-call(", f",{CANDIDATES}]")


@pytest.mark.parametrize(
    "processor",
    [
        P.TopK(50),
        P.TopP(0.9),
        P.MinP(0.1, min_tokens_to_keep=5),
        P.EpsilonCutoff(0.01, 3),
        P.TypicalP(0.9, 2),
    ],
)
def test_no_processor_sorts(processor):
    # Indexing the output of lax.top_k (top_k(x, k)[0][-1]) makes XLA on CPU sort everything.
    hlo = (
        jax.jit(jax.vmap(lambda x: processor(x, CONTEXT)))
        .lower(jnp.zeros((2, 4096)))
        .compile()
        .as_text()
    )
    assert not computations_with(hlo, " sort(")
