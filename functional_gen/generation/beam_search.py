"""Beam search inside the compiled loop, every row state reordered by ONE gather.

Source: transformers' vectorised `GenerationMixin._beam_search` (5.x: `_get_top_k_continuations`,
`_get_running_beams_for_next_iteration`, `_update_finished_beams`,
`_check_early_stop_heuristic`), itself after Flax's beam search; the scoring is the same step
for step, so the returned sequences and `sequences_scores` equal transformers'.

Beams are rows of the batch: prompt `b` owns rows `b * num_beams ... b * num_beams +
num_beams - 1`, prefilled once and forked. Each step:

1. `log_softmax` of every row's logits, then the processors (per row, vmapped), as
   transformers runs its processors on log-probabilities in beam search;
2. the row's running score is added, and the top `K = max(2, 1 + #eos) * num_beams`
   continuations over all beams of a prompt are taken (or sampled without replacement for
   beam sampling, as transformers' `torch.multinomial(probs, num_samples=K)`:
   `reductions.categorical_without_replacement`);
3. continuations that end (an EOS, or `max_new_tokens` reached) compete for the finished list
   (length penalty applied), the best `num_beams` others become the running beams;
4. every per-row leaf of the `GenerationState` (tokens, KV cache, processor states,
   stop-string states, keys, logprobs) is gathered from the source rows in ONE
   `jax.tree.map(lambda x: x[idx], ...)`: no processor has reorder code;
5. the new tokens are appended and run through the model (decode).

The finished hypotheses live in fixed-shape arrays in `BeamState`, so nothing leaves the
device per step.
"""

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..reductions import categorical_without_replacement
from .search import AbstractSearch, process_rows
from .state import LENGTH, GenerationState

EARLY_STOPPING = (True, False, "never")
_NEG = -1.0e9


