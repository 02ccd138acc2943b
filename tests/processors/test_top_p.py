"""`TopP`'s two paths (the `CANDIDATES` largest logits, or a full sort) give the same result,
and the compiled step sorts only inside the fallback loop (parity with transformers is in
`test_transformers_parity.py`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen.processors as P
from functional_gen.processors.top_p import CANDIDATES

VOCAB = 2000


@eqx.filter_jit
def by_sorting(processor, logits):
    return jnp.where(logits < processor._threshold_by_sorting(logits), -jnp.inf, logits)


@eqx.filter_jit
def filtered(processor, logits):
    return processor(logits, None)


@eqx.filter_jit
def found_among_candidates(processor, logits):
    return processor._threshold_among_top_k(logits, CANDIDATES)[0]


def logits_of(scale, seed=0, batch=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, VOCAB)) * scale, jnp.float32)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_peaked_distributions_are_cut_among_the_candidates(top_p):
    processor = P.TopP(top_p)
    for seed in range(3):
        logits = logits_of(8.0, seed)[0]
        assert bool(found_among_candidates(processor, logits))
        np.testing.assert_array_equal(np.asarray(filtered(processor, logits)), np.asarray(by_sorting(processor, logits)))


def test_flat_distributions_fall_back_to_sorting():
    processor = P.TopP(0.9)
    logits = logits_of(0.5)[0]
    assert not bool(found_among_candidates(processor, logits))
    out = np.asarray(filtered(processor, logits))
    np.testing.assert_array_equal(out, np.asarray(by_sorting(processor, logits)))
    assert np.isfinite(out).sum() > CANDIDATES


def test_a_batch_mixing_both_paths():
    processor = P.TopP(np.asarray([0.9, 0.9, 0.5, 0.99], np.float32))
    logits = jnp.concatenate([logits_of(8.0, 1), logits_of(0.5, 2), logits_of(0.5, 3), logits_of(8.0, 4)])
    out = P.apply([processor], logits, np.zeros((4, 1), int))
    for i, top_p in enumerate([0.9, 0.9, 0.5, 0.99]):
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(by_sorting(P.TopP(top_p), logits[i])))


def test_min_tokens_to_keep_beyond_the_candidates():
    processor = P.TopP(0.1, min_tokens_to_keep=CANDIDATES + 10)
    logits = logits_of(8.0)[0]
    out = np.asarray(filtered(processor, logits))
    assert np.isfinite(out).sum() == CANDIDATES + 10


def computations_with(hlo_text, op):
    """Names of the HLO computations containing an instruction `op(`."""
    found, current = set(), None
    for line in hlo_text.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            current = "ENTRY" if line.startswith("ENTRY") else line.split()[0]
        elif f" {op}(" in line:
            found.add(current)
    return found


def test_under_vmap_the_sort_stays_inside_the_fallback_loop():
    # XLA hoists loop-invariant work out of while loops; were the sort hoisted, it would run at
    # every step (10 ms for 49,152 logits) even when no row needs it.
    step = jax.vmap(lambda x: P.TopK(50)(P.TopP(0.9)(x, None), None))
    hlo = jax.jit(step).lower(jnp.zeros((2, 4096))).compile().as_text()
    with_sort = computations_with(hlo, "sort")
    assert with_sort and "ENTRY" not in with_sort


@pytest.mark.parametrize("processor", [P.TopK(50), P.MinP(0.1, min_tokens_to_keep=5), P.EpsilonCutoff(0.01, 3)])
def test_top_k_thresholds_never_sort(processor):
    # Indexing the output of lax.top_k (top_k(x, k)[0][-1]) makes XLA on CPU sort everything.
    hlo = jax.jit(jax.vmap(lambda x: processor(x, None))).lower(jnp.zeros((2, 4096))).compile().as_text()
    assert not computations_with(hlo, "sort")
