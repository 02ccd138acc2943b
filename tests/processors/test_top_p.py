"""`TopP`'s stages (the 64, then the 1,024 largest logits, then a full sort) give the same
result, and the compiled step runs the later stages only inside their loops (parity with
transformers is in `test_transformers_parity.py`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen.processors as P
from functional_gen.processors.top_p import CANDIDATES

VOCAB = 2000
# Normal logits times these scales keep ~5, ~170 and ~1570 of 2,000 tokens at top_p=0.9.
PEAKED, MEDIUM, FLAT = 8.0, 3.0, 0.5


@eqx.filter_jit
def by_sorting(processor, logits):
    return jnp.where(logits < processor._threshold_by_sorting(logits), -jnp.inf, logits)


@eqx.filter_jit
def filtered(processor, logits):
    return processor(logits, None)


@eqx.filter_jit
def found_among(processor, logits, k):
    return processor._threshold_among_top_k(logits, k)[0]


def logits_of(scale, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(1, VOCAB)) * scale, jnp.float32)


def stage_that_finds(processor, logits):
    for k in CANDIDATES:
        if bool(found_among(processor, logits, k)):
            return k
    return "sort"


@pytest.mark.parametrize("scale, stage", [(PEAKED, CANDIDATES[0]), (MEDIUM, CANDIDATES[1]), (FLAT, "sort")])
@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_every_stage_equals_sorting(scale, stage, top_p):
    processor = P.TopP(top_p)
    for seed in range(2):
        logits = logits_of(scale, seed)[0]
        if top_p == 0.9:
            assert stage_that_finds(processor, logits) == stage
        np.testing.assert_array_equal(np.asarray(filtered(processor, logits)), np.asarray(by_sorting(processor, logits)))


def test_a_batch_mixing_the_stages():
    top_p = np.asarray([0.9, 0.9, 0.5, 0.99, 0.9], np.float32)
    scales = [PEAKED, FLAT, MEDIUM, PEAKED, MEDIUM]
    logits = jnp.concatenate([logits_of(s, i) for i, s in enumerate(scales)])
    out = P.apply([P.TopP(top_p)], logits, np.zeros((5, 1), int))
    for i in range(5):
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(by_sorting(P.TopP(top_p[i]), logits[i])))


@pytest.mark.parametrize("min_keep", [CANDIDATES[0] + 5, CANDIDATES[1] + 5])
def test_min_tokens_to_keep_beyond_the_candidates(min_keep):
    out = np.asarray(filtered(P.TopP(0.1, min_tokens_to_keep=min_keep), logits_of(PEAKED)[0]))
    assert np.isfinite(out).sum() == min_keep


def computations_with(hlo_text, *needles):
    """Names of the HLO computations with an instruction line containing all `needles`."""
    found, current = set(), None
    for line in hlo_text.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            current = "ENTRY" if line.startswith("ENTRY") else line.split()[0]
        elif all(n in line for n in needles):
            found.add(current)
    return found


def test_under_vmap_later_stages_stay_inside_their_loops():
    # XLA hoists loop-invariant work out of while loops; were the sort (or the 1,024-candidate
    # top_k) hoisted, it would run at every step even when no row needs it.
    step = jax.vmap(lambda x: P.TopP(0.9)(P.TopK(50)(x, None), None))
    hlo = jax.jit(step).lower(jnp.zeros((2, 4096))).compile().as_text()
    for needles in [(" sort(",), ("custom-call(", f",{CANDIDATES[1]}]")]:
        where = computations_with(hlo, *needles)
        assert where and "ENTRY" not in where, needles
    assert "ENTRY" in computations_with(hlo, "custom-call(", f",{CANDIDATES[0]}]")


@pytest.mark.parametrize("processor", [P.TopK(50), P.MinP(0.1, min_tokens_to_keep=5), P.EpsilonCutoff(0.01, 3)])
def test_top_k_thresholds_never_sort(processor):
    # Indexing the output of lax.top_k (top_k(x, k)[0][-1]) makes XLA on CPU sort everything.
    hlo = jax.jit(jax.vmap(lambda x: processor(x, None))).lower(jnp.zeros((2, 4096))).compile().as_text()
    assert not computations_with(hlo, " sort(")
