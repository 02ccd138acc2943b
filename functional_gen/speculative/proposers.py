"""Proposers: who guesses the next `num_tokens` tokens of every row for the target to verify.

Equinox's abstract/final pattern: `AbstractProposer` declares, `PromptLookup`, `DraftModel` and
`EarlyExit` implement. A proposer is pure: `init` returns its carry (a draft model's `KVCache`;
it lives in `GenerationState.search_state`), `propose` returns the guesses (and the
distributions they were drawn from), and `update` brings the carry in line with the tokens the
rows actually kept. Nothing is copied back on the host.
"""

import abc
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Key, PyTree

from ..models.base import AbstractCausalLM
from ..models.kv_cache import KVCache
from ..reductions import categorical
from .cache import keep_below, make_room, switch_in_place
from .guard import GuardState, ProposalGuard


class AbstractProposer(eqx.Module):
    """Base class of proposers (`functional_gen.speculative`).

    Subclasses implement `num_tokens` (a field: the guesses per step, `k`) and the methods
    below; every method is pure and works on the whole batch.
    """

    num_tokens: eqx.AbstractVar[int]

    @abc.abstractmethod
    def init(self, target: AbstractCausalLM | None, rows: int, capacity: int) -> PyTree:
        """The proposer's carry before the first step, for `rows` rows whose `token_ids` have
        `capacity` columns (`None` when it needs none)."""

    @abc.abstractmethod
    def propose(
        self,
        carry: PyTree,
        target: AbstractCausalLM | None,
        token_ids: Int[Array, "batch max_len"],
        length: Int[Array, " batch"],
        active: Bool[Array, " batch"],
        *,
        key: Key[Array, " batch"],
        sample: bool,
        guard: ProposalGuard | None = None,
        guard_state: GuardState | None = None,
    ) -> tuple[PyTree, Int[Array, "batch k"], Float[Array, "batch k vocab"] | None]:
        """Guess the `k` tokens after each row's `length` tokens.

        **Arguments:** `carry` (from `init` or the last `update`), `target` (the model being
        decoded), the rows' `token_ids` and `length`, `active` (rows that still generate; the
        others' guesses are ignored), `key` (one PRNG key per row), `sample` (static: draw the guesses
        from the proposer's distribution instead of taking its most likely tokens).

        **Returns:** `(carry, guesses, q)`: `guesses` may end in `-1`s (fewer guesses in that
        row; a `-1` ends the row's guesses); `q` is the proposer's probabilities at each guessed
        position, `None` when the guesses are deterministic (one-hot `q`).

        `guard` and `guard_state` (`functional_gen.speculative.guard`; `None` without a
        constraint; every proposer takes them, the search always passes them): the rows'
        constraints at their current position. A proposer that draws from
        a distribution masks it with `guard.mask` before every guess (and `q` is the masked,
        renormalised distribution); others may ignore it: the search cuts every row's guesses at
        the first one its constraint forbids (`ProposalGuard.admissible`) either way.
        """

    @abc.abstractmethod
    def update(
        self, carry: PyTree, token_ids: Int[Array, "batch max_len"], length: Int[Array, " batch"]
    ) -> PyTree:
        """The carry after verification, the rows now holding `length` tokens of `token_ids`."""


EXPLORE_TOKENS = 3
"""Guesses a `PromptLookup` row whose budget fell to 0 may still make, on a full
`max_ngram_size` match (the budget rule, `cost_model=False`); also the narrowest width
`Speculative` verifies at (`verify_widths`: a call over 4 positions). On the default model
(float32, batch 1, 2-core CPU) a target call over 4 positions cost 1.24x a one-position call,
over 8 1.47x, over 16 1.83x (2026-11-26)."""