class BeamSearch(AbstractSearch):
    """Beam search (`num_beams` hypotheses per prompt), with transformers' semantics.

    **Arguments:**

    - `num_beams`: beams per prompt (static; `>= 1`).
    - `length_penalty`: finished hypotheses are scored `sum(logprobs) / length **
      length_penalty` (length = generated tokens); > 0 favours longer sequences. Default 1.0.
      An array leaf: new values do not recompile.
    - `early_stopping`: `True` stops a prompt as soon as `num_beams` hypotheses are finished;
      `False` (default) stops when the best running beam, at its current length, can no longer
      beat the worst finished one; `"never"` estimates that with the longest possible length
      when `length_penalty > 0` (the canonical beam search).
    - `do_sample`: beam sampling: draw the `K` continuations without replacement from the
      processed distribution (`softmax` of the accumulated scores) instead of taking the top
      `K`.

    **Raises:** `ValueError` for `num_beams < 1`, a NaN or infinite `length_penalty`, or an
    `early_stopping` outside `(True, False, "never")`.

    Source: transformers `generate(num_beams=..., length_penalty=..., early_stopping=...,
    do_sample=...)`.
    """

    num_beams: int = eqx.field(static=True)
    length_penalty: Float[Array, ""]
    early_stopping: bool | str = eqx.field(static=True)
    do_sample: bool = eqx.field(static=True)

    def __init__(
        self,
        num_beams: int,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        do_sample: bool = False,
    ):
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"`num_beams` must be a positive integer, got {num_beams!r}")
        if not any(early_stopping is e or early_stopping == e for e in EARLY_STOPPING) or (
            isinstance(early_stopping, int) and not isinstance(early_stopping, bool)
        ):
            raise ValueError(
                f"`early_stopping` must be True, False or 'never', got {early_stopping!r}"
            )
        if not math.isfinite(float(length_penalty)):
            raise ValueError(f"`length_penalty` must be a finite number, got {length_penalty!r}")
        self.num_beams = num_beams
        self.length_penalty = jnp.asarray(length_penalty, jnp.float32)
        self.early_stopping = early_stopping
        self.do_sample = bool(do_sample)

    @property
    def needs_key(self) -> bool:
        """Only beam sampling is random."""
        return self.do_sample

    @property
    def sampler(self) -> "BeamSearch":
        """A beam search picks the tokens of whole groups of rows itself: it is its own
        sampler (what `make_step(sampler=BeamSearch(...))` was given)."""
        return self

    def init(self, rows: int, steps: int) -> "BeamState":
        """The bookkeeping of `rows // num_beams` prompts before the first step."""
        return BeamState.init(rows // self.num_beams, self.num_beams, steps)

    def __call__(self, step, state: GenerationState) -> GenerationState:
        """One beam-search step of `step` (the `Step`) on `state` (its `search_state` a
        `BeamState`): see the module docstring."""
        return beam_step(self, step, state)


class BeamState(eqx.Module):
    """The beam-search bookkeeping of a batch of `prompts`, each with `num_beams` rows.

    **Attributes:**

    - `running_scores`: `Float[Array, "prompts num_beams"]`, cumulative processed logprobs of
      the running beams (sorted, best first).
    - `running_beam_indices`: `Int[Array, "rows steps"]`, for every running row, the row each
      of its generated tokens was chosen from (transformers' `beam_indices`), -1 unused.
    - `tokens`: `Int[Array, "prompts num_beams steps"]`, the finished hypotheses' generated
      tokens (best first); `lengths`: their token counts; `scores`: their scores with the
      length penalty (`-1e9` for an empty slot); `beam_indices`: as above; `token_logprobs`:
      the processed logprob of each of their tokens; `finished`:
      `Bool[Array, "prompts num_beams"]`, which slots hold a hypothesis.
    - `improvable`: `Bool[Array, " prompts"]`, transformers' `is_early_stop_heuristic_unsatisfied`.
    """

    running_scores: Float[Array, "prompts num_beams"]
    running_beam_indices: Int[Array, "rows steps"]
    tokens: Int[Array, "prompts num_beams steps"]
    lengths: Int[Array, "prompts num_beams"]
    scores: Float[Array, "prompts num_beams"]
    beam_indices: Int[Array, "prompts num_beams steps"]
    token_logprobs: Float[Array, "prompts num_beams steps"]
    finished: Bool[Array, "prompts num_beams"]
    improvable: Bool[Array, " prompts"]

    @classmethod
    def init(cls, prompts: int, num_beams: int, steps: int) -> "BeamState":
        """Before the first step: only beam 0 of a prompt is live (the others score `-1e9`, so
        the first step does not pick the same token on every beam)."""
        running = jnp.full((prompts, num_beams), _NEG, jnp.float32).at[:, 0].set(0.0)
        return cls(
            running_scores=running,
            running_beam_indices=jnp.full((prompts * num_beams, steps), -1, jnp.int32),
            tokens=jnp.zeros((prompts, num_beams, steps), jnp.int32),
            lengths=jnp.zeros((prompts, num_beams), jnp.int32),
            scores=jnp.full((prompts, num_beams), _NEG, jnp.float32),
            beam_indices=jnp.full((prompts, num_beams, steps), -1, jnp.int32),
            token_logprobs=jnp.zeros((prompts, num_beams, steps), jnp.float32),
            finished=jnp.zeros((prompts, num_beams), bool),
            improvable=jnp.ones((prompts,), bool),
        )


def _gather(x, idx):
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - idx.ndim)), axis=1)


class _Continuations(NamedTuple):
    """The top `K` continuations of every prompt (arrays `[prompts, K]`, best first)."""

    scores: Float[Array, "prompts k"]  # running score + processed logprob of the token
    src_row: Int[Array, "prompts k"]  # the row (beam) each continues
    tokens: Int[Array, "prompts k"]  # the token each appends
    token_logprobs: Float[Array, "prompts k"]  # that token's processed logprob
    ends: Bool[Array, "prompts k"]  # an EOS, or the prompt's `max_new_tokens` reached
    dead: Bool[Array, "prompts k"]  # a `-inf` score: no continuation at all


