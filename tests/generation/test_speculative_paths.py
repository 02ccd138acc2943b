"""Speculative decoding's fast paths (issue 41, speed): the vectorised n-gram lookup, the adaptive
per-row guess budget of `PromptLookup`, the verification widths, and the no-processor path.

References: a brute-force Python prompt lookup (the definition: leftmost occurrence of the
longest matching n-gram with a token after it), budgets computed by hand, and plain greedy
`fg.generate` token for token.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.generation.speculative import verify_widths
from functional_gen.generation.token_ids import generate_state
from functional_gen.speculative.cost import (
    VERIFY_COST,
    choose_width,
    expected_tokens,
    model_precision,
    verify_cost,
)
from functional_gen.speculative.proposers import (
    ACCEPTANCE_DECAY,
    EXPLORE_ACCEPTANCE,
    EXPLORE_EVERY,
    EXPLORE_TOKENS,
)
from functional_gen.testing import tiny_config

from ..helpers import speculative_generate, tiny_tokenizer


def _brute_lookup(ids, k, top, latest=False):
    """`(guesses, n)` by the definition, in Python: the first (or, `latest`, the last)
    occurrence of the longest n-gram ending the row that has a token after it."""
    length = len(ids)
    for n in range(top, 0, -1):
        if length - n < 1:
            continue
        tail = list(ids[length - n :])
        starts = range(0, length - n)
        for i in reversed(starts) if latest else starts:
            if list(ids[i : i + n]) == tail:
                cont = list(ids[i + n : i + n + k])
                return cont + [-1] * (k - len(cont)), n
    return [-1] * k, 0


def _propose(spec, rows, lengths, carry=None, active=None):
    width = max(len(r) for r in rows) + 5
    ids = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    active = np.ones(len(rows), bool) if active is None else np.asarray(active)
    return spec.propose(
        carry,
        None,
        jnp.asarray(ids),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(active),
        key=jax.random.split(jax.random.key(0), len(rows)),
        sample=False,
    )


def test_lookup_equals_brute_force():
    """The shifted-compare lookup returns the brute-force guesses, rows of every length (shorter
    than the n-gram too), few symbols (many matches) and many (few matches)."""
    rng = np.random.default_rng(1)
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=3, adaptive=False)
    for symbols in (3, 12):
        rows = [rng.integers(0, symbols, int(rng.integers(1, 25))).tolist() for _ in range(30)]
        carry, guesses, q = _propose(spec, rows, [len(r) for r in rows])
        assert carry is None and q is None
        for row, got in zip(rows, np.asarray(guesses)):
            assert got.tolist() == _brute_lookup(row, 4, 3)[0], row


def test_latest_lookup_equals_brute_force():
    """`match="latest"` (the adaptive default) returns the guesses after the LAST occurrence of
    the longest matching n-gram, by the brute-force definition; by hand: in `1 2 7 1 2 8 1 2`
    the 2-gram `1 2` is followed by `7 1 2 8` first and by `8 1 2` last."""
    rng = np.random.default_rng(2)
    spec = fg.speculative.PromptLookup(
        num_tokens=4, max_ngram_size=3, adaptive=False, match="latest"
    )
    assert spec.latest and fg.speculative.PromptLookup().latest
    assert not fg.speculative.PromptLookup(adaptive=False).latest
    for symbols in (3, 12):
        rows = [rng.integers(0, symbols, int(rng.integers(1, 25))).tolist() for _ in range(30)]
        _, guesses, _ = _propose(spec, rows, [len(r) for r in rows])
        for row, got in zip(rows, np.asarray(guesses)):
            assert got.tolist() == _brute_lookup(row, 4, 3, latest=True)[0], row
    row = [1, 2, 7, 1, 2, 8, 1, 2]
    _, latest, _ = _propose(spec, [row], [8])
    _, first, _ = _propose(dataclasses.replace(spec, match="first"), [row], [8])
    assert np.asarray(latest)[0].tolist() == [8, 1, 2, -1]
    assert np.asarray(first)[0].tolist() == [7, 1, 2, 8]
    with pytest.raises(ValueError, match="match"):
        fg.speculative.PromptLookup(match="best")


def test_cost_model_lookup_guesses_everything_it_finds():
    """With the cost model (the default) the budget does not cut the guesses: a row at budget 0
    still guesses its whole continuation (the cost model decides what is verified); `found`
    counts them, inactive rows find nothing."""
    spec = fg.speculative.PromptLookup(num_tokens=6, max_ngram_size=2)
    row = [1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 1]  # only "1" recurs: a 1-gram match
    carry = dataclasses.replace(spec.init(None, 2, 16), budget=jnp.asarray([0, 0], jnp.int32))
    carry, guesses, _ = _propose(spec, [row, row], [11, 11], carry, [True, False])
    assert np.asarray(guesses).tolist() == [[2, 3, 4, 5, 6, 7], [-1] * 6]
    assert np.asarray(carry.found).tolist() == [6, 0]


def test_budget_cuts_guesses_and_zero_budget_explores_on_full_ngrams():
    """Without the cost model a row guesses at most its budget; at budget 0 only a full
    `max_ngram_size` match guesses, at most `EXPLORE_TOKENS` tokens; inactive rows guess
    nothing."""
    k = 6
    spec = fg.speculative.PromptLookup(num_tokens=k, max_ngram_size=2, cost_model=False)
    full = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # "1 2" recurs: a 2-gram match, 9 tokens after it
    unigram = [1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 1]  # only "1" recurs: a 1-gram match
    rows = [full, full, full, unigram, unigram, full]
    carry = dataclasses.replace(
        spec.init(None, 6, 16), budget=jnp.asarray([6, 2, 0, 0, 5, 6], jnp.int32)
    )
    active = [True, True, True, True, True, False]
    carry, guesses, _ = _propose(spec, rows, [11] * 6, carry, active)
    counts = np.sum(np.asarray(guesses) >= 0, axis=1).tolist()
    assert counts == [6, 2, EXPLORE_TOKENS, 0, 5, 0]
    np.testing.assert_array_equal(np.asarray(guesses)[0], [3, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(np.asarray(carry.start), [11] * 6)
    np.testing.assert_array_equal(np.asarray(carry.ngram), [2, 2, 2, 1, 1, 2])  # match sizes


def test_budget_update_by_hand():
    """After verification: every guess kept -> `num_tokens`; some kept -> that many (0 stops);
    nothing guessed -> the budget stays."""
    k = 4
    spec = fg.speculative.PromptLookup(num_tokens=k, max_ngram_size=2)
    guesses = jnp.asarray(
        [[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, -1, -1], [-1, -1, -1, -1]], jnp.int32
    )
    carry = dataclasses.replace(
        spec.init(None, 5, 8),
        budget=jnp.asarray([4, 4, 4, 2, 1], jnp.int32),
        guesses=guesses,
        start=jnp.full((5,), 2),
        ngram=jnp.asarray([2, 2, 1, 2, 2], jnp.int32),
    )
    # rows after verification (columns 2.. hold what each row emitted)
    token_ids = jnp.asarray(
        [
            [0, 0, 5, 6, 7, 8, 9, 0],  # all 4 kept (+ the target's token)
            [0, 0, 5, 6, 9, 0, 0, 0],  # 2 kept, then a correction
            [0, 0, 9, 0, 0, 0, 0, 0],  # none kept
            [0, 0, 5, 6, 3, 0, 0, 0],  # both guesses (of a budget of 2) kept
            [0, 0, 4, 0, 0, 0, 0, 0],  # guessed nothing
        ],
        jnp.int32,
    )
    length = jnp.asarray([7, 5, 3, 5, 3], jnp.int32)
    updated = spec.update(carry, token_ids, length)
    np.testing.assert_array_equal(np.asarray(updated.budget), [4, 2, 0, 4, 1])
    # the acceptance counts of the match size that guessed: kept guesses, and 1 per rejection
    np.testing.assert_array_equal(
        np.asarray(updated.hits), [[0, 4], [0, 2], [0, 0], [0, 2], [0, 0]]
    )
    np.testing.assert_array_equal(
        np.asarray(updated.misses), [[0, 0], [0, 1], [1, 0], [0, 0], [0, 0]]
    )
    # a Beta(1, 1) prior: (hits + 1) / (hits + misses + 2), at the row's last match size
    np.testing.assert_allclose(
        np.asarray(updated.acceptance()), [5 / 6, 3 / 5, 1 / 3, 3 / 4, 1 / 2], rtol=1e-6
    )
    again = spec.update(updated, token_ids, length)  # the same outcome again: decayed, added
    np.testing.assert_allclose(np.asarray(again.hits)[0], [0, 4 * ACCEPTANCE_DECAY + 4])
    assert spec.update(None, token_ids, length) is None  # not adaptive: no carry


def test_exploration_by_hand():
    """`idle` counts the steps a row found guesses but verified none (reset by a verified
    guess); a row idle for `EXPLORE_EVERY` such steps that finds guesses is due, and the cost
    model plans with at least `EXPLORE_ACCEPTANCE` for it: one due row per step, the longest
    idle (ties: the first), so that a batch explores one row at a time."""
    k = 4
    spec = fg.speculative.PromptLookup(num_tokens=k, max_ngram_size=2)
    e = EXPLORE_EVERY
    carry = dataclasses.replace(
        spec.init(None, 5, 8),
        misses=jnp.asarray([[0, 3]] * 5, jnp.float32),  # a low estimate: 1 / 5
        ngram=jnp.full((5,), 2, jnp.int32),
        found=jnp.asarray([3, 3, 0, 3, 3], jnp.int32),
        idle=jnp.asarray([e, e + 2, e + 5, e - 1, e + 2], jnp.int32),
    )
    np.testing.assert_allclose(np.asarray(carry.estimate()), [0.2] * 5, rtol=1e-6)
    # row 2 found nothing, row 3 is not idle long enough; rows 1 and 4 tie: the first
    assert np.asarray(carry.exploring()).tolist() == [False, True, False, False, False]
    np.testing.assert_allclose(
        np.asarray(carry.acceptance()), [0.2, EXPLORE_ACCEPTANCE, 0.2, 0.2, 0.2], rtol=1e-6
    )
    # after verification: row 0 verified a guess (idle 0), the others verified none (the
    # search left no guesses), those that found some count one more
    verified = jnp.asarray([[5, 6, -1, -1]] + [[-1] * k] * 4, jnp.int32)
    carry = dataclasses.replace(carry, guesses=verified, start=jnp.full((5,), 2))
    token_ids = jnp.zeros((5, 8), jnp.int32).at[0, 2:4].set(jnp.asarray([5, 9]))
    updated = spec.update(carry, token_ids, jnp.asarray([4, 3, 3, 3, 3], jnp.int32))
    assert np.asarray(updated.idle).tolist() == [0, e + 3, e + 5, e, e + 3]
    # an estimate above the optimistic value is kept as it is
    high = dataclasses.replace(carry, hits=jnp.asarray([[0, 30]] * 5, jnp.float32))
    np.testing.assert_allclose(np.asarray(high.acceptance()), np.asarray(high.estimate()))


def test_verify_widths():
    """The verification widths: 0, `EXPLORE_TOKENS`, then 8j - 1 guess slots (a target call of a
    multiple of 8 positions) up to the first that holds `num_tokens`."""
    assert EXPLORE_TOKENS == 3
    assert verify_widths(1) == (0, 3)
    assert verify_widths(3) == (0, 3)
    assert verify_widths(4) == (0, 3, 7)
    assert verify_widths(7) == (0, 3, 7)
    assert verify_widths(10) == (0, 3, 7, 15)
    assert verify_widths(15) == (0, 3, 7, 15)
    assert verify_widths(16) == (0, 3, 7, 15, 23)
    # batches: only what makes batch * positions a multiple of 8
    assert verify_widths(10, batch=8) == (0, 3, 10)
    assert verify_widths(10, batch=4) == (0, 3, 11)
    assert verify_widths(10, batch=2) == (0, 3, 11)
    assert verify_widths(10, batch=3) == (0, 7, 15)
    with pytest.raises(ValueError, match="num_tokens"):
        verify_widths(0)


def test_cost_model_is_lossless_and_verifies_where_it_pays():
    """The default `PromptLookup` (adaptive, cost model on) equals plain greedy at batch 1,
    where a call over 4 positions costs 1.24 decode steps and the prior acceptance (0.5) makes
    3 guesses pay (1.875 expected tokens): it verifies guesses, and learns per match size."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    tok = tiny_tokenizer(101)
    prompts = ["t5 t6 t7 t8 t5 t6 t7 t8 t5 t6"]
    kwargs = dict(max_new_tokens=24, eos_token_id=[])
    spec = fg.speculative.PromptLookup(num_tokens=7, max_ngram_size=2)
    final = generate_state(model, tok, prompts, speculative=spec, **kwargs)
    reference = fg.generate(model, tok, prompts, **kwargs)
    generated = final.generated_token_ids(reference.state.settings.pad_token_id)
    np.testing.assert_array_equal(np.asarray(generated)[:1, :24], np.asarray(reference.token_ids))
    assert int(final.search_state.proposed[0]) > 0
    assert int(final.search_state.accepted[0]) > 0
    carry = final.search_state.proposer
    assert float(np.asarray(carry.hits + carry.misses).sum()) > 0  # it learned from them