EXPLORE_EVERY = 16
"""Steps a `PromptLookup` row may find guesses that the cost model does not verify before it is
due to explore: for one step the cost model plans with `EXPLORE_ACCEPTANCE` for it (one due row
per step, the longest idle). Without it a row whose estimate is below the cost model's threshold
never verifies again, so never learns (int8 at batch 1: the prior's 0.5 is below the 0.55 a call
over 4 positions needs, and prompt lookup never verified). Chosen by replaying the cost model
along plain greedy outputs of `bench_speculative.py`'s prompts (`benchmarks/replay_lookup.py`,
int8, modelled costs; grounded / open prompts): never, batch 1 1.00x / 1.00x, batch 8 1.16x /
0.99x; every 16 steps at 0.6, 1.17x / 1.05x and 1.20x / 0.98x; every 8 at 0.6, 1.24x / 1.02x
and 1.20x / 0.98x; every 8 at 0.7, 1.26x / 1.02x and 1.14x / 0.94x. The less eager setting,
since a real verification step costs more than its model call (the step's own overhead)."""

EXPLORE_ACCEPTANCE = 0.6
"""The optimistic acceptance the cost model plans with for a row due to explore
(`EXPLORE_EVERY`): enough for a call over 4 positions (3 guesses: 2.18 expected tokens) to pay at
batch 1 in every precision of `VERIFY_COST` (int8 1.94x), too little for a wider one at int8
(8 positions, 2.35x) or for one row to make a batch of 8 verify (the batch shares the call's
cost; rows explore one at a time)."""


ACCEPTANCE_DECAY = 0.8
"""How much of its past a `PromptLookup` row's acceptance estimate keeps per verified step (its
counts are multiplied by it before the step's are added: about the last 5 steps count)."""

ACCEPTANCE_PRIOR = (1.0, 1.0)
"""The kept and rejected guesses a row's estimate starts from (a uniform prior: 0.5)."""


class LookupCarry(eqx.Module):
    """`PromptLookup`'s carry, per row: `budget` (the guesses the row may make next step, in
    `[0, num_tokens]`), the last step's `guesses` (`-1`: none; the search leaves only those it
    verified), the row `start` length they followed (to count how many the row kept), and the
    acceptance estimate: by the size `n` of the n-gram match that made the guesses, decayed
    counts of kept guesses (`hits[:, n - 1]`) and of runs ended by a rejection
    (`misses[:, n - 1]`), and the last step's match size `ngram` (0: no match).

    For exploration, `found` (the guesses the lookup found this step, before the cost model cut
    them) and `idle` (steps since the row last verified a guess on which it found some).

    `estimate()` is the estimated probability that the row's next guess is kept (the mean of
    a Beta posterior under a geometric model: each guess kept with the same probability until
    the first rejection); `acceptance()`, which the search's cost model
    (`functional_gen.speculative.cost`) plans with, is the estimate, raised to
    `EXPLORE_ACCEPTANCE` for the row due to explore (`EXPLORE_EVERY`).
    """

    budget: Int[Array, " batch"]
    guesses: Int[Array, "batch k"]
    start: Int[Array, " batch"]
    hits: Float[Array, "batch ngram"]
    misses: Float[Array, "batch ngram"]
    ngram: Int[Array, " batch"]
    found: Int[Array, " batch"]
    idle: Int[Array, " batch"]

    def estimates(self) -> Float[Array, "batch ngram"]:
        """Per row and n-gram size `n` (column `n - 1`), the estimated probability that a guess
        from a match of that size is kept."""
        prior_hits, prior_misses = ACCEPTANCE_PRIOR
        return (self.hits + prior_hits) / (self.hits + self.misses + prior_hits + prior_misses)

    def estimate(self) -> Float[Array, " batch"]:
        """Per row, the estimated probability that a guess from its current match is kept."""
        n = jnp.clip(self.ngram - 1, 0, self.hits.shape[1] - 1)
        return jnp.take_along_axis(self.estimates(), n[:, None], axis=1)[:, 0]

    def exploring(self) -> Bool[Array, " batch"]:
        """The row due to explore, if any: of the rows that found guesses this step and have not
        verified any for `EXPLORE_EVERY` steps that found some, the longest idle (ties: the
        first); at most one row per step, so that a batch explores one row at a time."""
        due = (self.found > 0) & (self.idle >= EXPLORE_EVERY)
        pick = jnp.argmax(jnp.where(due, self.idle, -1))
        return due & (jnp.arange(self.idle.shape[0]) == pick)

    def ceiling(self) -> Float[Array, " batch"]:
        """Per row, the most `acceptance()` can be this step, before the lookup has run: the
        largest estimate of any n-gram size, at least `EXPLORE_ACCEPTANCE` for a row idle long
        enough to be due (`EXPLORE_EVERY`), whatever it finds. Where the cost model verifies
        nothing even at these values, the search skips the lookup (it could not pay)."""
        best = jnp.max(self.estimates(), axis=1)
        return jnp.where(self.idle >= EXPLORE_EVERY, jnp.maximum(best, EXPLORE_ACCEPTANCE), best)

    def acceptance(self) -> Float[Array, " batch"]:
        """Per row, the acceptance the cost model plans with: `estimate()`, at least
        `EXPLORE_ACCEPTANCE` for the row `exploring()` picks (optimism in the face of
        uncertainty: a row that is never verified never corrects a low estimate)."""
        estimate = self.estimate()
        return jnp.where(self.exploring(), jnp.maximum(estimate, EXPLORE_ACCEPTANCE), estimate)