def beam_step(search: BeamSearch, step, state: GenerationState) -> GenerationState:
    """One beam-search step of `search` with `step` (the `Step`) on `state` (a
    `GenerationState` whose `search_state` is a `BeamState`), in the module docstring's order:
    scores, top-k over beams, the running beams, the finished hypotheses, the stopping
    heuristic, then one reorder of every row and the decode."""
    nb = search.num_beams
    prompts = state.batch_size // nb
    beam: BeamState = state.search_state
    prompt_done = state.done.reshape(prompts, nb)[:, 0]
    gen_after = state.num_generated.reshape(prompts, nb)[:, 0] + 1  # generated after this step
    budget = state.max_new_tokens.reshape(prompts, nb)[:, 0]

    processor_states, logprobs, sample_keys = process_rows(
        step, state, jax.nn.log_softmax(state.logits, axis=-1)
    )
    logprobs = jnp.where(jnp.isnan(logprobs), -jnp.inf, logprobs)
    cont = _top_k_continuations(search, step, beam, logprobs, sample_keys, gen_after, budget)
    new_scores, new_src, new_tokens = _running_beams(cont, nb)
    finished = _update_finished(search, state, beam, cont, gen_after)
    improvable, stop = _early_stop(search, beam, cont, new_scores, finished, gen_after, budget)

    # A prompt already done keeps everything as it is.
    base = (jnp.arange(prompts) * nb)[:, None]
    src = jnp.where(prompt_done[:, None], base + jnp.arange(nb)[None, :], new_src)
    state = _reorder_and_decode(
        step,
        state,
        processor_states,
        logprobs,
        src.reshape(-1),
        new_tokens.reshape(-1),
        active=~jnp.repeat(prompt_done, nb),
    )

    done_prompt = prompt_done | stop
    reason = jnp.where(done_prompt & ~prompt_done, LENGTH, 0)
    finish_reason = jnp.where(state.done, state.finish_reason, jnp.repeat(reason, nb))

    def old_or(new, old):
        return jnp.where(prompt_done.reshape((prompts,) + (1,) * (new.ndim - 1)), old, new)

    new_beam = BeamState(
        running_scores=old_or(new_scores, beam.running_scores),
        running_beam_indices=state.search_state.running_beam_indices,
        improvable=old_or(improvable, beam.improvable),
        **{name: old_or(value, getattr(beam, name)) for name, value in finished.items()},
    )
    return eqx.tree_at(
        lambda s: (s.done, s.finish_reason, s.search_state),
        state,
        (jnp.repeat(done_prompt, nb), finish_reason.astype(jnp.int32), new_beam),
    )


def _top_k_continuations(
    search: BeamSearch,
    step,
    beam: BeamState,
    logprobs: Float[Array, "rows vocab"],
    sample_keys,
    gen_after: Int[Array, " prompts"],
    budget: Int[Array, " prompts"],
) -> _Continuations:
    """Scores and top-k over beams: each beam's running score plus its processed `logprobs`,
    and the best `K = max(2, 1 + #eos) * num_beams` of them over all beams of a prompt (or `K`
    drawn without replacement, `reductions.categorical_without_replacement`, for beam sampling)."""
    nb = search.num_beams
    prompts, vocab = beam.running_scores.shape[0], logprobs.shape[-1]
    k = max(2, 1 + len(step.eos_token_id)) * nb
    per_beam = logprobs.reshape(prompts, nb, vocab)
    acc = (per_beam + beam.running_scores[:, :, None]).reshape(prompts, nb * vocab)
    if search.do_sample:
        prompt_keys = sample_keys.reshape(prompts, nb)[:, 0]
        # successive draws by inverse transform, 2 k uniform numbers (the Gumbel-top-k trick's
        # distribution; its noise over num_beams x 262,144 entries took ~15 ms a step on CPU)
        drawn = jax.vmap(lambda key, a: categorical_without_replacement(key, a, k))(
            prompt_keys, acc
        )
        top_idx = jnp.maximum(drawn, 0)
        top_lp = jnp.where(drawn >= 0, jnp.take_along_axis(acc, top_idx, axis=1), -jnp.inf)
    else:
        top_lp, top_idx = jax.lax.top_k(acc, k)
    src_beam = top_idx // vocab
    tokens = (top_idx % vocab).astype(jnp.int32)
    is_eos = jnp.isin(tokens, jnp.asarray(step.eos_token_id, jnp.int32))
    return _Continuations(
        scores=top_lp,
        src_row=(jnp.arange(prompts) * nb)[:, None] + src_beam,
        tokens=tokens,
        token_logprobs=per_beam[jnp.arange(prompts)[:, None], src_beam, tokens],
        ends=is_eos | (gen_after >= budget)[:, None],
        dead=~jnp.isfinite(top_lp),
    )


def _running_beams(cont: _Continuations, nb: int):
    """The best `nb` continuations that do not end become the running beams: their scores, the
    rows they continue and their tokens (`[prompts, nb]` each; an ending one scores `-1e9`)."""
    running_lp = cont.scores + jnp.where(cont.ends, _NEG, 0.0)
    next_idx = jax.lax.top_k(running_lp, nb)[1]
    return (
        _gather(running_lp, next_idx),
        _gather(cont.src_row, next_idx),
        _gather(cont.tokens, next_idx),
    )


