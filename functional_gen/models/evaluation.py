"""Next-token scores of a model over a text: perplexity and top-1 agreement between two models.

Used to measure what int8 / bfloat16 weights cost in accuracy against the float32 model
(`benchmarks/accuracy_quantization.py`, `tests/models/test_quantization.py`). Perplexity is
`exp` of the mean negative log-likelihood of each actual next token, as in transformers'
perplexity guide (fixed-length model, here with the whole text as context: the text is fed in
chunks that extend one `KVCache`, so every token sees all earlier ones).
"""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from ..reductions import argmax

_NEXT_TOKEN_STATS = eqx.filter_jit(
    lambda model, ids, positions, cache, targets: _stats(model, ids, positions, cache, targets)
)


def _stats(model, ids, positions, cache, targets):
    logits, cache = model(ids, positions, cache)
    logprobs = jax.nn.log_softmax(logits[0], axis=-1)
    chosen = jnp.take_along_axis(logprobs, targets[0][:, None], axis=-1)[:, 0]
    # reductions.argmax: jnp.argmax's index; over [512, 49,152] logits 32 against 206 ms on XLA CPU
    return chosen, argmax(logits[0], axis=-1), cache


def next_token_scores(
    model, token_ids: Sequence[int] | Int[np.ndarray, " seq"], *, chunk: int = 512
) -> tuple[Float[np.ndarray, " n"], Int[np.ndarray, " n"]]:  # n = seq - 1 (a list has no shape)
    """Log-probability of every actual next token, and the model's top-1 prediction.

    **Arguments:**

    - `model`: a causal LM with the `model(token_ids, positions, cache)` interface and
      `init_cache`.
    - `token_ids`: one text's token ids, `seq` of them; `seq - 1` must be a multiple of `chunk`
      (so every call has the same shape and compiles once).
    - `chunk`: tokens per model call.

    **Returns:** `(logprobs, top1)`, both `[seq - 1]`: `logprobs[i]` is the natural-log
    probability the model gives `token_ids[i + 1]` after `token_ids[: i + 1]`, and `top1[i]` its
    most likely token there.

    **Raises:** `ValueError` if `seq - 1` is not a positive multiple of `chunk`.
    """
    ids = np.asarray(token_ids)
    n = len(ids) - 1
    if n <= 0 or n % chunk:
        raise ValueError(f"len(token_ids) - 1 = {n} must be a positive multiple of chunk={chunk}")
    cache = model.init_cache(1, n)
    logprobs, top1 = [], []
    for start in range(0, n, chunk):
        x = jnp.asarray(ids[None, start : start + chunk])
        targets = jnp.asarray(ids[None, start + 1 : start + chunk + 1])
        positions = jnp.arange(start, start + chunk)[None]
        lp, am, cache = _NEXT_TOKEN_STATS(model, x, positions, cache, targets)
        logprobs.append(np.asarray(lp))
        top1.append(np.asarray(am))
    return np.concatenate(logprobs), np.concatenate(top1)


def perplexity(logprobs: Float[np.ndarray, " n"]) -> float:
    """`exp(-mean(logprobs))`: the perplexity of natural-log next-token probabilities."""
    return float(np.exp(-np.mean(np.asarray(logprobs, np.float64))))


def compare_models(reference, candidate, token_ids, *, chunk: int = 512) -> dict[str, float]:
    """Perplexity of two models on one text and how often their top-1 predictions agree.

    **Arguments:** `reference`, `candidate`: causal LMs (see `next_token_scores`); `token_ids`
    and `chunk` as in `next_token_scores`.

    **Returns:** `{"reference_perplexity", "perplexity", "perplexity_ratio", "top1_agreement"}`:
    the two perplexities, candidate / reference, and the fraction of positions where both
    models' most likely next token is the same.
    """
    ref_lp, ref_top = next_token_scores(reference, token_ids, chunk=chunk)
    lp, top = next_token_scores(candidate, token_ids, chunk=chunk)
    ref_ppl, ppl = perplexity(ref_lp), perplexity(lp)
    return {
        "reference_perplexity": ref_ppl,
        "perplexity": ppl,
        "perplexity_ratio": ppl / ref_ppl,
        "top1_agreement": float(np.mean(ref_top == top)),
    }