class PromptLookup(AbstractProposer):
    """Prompt-lookup decoding: guess that the text goes on as it did after an earlier
    occurrence of its last tokens.

    For `n` from `max_ngram_size` down to 1, the row's last `n` tokens are looked up in the row's
    own prompt and generated tokens; an occurrence followed by at least one token gives the
    guesses: the up to `num_tokens` tokens after it. Which occurrence: `match="latest"` (the
    default when `adaptive`) the most recent one, `match="first"` (the default otherwise, as
    transformers) the leftmost. Positions without a guess (a continuation shorter than
    `num_tokens`, or no match at all) are `-1`; when no row guesses anything, the step is a
    plain one-position decode step. Everything is array code with fixed shapes, on the device:
    one comparison of the row with each of its last `max_ngram_size` tokens, shifted and
    combined (no gathers over the row).

    Replayed along plain greedy outputs of `benchmarks/bench_speculative.py`'s 24 grounded
    prompts (float32, `num_tokens=10`, `max_ngram_size=3`, every guess verified;
    `benchmarks/replay_lookup.py`), the latest occurrence kept 0.22 of the guesses and yielded
    2.84 tokens per verifying step, the first 0.18 and 2.78 (the best of all matches, an
    oracle: 0.25 and 3.40); longer n-grams (4, 5) or the longest match of any size changed
    that by under 2%; matching the prompt alone, 2.38.

    **Adaptive** (`adaptive=True`, the default): a verification costs more than a decode step
    (on this CPU, 1.2-1.8x for 4-16 positions at batch 1, 3-7x at batch 8), so not every guess
    is worth verifying. The carry (`LookupCarry`) estimates each row's acceptance, per n-gram
    size of the match that guessed (`LookupCarry.estimate`), from which the search's cost model
    (`functional_gen.speculative.cost`, `cost_model=True`) decides how many of the guesses a step
    verifies, none when a plain decode step yields more per unit of time; a row the cost model
    keeps refusing is verified once in a while anyway (`EXPLORE_EVERY`), so that its estimate
    can recover. Lossless either way (only what is verified changes).
    With `cost_model=False` a per-row `budget` cuts the guesses instead: after a step whose
    guesses were all accepted it is `num_tokens` again, after a rejection the number accepted
    (0: the row stops guessing, and guesses again only on a full `max_ngram_size` match, at most
    `EXPLORE_TOKENS` tokens); transformers' `num_assistant_tokens_schedule="heuristic"` in
    spirit. (Replayed as above with the measured costs, batch 1: the budget with the cost model
    1.46x plain, the cost model alone 1.59x, with the latest match 1.63x.)
    `adaptive=False` guesses like transformers (the full continuation every step, all verified).

    **Arguments:** `num_tokens` (static, `k`), `max_ngram_size` (static, the longest n-gram),
    `adaptive` (static), `cost_model` (static, with `adaptive`: let the search's cost model cut
    the verified guesses; its table was measured for the default model on a 2-core CPU, so turn
    it off on hardware where verifying costs about one decode step), `match` (static, `"latest"`
    or `"first"`; `None`: `"latest"` when `adaptive`, else `"first"`).

    **Raises:** `ValueError` for a `num_tokens` or `max_ngram_size` below 1, or a `match` other
    than `"latest"`, `"first"` or `None`.

    Source: Saxena's prompt-lookup decoding; transformers' `PromptLookupCandidateGenerator`
    (`generate(prompt_lookup_num_tokens=...)`, `max_matching_ngram_size`: the first match);
    the latest match as llama.cpp's `common_ngram_cache` prefers recent statistics.
    """

    num_tokens: int = eqx.field(static=True, default=10)
    max_ngram_size: int = eqx.field(static=True, default=2)
    adaptive: bool = eqx.field(static=True, default=True)
    cost_model: bool = eqx.field(static=True, default=True)
    match: str | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _check_positive("num_tokens", self.num_tokens)
        _check_positive("max_ngram_size", self.max_ngram_size)
        if self.match not in (None, "latest", "first"):
            raise ValueError(
                f'PromptLookup\'s `match` must be "latest", "first" or None, got {self.match!r}'
            )

    @property
    def latest(self) -> bool:
        """Whether the lookup takes the most recent occurrence (else the first)."""
        return self.match == "latest" or (self.match is None and self.adaptive)

    def init(self, target: AbstractCausalLM | None, rows: int, capacity: int) -> LookupCarry | None:
        """Every row's budget at `num_tokens`, no acceptance counts (`None` when not
        `adaptive`)."""
        if not self.adaptive:
            return None
        k = self.num_tokens
        zeros = jnp.zeros((rows,), jnp.int32)
        return LookupCarry(
            budget=jnp.full((rows,), k, jnp.int32),
            guesses=jnp.full((rows, k), -1, jnp.int32),
            start=zeros,
            hits=jnp.zeros((rows, self.max_ngram_size), jnp.float32),
            misses=jnp.zeros((rows, self.max_ngram_size), jnp.float32),
            ngram=zeros,
            found=zeros,
            idle=zeros,
        )

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        """The looked-up guesses (see the class) of the active rows, cut to each row's budget
        when `carry` is a `LookupCarry` and there is no `cost_model` (all of them for `None`);
        `q` is `None` (deterministic). The guard is not used here (the search cuts the guesses
        at the first forbidden one)."""
        del target, key, sample, guard, guard_state
        guesses, ngram = jax.vmap(self._lookup)(token_ids, length)
        if carry is None:
            return carry, guesses, None
        if self.cost_model:
            limit = jnp.where(active, self.num_tokens, 0)
        else:
            explore = jnp.where(
                ngram >= self.max_ngram_size, min(EXPLORE_TOKENS, self.num_tokens), 0
            )
            limit = jnp.where(active, jnp.where(carry.budget > 0, carry.budget, explore), 0)
        guesses = jnp.where(jnp.arange(self.num_tokens)[None, :] < limit[:, None], guesses, -1)
        found = jnp.sum(guesses >= 0, axis=1).astype(jnp.int32)
        carry = dataclasses.replace(carry, guesses=guesses, start=length, ngram=ngram, found=found)
        return carry, guesses, None

    def update(self, carry, token_ids, length):
        """The carry after verification. Budgets: `num_tokens` where every guess was kept, else
        the number kept (rows that verified nothing keep theirs). The acceptance counts of the
        n-gram size that guessed: decayed by `ACCEPTANCE_DECAY`, plus the guesses kept and 1 if
        a guess was rejected (rows that verified nothing keep theirs). `idle`: 0 where a guess
        was verified, one more where guesses were found but none verified."""
        if carry is None:
            return carry
        k = self.num_tokens
        cols = carry.start[:, None] + jnp.arange(k)[None, :]
        kept_ids = jnp.take_along_axis(token_ids, jnp.clip(cols, 0, token_ids.shape[1] - 1), axis=1)
        guessed = carry.guesses >= 0
        kept = jnp.sum(
            jnp.cumprod(guessed & (cols < length[:, None]) & (kept_ids == carry.guesses), axis=1),
            axis=1,
        )
        offered = jnp.sum(guessed, axis=1)
        budget = jnp.where(kept >= offered, k, kept)
        budget = jnp.where(offered > 0, budget, carry.budget).astype(jnp.int32)
        tried = (offered > 0)[:, None] & (
            jnp.arange(self.max_ngram_size) + 1 == carry.ngram[:, None]
        )
        hits = jnp.where(
            tried, ACCEPTANCE_DECAY * carry.hits + kept.astype(jnp.float32)[:, None], carry.hits
        )
        rejected = (kept < offered).astype(jnp.float32)[:, None]
        misses = jnp.where(tried, ACCEPTANCE_DECAY * carry.misses + rejected, carry.misses)
        idle = jnp.where(offered > 0, 0, carry.idle + (carry.found > 0).astype(jnp.int32))
        return dataclasses.replace(carry, budget=budget, hits=hits, misses=misses, idle=idle)

    def _lookup(
        self, ids: Int[Array, " max_len"], length: Int[Array, ""]
    ) -> tuple[Int[Array, " k"], Int[Array, ""]]:
        """`(guesses, n)`: the guesses and the size of the n-gram that matched (0: none)."""
        cols = ids.shape[0]
        k, top = self.num_tokens, self.max_ngram_size
        index = jnp.arange(cols)
        tail = ids[jnp.clip(length - top + jnp.arange(top), 0, cols - 1)]  # the last `top` tokens
        # equal[m][i]: ids[i + m] == the token m places into an n-gram ending the row, computed
        # once per tail token as one compare of the row, shifted by a static `m` (no gather)
        same = [ids == tail[t] for t in range(top)]

        def shifted(x, m):
            return x if m == 0 else jnp.concatenate([x[m:], jnp.zeros((m,), bool)])

        found = jnp.zeros((), bool)
        start = jnp.zeros((), jnp.int32)
        ngram = jnp.zeros((), jnp.int32)
        for n in range(top, 0, -1):
            # windows starting at i: ids[i .. i + n) == the last n tokens, and a token after
            match = (index + n < length) & (length - n >= 1)
            for m in range(n):
                match = match & shifted(same[top - n + m], m)
            hit = jnp.any(match)
            # the last window that matches, or the first
            at = cols - 1 - jnp.argmax(match[::-1]) if self.latest else jnp.argmax(match)
            first = at.astype(jnp.int32) + n
            start = jnp.where(~found & hit, first, start)
            ngram = jnp.where(~found & hit, n, ngram)
            found = found | hit
        cand_cols = start + jnp.arange(k)
        guesses = ids[jnp.clip(cand_cols, 0, cols - 1)]
        # past the row's end (a short continuation) or without a match: no guess (-1)
        valid = found & (cand_cols < length)
        return jnp.where(valid, guesses, -1).astype(jnp.int32), ngram