def _update_finished(
    search: BeamSearch,
    state: GenerationState,
    beam: BeamState,
    cont: _Continuations,
    gen_after: Int[Array, " prompts"],
) -> dict:
    """Finished hypotheses: the continuations among the first `num_beams` that end compete with
    the finished list (scored with the length penalty); the best `num_beams` stay.

    **Returns:** the new values of `BeamState`'s `tokens`, `beam_indices`, `token_logprobs`,
    `lengths`, `scores` and `finished`, by field name.
    """
    nb = search.num_beams
    prompts, k = cont.scores.shape
    steps = state.logprobs.shape[1]
    cols = jnp.arange(steps)[None, None, :]
    n_before = (gen_after - 1)[:, None, None]  # the column this step writes

    def history(rows, value, fill):
        """Each candidate's history: its source row's, with this step's `value` written."""
        out = jnp.where(cols == n_before, value[:, :, None], rows[cont.src_row])
        return out if fill is None else jnp.where(cols <= n_before, out, fill)

    gen_cols = state.start_length[:, None] + jnp.arange(steps)[None, :]
    gen_tokens = jnp.take_along_axis(
        state.token_ids, jnp.minimum(gen_cols, state.token_ids.shape[1] - 1), 1
    )  # [rows, steps]
    candidates = {
        "tokens": history(gen_tokens, cont.tokens, 0),
        "beam_indices": history(beam.running_beam_indices, cont.src_row, None),
        "token_logprobs": history(state.logprobs, cont.token_logprobs, 0.0),
        "lengths": jnp.broadcast_to(gen_after[:, None], (prompts, k)),
    }
    just_finished = cont.ends & (jnp.arange(k) < nb)[None, :] & ~cont.dead
    scored = cont.scores / (gen_after[:, None].astype(jnp.float32) ** search.length_penalty)
    full = jnp.all(beam.finished, axis=1, keepdims=True) & (search.early_stopping is True)
    scored = scored + jnp.where(full, _NEG, 0.0)
    scored = scored + jnp.where(beam.improvable[:, None], 0.0, _NEG)
    scored = scored + jnp.where(just_finished, 0.0, _NEG)
    scored = jnp.where(cont.dead, -jnp.inf, scored)
    merged_scores = jnp.concatenate([beam.scores, scored], axis=1)
    keep = jax.lax.top_k(merged_scores, nb)[1]
    out = {
        name: _gather(jnp.concatenate([getattr(beam, name), value], 1), keep)
        for name, value in candidates.items()
    }
    out["scores"] = _gather(merged_scores, keep)
    out["finished"] = _gather(jnp.concatenate([beam.finished, just_finished], 1), keep)
    return out


def _early_stop(search: BeamSearch, beam, cont, new_scores, finished, gen_after, budget):
    """transformers' `_check_early_stop_heuristic`: whether the best running beam can still
    beat the worst finished hypothesis (`improvable`), and which prompts stop (`[prompts]`)."""
    if search.early_stopping == "never":
        best_len = jnp.where(search.length_penalty > 0.0, budget, gen_after)
    else:
        best_len = gen_after
    best_running = new_scores[:, 0] / (best_len.astype(jnp.float32) ** search.length_penalty)
    fin_done, fin_scores = finished["finished"], finished["scores"]
    worst = jnp.where(fin_done, jnp.min(fin_scores, axis=1, keepdims=True), _NEG)
    improvable = beam.improvable & jnp.any(best_running[:, None] > worst, axis=1)
    all_full = jnp.all(fin_done, axis=1) & (search.early_stopping is True)
    stop = (
        ~improvable
        | all_full
        | jnp.all(cont.ends, axis=1)
        | jnp.all(new_scores <= _NEG / 2, axis=1)
    )
    return improvable, stop


