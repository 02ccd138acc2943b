"""`stream`: generate and yield the text as it is produced, for one prompt or a batch.

The same planning, prefill and `Step` as `generate`, but the loop runs in Python, one
jitted step per token (the state donated, so the `KVCache` is updated in place), so each new
piece of text can be handed out as soon as its token exists. Each step costs ONE
device-to-host transfer: the new token, done flag and finish reason of every row together.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Key

from ..models.base import AbstractCausalLM
from ..sharding import to_host
from ..tokenization import IncrementalDecoder, Prompt, is_chat
from .options import GenerationOptions
from .planning import plan_call
from .program import finish_generation, repeat_rows, start_prepared, step_program
from .result import GenerationResult, build_result
from .samplers import AbstractSampler
from .search import AbstractSearch
from .sequence_state import SequenceState
from .speculative import Speculative
from .state import FINISH_REASONS, GenerationState
from .stop_strings import truncate_at_stop


@eqx.filter_jit
def _last_tokens(state, width: int):
    """Each row's last `width` tokens (`[batch, width]`, oldest first), length, done flags and
    finish reasons: what a step may have appended (one token, or a speculative run)."""
    rows = jnp.arange(state.batch_size)
    cols = state.length[:, None] - width + jnp.arange(width)[None, :]
    last = state.token_ids[rows[:, None], jnp.maximum(cols, 0)]
    return last, state.length, state.done, state.finish_reason


class Stream:
    """An iterator over generated text (what `fg.stream` returns).

    For one prompt (a `str` or one chat) it yields `str` pieces; for a list of prompts, or a
    `SequenceState`, `(row, piece)` pairs. After the iteration ends, `result` holds the
    `GenerationResult` (texts, token ids, logprobs, and the `SequenceState` to continue).

    **Attributes:**

    - `result`: the `GenerationResult`, once the iteration has ended (`None` before).
    - `state`: the final `GenerationState` of the loop, once the iteration has ended (`None`
      before): every loop row (padding rows after the real ones) and the search's carry
      (`search_state`; under speculative decoding a
      `functional_gen.generation.speculative.SpeculativeState` with the rows' `proposed`,
      `accepted` and `steps` counts).
    - `tokens_per_step`: one list per row, filled as the stream is iterated: how many tokens
      each step of the loop appended to the row, until the row finished (1 per step when
      sampling or greedy; under speculative decoding the accepted guesses plus one, and 0 for a
      step that only feeds the row's last token). `None` under beam search, whose beams are
      reordered at every step. The counts of a row sum to its `result.num_tokens` entry.
    """

    def __init__(self, pieces: Iterator, single: bool):
        self._pieces = pieces
        self._single = single
        self.result: GenerationResult | None = None
        self.state: GenerationState | None = None
        self.tokens_per_step: list[list[int]] | None = None

    def __iter__(self):
        return self

    def __next__(self):
        row, piece = next(self._pieces)
        return piece if self._single else (row, piece)


def stream(
    model: AbstractCausalLM,
    tokenizer,
    prompts: Prompt | Sequence[Prompt] | SequenceState,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    **overrides: Any,
) -> Stream:
    """Generate, yielding text pieces as tokens are produced.

    Arguments are those of `functional_gen.generate` (`options` and keyword `overrides` alike;
    everything is validated before the first
    compilation, when `stream` is called). Pieces never split a UTF-8 character; a row's pieces
    joined equal `generate(...).texts[row]` for the same arguments (no EOS, no special tokens,
    nothing from a stop string on: with stop strings, the last few characters of a row are held
    back until they cannot start one).

    **Returns:** a `Stream`: iterate it for `str` pieces (one prompt) or `(row, piece)` pairs (a
    list of prompts or a `SequenceState`); then `stream.result` is the `GenerationResult`.

    **Raises:** as `generate`.
    """
    single = isinstance(prompts, str) or is_chat(prompts)
    model, settings, prepared = plan_call(
        model,
        tokenizer,
        prompts,
        options,
        processors=processors,
        sampler=sampler,
        key=key,
        **overrides,
    )
    if tokenizer is None and isinstance(prompts, SequenceState):
        tokenizer = prompts.tokenizer
    if prepared.plan.num_beams and settings.num_return_sequences > 1:
        raise ValueError(
            "stream with beam search yields the best hypothesis of each prompt; use generate for "
            "num_return_sequences > 1"
        )
    out = Stream(iter(()), single)
    out._pieces = _pieces(model, tokenizer, settings, prepared, out)
    return out


@eqx.filter_jit
def _beam_prefix(state, num_beams: int):
    """Per prompt: how many generated tokens every live beam and every finished hypothesis
    share (the settled text), beam 0's generated tokens, and the prompts' done flags."""
    beam = state.search_state
    rows = state.batch_size
    prompts = rows // num_beams
    steps = state.logprobs.shape[1]
    cols = state.start_length[:, None] + jnp.arange(steps)[None, :]
    gen = jnp.take_along_axis(state.token_ids, jnp.minimum(cols, state.token_ids.shape[1] - 1), 1)
    n = state.num_generated
    live = gen.reshape(prompts, num_beams, steps)
    live_n = n.reshape(prompts, num_beams)
    first = live[:, :1]
    j = jnp.arange(steps)[None, None, :]
    # a column is settled when every live beam and every finished hypothesis has it, equal
    same_live = jnp.all((live == first) & (j < live_n[:, :, None]), axis=1)
    fin = beam.finished[:, :, None]
    same_fin = jnp.all(~fin | ((beam.tokens == first) & (j < beam.lengths[:, :, None])), axis=1)
    settled = jnp.cumprod(same_live & same_fin, axis=1).sum(axis=1)
    return settled, first[:, 0], state.done.reshape(prompts, num_beams)[:, 0]


def _beam_pieces(model, tokenizer, settings, prepared, out: Stream, state, prompt_lp):
    """Streaming under beam search: the text all live beams and finished hypotheses of a prompt
    agree on, as soon as it is settled; the rest of the best hypothesis at the end."""
    nb = prepared.plan.num_beams
    prompts = prepared.rows
    eos = set(settings.eos_token_id)
    decoders = [IncrementalDecoder(tokenizer) for _ in range(prompts)]
    emitted_tokens, emitted = [0] * prompts, [""] * prompts
    finished = np.zeros(prompts, bool)
    while not finished.all():
        state = step_program(prepared.step.model.compiler_options)(prepared.step, state)
        settled, tokens, done = to_host(_beam_prefix(state, nb))  # one transfer per step
        for b in np.flatnonzero(~finished):
            piece = ""
            for t in tokens[b, emitted_tokens[b] : int(settled[b])].tolist():
                if t not in eos:
                    piece += decoders[b].push(t)
            emitted_tokens[b] = max(emitted_tokens[b], int(settled[b]))
            if piece:
                emitted[b] += piece
                yield int(b), piece
            finished[b] = bool(done[b])
    out.state = state
    out.result = build_result(model, tokenizer, settings, prepared, state, None, prompt_lp)
    for b, text in enumerate(out.result.texts):
        if not text.startswith(emitted[b]):  # pragma: no cover - the settled prefix is kept
            raise AssertionError("beam search streamed text that the best hypothesis lacks")
        if len(text) > len(emitted[b]):
            yield b, text[len(emitted[b]) :]


def _pieces(model, tokenizer, settings, prepared, out: Stream):
    prompt_lp, state = start_prepared(prepared)
    if prepared.plan.num_beams:
        yield from _beam_pieces(model, tokenizer, settings, prepared, out, state, prompt_lp)
        return
    token_logprobs = repeat_rows(prepared.arrays.token_logprobs, prepared.plan.repeat)
    rows = prepared.rows
    decoders = [IncrementalDecoder(tokenizer) for _ in range(rows)]
    eos = set(settings.eos_token_id)
    strings = settings.stop_strings
    hold = max((len(x) for x in strings), default=1) - 1  # chars that may start a stop string
    texts, emitted = [""] * rows, [0] * rows
    finished = np.zeros(rows, bool)
    search = prepared.step.search
    width = search.num_tokens + 1 if isinstance(search, Speculative) else 1
    seen = np.array(to_host(state.length))[:rows]
    out.tokens_per_step = [[] for _ in range(rows)]
    while not finished.all():
        state = step_program(prepared.step.model.compiler_options)(prepared.step, state)
        last, length, done, reason = to_host(_last_tokens(state, width))  # one transfer per step
        for row in np.flatnonzero(~finished):
            why = FINISH_REASONS[int(reason[row])]
            is_done = bool(done[row]) or why != ""  # (a speculative row may settle one step later)
            new = int(length[row]) - int(seen[row])
            seen[row] = length[row]
            out.tokens_per_step[row].append(new)
            for i in range(width - new, width):
                token = int(last[row, i])
                if not (is_done and i == width - 1 and token in eos):
                    texts[row] += decoders[row].push(token)
            if is_done:
                finished[row] = True
                text = texts[row] + decoders[row].flush()
                if strings:
                    text = truncate_at_stop(text, strings)[0]
                if len(text) > emitted[row]:
                    yield row, text[emitted[row] :]
                texts[row], emitted[row] = text, len(text)
            elif len(texts[row]) - hold > emitted[row]:
                yield row, texts[row][emitted[row] : len(texts[row]) - hold]
                emitted[row] = len(texts[row]) - hold
    while not bool(np.all(to_host(state.done))):  # rows whose last token is still to be fed
        state = step_program(prepared.step.model.compiler_options)(prepared.step, state)
    out.state = state
    arrays = finish_generation(state, token_logprobs)
    out.result = build_result(model, tokenizer, settings, prepared, state, arrays, prompt_lp)