class DraftCarry(eqx.Module):
    """A draft model's carry: its `cache` and, per row, `cached` (leading tokens whose keys and
    values the cache holds, always below the row's length), the last step's `guesses` and the
    row `start` length they followed (to tell which were kept)."""

    cache: KVCache
    cached: Int[Array, " batch"]
    guesses: Int[Array, "batch k"]
    start: Int[Array, " batch"]


class DraftModel(AbstractProposer):
    """A smaller model of the same vocabulary guesses `num_tokens` tokens, one at a time.

    Its own `KVCache` is in the carry: the first step feeds it every row's text (a prefill), each
    later step the at most two tokens it has not seen (the target's correction and, after a
    fully accepted run, the last guess), then `num_tokens - 1` guesses. After verification the
    slots of rejected guesses are dropped by position (`keep_below`), not copied.

    **Arguments:** `draft` (an `AbstractCausalLM`; its `vocab_size` must be the target's,
    checked when the call is planned), `num_tokens` (static, `k`).

    **Raises:** `TypeError` for a draft that is not an `AbstractCausalLM`; `ValueError` for a
    `num_tokens` below 1.

    Source: Leviathan, Kalman & Matias 2023; transformers' assisted generation
    (`assistant_model`).
    """

    draft: AbstractCausalLM
    num_tokens: int = eqx.field(static=True, default=4)

    def __check_init__(self):
        if not isinstance(self.draft, AbstractCausalLM):
            raise TypeError(
                "DraftModel's `draft` must be an AbstractCausalLM (e.g. from "
                f"functional_gen.load_model), got {type(self.draft).__name__}"
            )
        _check_positive("num_tokens", self.num_tokens)

    def init(self, target, rows, capacity):
        """An empty draft cache (room for the text and the steps' guesses)."""
        return _draft_init(self.draft, self.num_tokens, rows, capacity)

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        """The draft's guesses and probabilities (see the class), masked by the guard."""
        return _draft_propose(
            self.draft,
            self.num_tokens,
            carry,
            token_ids,
            length,
            active,
            key,
            sample,
            (guard, guard_state),
        )

    def update(self, carry, token_ids, length):
        """Drop the draft's cached guesses that the rows did not keep."""
        return _draft_update(carry, token_ids, length)