def _reorder_and_decode(
    step,
    state: GenerationState,
    processor_states,
    logprobs: Float[Array, "rows vocab"],
    src: Int[Array, " rows"],
    new_tokens: Int[Array, " rows"],
    *,
    active: Bool[Array, " rows"],
) -> GenerationState:
    """Reorder: ONE gather moves every per-row leaf with its beam (tokens, cache, processor
    states, stop-string states, keys, logprobs, beam indices) from row `src[r]` to row `r`; then
    the `active` rows append `new_tokens` (with their logprobs and source rows) and run them
    through the model (decode). `done` and the finished hypotheses are left to the caller.

    The alternatives (`top_token_ids`, `top_logprobs`, with `Step.top_logprobs`) are the one
    exception: under beam search they form a table by time and row, not a per-row history. Row
    `r`'s top-`k` at this step are written to `[r, this step]` before the reorder, and never
    moved; a hypothesis's alternatives at step `t` are then the table's entry at its beam index
    (the row its token came from, `BeamState.beam_indices`) and `t` (see `hypothesis_alternatives`),
    for running and finished hypotheses alike, with no copy per hypothesis."""
    rows = state.batch_size
    steps = state.logprobs.shape[1]
    n_gen = state.num_generated
    carried = (
        state.token_ids,
        state.length,
        state.logprobs,
        state.cache,
        processor_states,
        state.stop_state,
        state.key,
        state.search_state.running_beam_indices,
    )
    (
        token_ids,
        length,
        row_logprobs,
        cache,
        processor_states,
        stop_state,
        key,
        running_bidx,
    ) = jax.tree.map(lambda x: x[src], carried)
    flat_tokens = jnp.where(active, new_tokens, step.pad_token_id)
    row_ids = jnp.arange(rows)
    write_col = jnp.where(active, length, token_ids.shape[1])
    token_ids = token_ids.at[row_ids, write_col].set(flat_tokens, mode="drop")
    chosen = logprobs[src, flat_tokens]
    if step.logprobs_mode == "raw":
        chosen = jax.nn.log_softmax(state.logits, axis=-1)[src, flat_tokens]
    lp_col = jnp.where(active, n_gen, steps)
    row_logprobs = row_logprobs.at[row_ids, lp_col].set(chosen, mode="drop")
    running_bidx = running_bidx.at[row_ids, lp_col].set(src.astype(jnp.int32), mode="drop")
    length = length + active.astype(jnp.int32)
    top_ids, top_lps = state.top_token_ids, state.top_logprobs
    if step.top_logprobs:  # by source row, before the reorder (see above)
        source = (
            logprobs if step.logprobs_mode == "processed" else jax.nn.log_softmax(state.logits, -1)
        )
        values, ids = jax.lax.top_k(source, step.top_logprobs)
        top_ids = top_ids.at[row_ids, lp_col].set(ids.astype(jnp.int32), mode="drop")
        top_lps = top_lps.at[row_ids, lp_col].set(values, mode="drop")

    positions = jnp.where(active, length - 1, -1)
    next_logits, cache = step.model(flat_tokens[:, None], positions[:, None], cache)
    next_logits = jnp.where(active[:, None], next_logits[:, -1, :], state.logits[src])
    search_state = eqx.tree_at(lambda b: b.running_beam_indices, state.search_state, running_bidx)
    return eqx.tree_at(
        lambda s: (
            s.token_ids,
            s.length,
            s.logits,
            s.logprobs,
            s.top_token_ids,
            s.top_logprobs,
            s.cache,
            s.processor_states,
            s.stop_state,
            s.key,
            s.search_state,
        ),
        state,
        (
            token_ids,
            length,
            next_logits,
            row_logprobs,
            top_ids,
            top_lps,
            cache,
            processor_states,
            stop_state,
            key,
            search_state,
        ),
    )


def hypothesis_alternatives(
    table_ids: Int[Array, "rows steps k"],
    table_logprobs: Float[Array, "rows steps k"],
    beam_indices: Int[Array, "batch steps"],
) -> tuple[Int[Array, "batch steps k"], Float[Array, "batch steps k"]]:
    """The top-`k` alternatives of hypotheses from the beam-search table (`GenerationState.
    top_token_ids` / `top_logprobs` after beam steps, by row and step): at each step `t`, those
    of the row the hypothesis's token came from (`beam_indices[h, t]`); zeros where
    `beam_indices` is -1 (no token), as after a row's end in plain generation."""
    steps = jnp.arange(beam_indices.shape[1])[None, :]
    rows = jnp.maximum(beam_indices, 0)
    used = (beam_indices >= 0)[:, :, None]
    ids = jnp.where(used, table_ids[rows, steps], 0)
    logprobs = jnp.where(used, table_logprobs[rows, steps], 0.0)
    return ids, logprobs