def test_ceiling_by_hand():
    """`LookupCarry.ceiling`: the largest estimate of any n-gram size (whatever the last match
    was), at least `EXPLORE_ACCEPTANCE` for a row idle for `EXPLORE_EVERY` steps."""
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2)
    e = EXPLORE_EVERY
    carry = dataclasses.replace(
        spec.init(None, 3, 8),
        hits=jnp.asarray([[2, 0], [0, 0], [0, 0]], jnp.float32),
        misses=jnp.asarray([[1, 3], [3, 1], [3, 3]], jnp.float32),
        ngram=jnp.asarray([2, 1, 1], jnp.int32),  # ignored: every size counts
        idle=jnp.asarray([0, e - 1, e], jnp.int32),
    )
    # (hits + 1) / (hits + misses + 2): row 0 max(3/5, 1/5); row 1 max(1/5, 1/3); row 2 1/5,
    # due to explore
    np.testing.assert_allclose(
        np.asarray(carry.ceiling()), [0.6, 1 / 3, EXPLORE_ACCEPTANCE], rtol=1e-6
    )


def test_skipped_lookup_is_lossless_and_counts_idle_steps(monkeypatch):
    """Where no acceptance could make a verification pay (a cost table at which every width
    costs 100 plain steps), the search skips the lookup: nothing is verified, the output is
    plain greedy's token for token, and every generated step counts as idle for exploration
    (the first step, with nothing to feed, calls no target at all)."""
    widths = tuple((p, 1.0 if p == 1 else 100.0) for p, _ in VERIFY_COST[("float32", 1)])
    monkeypatch.setitem(VERIFY_COST, ("float32", 1), widths)
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    tok = tiny_tokenizer(101)
    prompts = ["t5 t6 t7 t8 t5 t6 t7 t8 t5 t6"]
    kwargs = dict(max_new_tokens=12, eos_token_id=[])
    spec = fg.speculative.PromptLookup(num_tokens=7, max_ngram_size=2)
    final = generate_state(model, tok, prompts, speculative=spec, **kwargs)
    reference = fg.generate(model, tok, prompts, **kwargs)
    generated = final.generated_token_ids(reference.state.settings.pad_token_id)
    np.testing.assert_array_equal(np.asarray(generated)[:1, :12], np.asarray(reference.token_ids))
    assert int(final.search_state.proposed[0]) == 0
    carry = final.search_state.proposer
    assert int(carry.idle[0]) == 12  # the 12 steps that generated (not the settling one)
    assert float(np.asarray(carry.hits + carry.misses).sum()) == 0  # nothing learned