class EarlyExit(AbstractProposer):
    """Self-speculation: the target's first `num_layers` layers, its final norm and its output
    head are the draft (LayerSkip's early exit; the same weights, no second model).

    The draft's cache is its own (the first layers' keys and values are computed again, not
    shared with the target's cache).

    **Arguments:** `num_layers` (static, at least 1 and fewer than the target's layers, checked
    when the call is planned), `num_tokens` (static, `k`).

    **Raises:** `ValueError` for `num_layers` or `num_tokens` below 1.

    Source: Elhoushi et al. 2024 (LayerSkip); transformers' `assistant_early_exit`.
    """

    num_layers: int = eqx.field(static=True)
    num_tokens: int = eqx.field(static=True, default=4)

    def __check_init__(self):
        _check_positive("num_layers", self.num_layers)
        _check_positive("num_tokens", self.num_tokens)

    def draft_of(self, target: AbstractCausalLM) -> AbstractCausalLM:
        """The draft: `target.first_layers(num_layers)`.

        **Raises:** `TypeError` for a target without `first_layers`; `ValueError` for
        `num_layers` not below the target's layer count.
        """
        if not hasattr(type(target), "first_layers"):
            raise TypeError(
                f"EarlyExit needs a model with `first_layers` (a DecoderForCausalLM), got "
                f"{type(target).__name__}"
            )
        return target.first_layers(self.num_layers)

    def init(self, target, rows, capacity):
        """An empty cache of the first layers."""
        return _draft_init(self.draft_of(target), self.num_tokens, rows, capacity)

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        """The early exit's guesses and probabilities, masked by the guard."""
        return _draft_propose(
            self.draft_of(target),
            self.num_tokens,
            carry,
            token_ids,
            length,
            active,
            key,
            sample,
            (guard, guard_state),
        )

    def update(self, carry, token_ids, length):
        """Drop the cached guesses that the rows did not keep."""
        return _draft_update(carry, token_ids, length)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def draft_cache_len(num_tokens: int, capacity: int) -> int:
    """Slots of a draft's cache for rows of `capacity` columns: the text, then room for one
    step's writes (`num_tokens + 1`) twice over (compaction frees the rest)."""
    return capacity + 2 * (num_tokens + 1)


