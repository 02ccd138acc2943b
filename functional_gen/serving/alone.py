"""A request run on its own, off the slots, through `fg.generate` (`run_alone`): how the engine
serves a constrained request whose tables do not fit its constraint pool (`Engine.generate_alone`,
`serving.pool`: pushdown automata, tables larger than the pool).
"""

import os

import jax
import numpy as np

from ..generation.loop import generate as generate_call
from ..generation.sequence_state import SequenceState
from .slots import Request, request_processors


def run_alone(
    model, tokenizer, request: Request, constraint, top_logprobs: int
) -> tuple[list[int], list[float], list, str]:
    """`request` generated alone by `model` with `constraint` (a structured-generation
    processor, e.g. `fg.processors.Regex`) through `fg.generate`, whose processors are
    `[constraint]` then the request's knobs in `SlotDecoding`'s order (`request_processors`),
    sampled with the request's seed (a random one when it has none), reporting `top_logprobs`
    alternatives per token.

    **Returns:** `(token_ids, logprobs, top_logprobs, finish_reason)` (a `FINISH_REASONS`
    name), as `Engine.generate_alone` returns them."""
    processors, sampler = request_processors(request)
    processors = [constraint, *processors]
    seed = request.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    state = SequenceState.from_token_ids(
        [list(request.token_ids)], vocab_size=model.vocab_size, tokenizer=tokenizer
    )
    result = generate_call(
        model,
        tokenizer,
        state,
        processors=processors,
        sampler=sampler,
        key=jax.random.key(seed),
        max_new_tokens=request.max_new_tokens,
        top_logprobs=top_logprobs,
        logprobs_mode="raw",
    )
    n = int(result.state.arrays.length[0]) - len(request.token_ids)
    ids = [int(t) for t in np.asarray(result.token_ids[0, :n])]
    lps = [float(x) for x in np.asarray(result.logprobs[0, :n])]
    tops = [[] for _ in range(n)]
    if top_logprobs:
        top_ids, top_lps = (
            np.asarray(result.top_token_ids[0]),
            np.asarray(result.top_logprobs[0]),
        )
        tops = [list(zip(top_ids[j].tolist(), top_lps[j].tolist())) for j in range(n)]
    return ids, lps, tops, result.finish_reasons[0]