@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("penalty", [None, 1.05])  # (at 1.3 no row repeats itself)
def test_lookup_is_lossless_on_every_width(adaptive, penalty):
    """Greedy prompt lookup with `num_tokens=7` (widths 0, 3 and 7 all in play: rows that repeat
    themselves, and one that does not) equals plain greedy, with and without processors (the
    no-processor path skips the per-position scan)."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    tok = tiny_tokenizer(101)
    prompts = ["t5 t6 t7 t8 t5 t6 t7 t8 t5 t6", "t1 t2 t3", "t9 t9 t9 t10 t11 t9 t9 t9 t10"]
    kwargs = dict(max_new_tokens=24, eos_token_id=[], repetition_penalty=penalty)
    spec = fg.speculative.PromptLookup(
        num_tokens=7, max_ngram_size=2, adaptive=adaptive, cost_model=False
    )
    result, _ = speculative_generate(model, tok, prompts, speculative=spec, **kwargs)
    reference = fg.generate(model, tok, prompts, **kwargs)
    np.testing.assert_array_equal(np.asarray(result.token_ids), np.asarray(reference.token_ids))
    np.testing.assert_allclose(
        np.asarray(result.logprobs), np.asarray(reference.logprobs), atol=2e-4
    )


def test_verify_cost_table_and_interpolation():
    """`verify_cost` returns the measured ratios, interpolates linearly between positions and
    batches, and takes batch 8's ratios beyond 8 rows."""
    table = dict(VERIFY_COST[("float32", 1)])
    assert verify_cost("float32", 1, 4) == table[4]
    assert verify_cost("float32", 1, 6) == pytest.approx((table[4] + table[8]) / 2)
    b8 = dict(VERIFY_COST[("float32", 8)])
    assert verify_cost("float32", 16, 11) == b8[11]
    assert verify_cost("float32", 4, 4) == pytest.approx(table[4] + (b8[4] - table[4]) * 3 / 7)
    assert verify_cost("float32", 1, 1) == 1.0
    with pytest.raises(ValueError, match="positions"):
        verify_cost("float32", 1, 0)