def _draft_init(draft, k, rows, capacity) -> DraftCarry:
    return DraftCarry(
        cache=draft.init_cache(rows, draft_cache_len(k, capacity)),
        cached=jnp.zeros((rows,), jnp.int32),
        guesses=jnp.zeros((rows, k), jnp.int32),
        start=jnp.zeros((rows,), jnp.int32),
    )


def _draft_propose(draft, k, carry: DraftCarry, token_ids, length, active, key, sample, guarded):
    batch, cols = token_ids.shape
    cache, cached = carry.cache, carry.cached

    def feed(cache, ids, pos):
        cache = make_room(cache, ids.shape[1])
        logits, cache = draft(ids, pos, cache, logits_to_keep=1)
        return logits[:, -1, :], cache

    # 1. A row whose cache lags by more than two tokens (the first step: nothing cached) gets
    #    everything but its last token fed in one call (a prefill).
    def prefill(cache):
        col = jnp.arange(cols)[None, :]
        fed = active[:, None] & (col >= cached[:, None]) & (col < length[:, None] - 1)
        pos = jnp.where(fed, col, -1)
        return feed(cache, token_ids, pos)[1]

    lagging = jnp.any(active & (length - cached > 2))
    cache = switch_in_place(lagging.astype(jnp.int32), [lambda c: c, prefill], cache)
    cached = jnp.where(lagging & active, jnp.maximum(cached, length - 1), cached)
    # 2. The last one or two tokens, which gives the draft's logits after the row's text.
    cols2 = length[:, None] - 2 + jnp.arange(2)[None, :]
    ids2 = jnp.take_along_axis(token_ids, jnp.clip(cols2, 0, cols - 1), axis=1)
    pos2 = jnp.where(active[:, None] & (cols2 >= 0) & (cols2 >= cached[:, None]), cols2, -1)
    logits, cache = feed(cache, ids2, pos2)

    # 3. k guesses, feeding each but the last; with a constraint, each drawn from the draft's
    #    distribution masked by it (a guess it forbids is never made; where it forbids every
    #    token, the unmasked one: the search cuts that guess).
    guard, guard_state = guarded

    def constrain(guard_state, logits):
        if guard is None:
            return guard_state, logits
        guard_state, masked = guard.mask(guard_state, logits)
        dead = jnp.all(masked == -jnp.inf, axis=-1, keepdims=True)
        return guard_state, jnp.where(dead, logits, masked)

    def advance(guard_state, token):
        return guard_state if guard is None else guard.push(guard_state, token)

    def choose(logits, j):
        probs = jax.nn.softmax(logits, axis=-1)
        if sample:  # row r's j-th guess uses fold_in(key[r], j)
            keys = jax.vmap(jax.random.fold_in, (0, None))(key, j)
            token = jax.vmap(categorical)(keys, logits)
        else:
            token = jnp.argmax(logits, axis=-1)
        return token.astype(jnp.int32), probs

    def guess(carry, j):
        cache, logits, guard_state = carry
        guard_state, logits = constrain(guard_state, logits)
        token, probs = choose(logits, j)
        guard_state = advance(guard_state, token)
        pos = jnp.where(active, length + j, -1)
        logits, cache = feed(cache, token[:, None], pos[:, None])
        return (cache, logits, guard_state), (token, probs)

    (cache, logits, guard_state), (tokens, probs) = jax.lax.scan(
        guess, (cache, logits, guard_state), jnp.arange(k - 1)
    )
    _, logits = constrain(guard_state, logits)
    last, last_probs = choose(logits, k - 1)
    guesses = jnp.concatenate([tokens.T.reshape(batch, k - 1), last[:, None]], axis=1)
    q = None
    if sample:
        q = jnp.concatenate(
            [probs.transpose(1, 0, 2).reshape(batch, k - 1, -1), last_probs[:, None, :]], axis=1
        )
    carry = DraftCarry(
        cache=cache,
        cached=jnp.where(active, length, cached),
        guesses=jnp.where(active[:, None], guesses, carry.guesses),
        start=jnp.where(active, length, carry.start),
    )
    return carry, guesses, q


def _draft_update(carry: DraftCarry, token_ids, length) -> DraftCarry:
    """Keep the fed guesses that the rows kept; always leave the row's last token uncached (the
    next step feeds it to get the draft's logits after it)."""
    k = carry.guesses.shape[1]
    cols = carry.start[:, None] + jnp.arange(k - 1)[None, :]
    kept = jnp.take_along_axis(token_ids, jnp.clip(cols, 0, token_ids.shape[1] - 1), axis=1)
    match = (cols < length[:, None]) & (kept == carry.guesses[:, : k - 1])
    m = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
    cached = jnp.maximum(jnp.minimum(carry.start + m, length - 1), 0)
    return DraftCarry(
        cache=keep_below(carry.cache, cached),
        cached=cached,
        guesses=carry.guesses,
        start=carry.start,
    )