def test_choose_width_by_hand():
    """The width of the most expected tokens per unit of cost, computed by hand: one row that
    keeps 90 % of its guesses and one that guesses nothing (a plain step yields 2 tokens for a
    cost of 1; 3 guesses 1 + 0.9 + 0.81 + 0.729 + 1 = 4.439 tokens for 2.86: 1.55; 10 guesses
    (1 - 0.9**11) / 0.1 + 1 = 7.862 for 6.85: 1.15): no guess. Alone at batch 1 (costs 1.24
    and 1.83): 3.439 / 1.24 = 2.77 < (1 - 0.9**16) / 0.1 / 1.83 = 4.45: the widest."""
    acceptance = jnp.asarray([0.9, 0.0])
    guesses = jnp.asarray([10, 0], jnp.int32)
    active = jnp.asarray([True, True])
    assert int(choose_width((0, 3, 10), (1.0, 2.86, 6.85), acceptance, guesses, active)) == 0
    one = (acceptance[:1], jnp.asarray([15], jnp.int32), active[:1])
    assert int(choose_width((0, 3, 15), (1.0, 1.24, 1.83), *one)) == 2
    # an inactive row yields nothing, and a row that guesses nothing makes every width equal
    idle = (jnp.asarray([0.9]), jnp.asarray([0], jnp.int32), jnp.asarray([True]))
    assert int(choose_width((0, 3), (1.0, 1.24), *idle)) == 0
    np.testing.assert_allclose(
        np.asarray(expected_tokens(jnp.asarray([0.9, 0.5]), jnp.asarray([3, 1]))),
        [3.439, 1.5],
        rtol=1e-6,
    )


def test_model_precision():
    """The cost table's precision, read from the model's dtypes."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
    assert model_precision(model) == "float32"
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model)
    assert model_precision(bf16) == "bfloat16"
    int8 = jax.tree.map(lambda x: x.astype(jnp.int8) if eqx.is_inexact_array(x) else x, model)
    assert model_precision(int8) == "int8"
