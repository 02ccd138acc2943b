"""`make_step`: one pure generation step, `GenerationState -> GenerationState`.

A step holds what every search needs (the model, the processors, the stop-string matcher, the
EOS and pad ids) and its search (`functional_gen.generation.search`): `Sample(sampler)` processes
the pending logits (processors vmapped per row), samples one token per row, appends it, updates
the finished flags (EOS, `max_new_tokens`), and runs the model on the new tokens (decode) to get
the next logits; `BeamSearch` does the same for groups of beams. A step does no host work, so
`generate` runs it inside one jitted `jax.lax.while_loop`, and `stream` calls it from Python one
token at a time.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx

from ..models.base import AbstractCausalLM
from ..processors.base import AbstractLogitsProcessor, as_processors
from .samplers import AbstractSampler, Greedy
from .sampling import Sample
from .search import AbstractSearch
from .state import GenerationState
from .stop_strings import StopStrings


class Step(eqx.Module):
    """A generation step as a pytree (build it with `make_step`).

    Being a module, its arrays (model weights, float knobs of processors) are ordinary jit
    arguments, not constants baked into the compiled program: `eqx.filter_jit(step)(state)`
    compiles once and reuses the program for new weights or new temperatures.

    **Attributes:** `model` (an `AbstractCausalLM`), `processors` (a tuple), `search` (an
    `AbstractSearch`: `Sample(sampler)` or `BeamSearch`), `stop_strings` (a `StopStrings` or `None`), `eos_token_id` (static tuple: every token id that
    ends a row), `pad_token_id` (static: written after a row ends), `top_logprobs` (static:
    how many most likely alternatives to record per token, 0 for none), `logprobs_mode` (static:
    `"processed"`, the distribution after the processors that the token was drawn from, or
    `"raw"`, the model's own, as vLLM's `logprobs_mode`).
    """

    model: AbstractCausalLM
    processors: tuple[AbstractLogitsProcessor, ...]
    search: AbstractSearch
    stop_strings: StopStrings | None
    eos_token_id: tuple[int, ...] = eqx.field(static=True)
    pad_token_id: int = eqx.field(static=True)
    top_logprobs: int = eqx.field(static=True, default=0)
    logprobs_mode: str = eqx.field(static=True, default="processed")

    def __call__(self, state: GenerationState) -> GenerationState:
        """Advance every unfinished row by one token; finished rows are left unchanged.

        A row finishes on an EOS token (`"eos"`, the EOS kept as its last token), when its
        generated text contains a stop string (`"stop_string"`), on reaching
        `max_new_tokens` (`"length"`), or when the processors leave no token possible, every
        logit `-inf` (`"constraint"`; no token is appended, so nothing is sampled from an empty
        distribution and no NaN appears).

        **Arguments:** `state`, a `GenerationState` (from `init_state` or a previous step).

        **Returns:** the next `GenerationState`, with the same tree structure, shapes and dtypes.
        """
        return self.search(self, state)

    @property
    def sampler(self) -> AbstractSampler | AbstractSearch:
        """What `make_step` was given as `sampler`: the search's declared `sampler`
        (`AbstractSearch.sampler`: `Sample`'s sampler, or `BeamSearch` itself), so no search type
        is singled out here."""
        return self.search.sampler


def make_step(
    model: AbstractCausalLM,
    processors: Sequence[Any] | None = (),
    sampler: AbstractSampler | AbstractSearch | None = None,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    top_logprobs: int = 0,
    logprobs_mode: str = "processed",
) -> Step:
    """Build the pure step function `step(state) -> state` of a generation.

    **Arguments:**

    - `model`: an `AbstractCausalLM` (e.g. `functional_gen.models.LlamaForCausalLM`).
    - `processors`: logits processors (or plain functions, wrapped in `Stateless`), applied in
      order to each row's logits.
    - `sampler`: picks the token from the processed logits; default `Greedy()`. A search
      (`functional_gen.samplers.BeamSearch(...)`, any `AbstractSearch`) is used as the step's
      search; a sampler becomes `Sample(sampler)`.
    - `eos_token_id`: token id(s) that end a row; default: all of `model.eos_token_id`.
    - `pad_token_id`: id written after a row ends; default: the model's pad id, else its first
      EOS id, else 0.
    - `stop_strings`: a `StopStrings` matcher (`StopStrings.build(strings, tokenizer, vocab)`),
      or `None`.
    - `top_logprobs`: record the `k` most likely tokens and their logprobs at every step.
    - `logprobs_mode`: `"processed"` (default) or `"raw"` (see `Step`).

    **Returns:** a `Step` module; call it as `step(state)`.

    **Raises:** `TypeError` for a model that is not an `AbstractCausalLM`, a processor entry
    that is neither a processor nor callable, or a sampler that is not an `AbstractSampler`;
    `ValueError` for a negative `top_logprobs` or an unknown `logprobs_mode`.
    """
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
        raise ValueError(f"`top_logprobs` must be a non-negative integer, got {top_logprobs!r}")
    if top_logprobs > model.vocab_size:
        raise ValueError(
            f"`top_logprobs`={top_logprobs} exceeds the vocabulary size {model.vocab_size}"
        )
    if logprobs_mode not in ("processed", "raw"):
        raise ValueError(f"`logprobs_mode` must be 'processed' or 'raw', got {logprobs_mode!r}")
    if not isinstance(model, AbstractCausalLM):
        raise TypeError(
            "`model` must implement functional_gen.models.AbstractCausalLM (e.g. a model from "
            f"functional_gen.load_model), got {type(model).__name__}"
        )
    if sampler is None:
        sampler = Greedy()
    if not isinstance(sampler, (AbstractSampler, AbstractSearch)):
        raise TypeError(
            f"`sampler` must be a functional_gen.samplers sampler (e.g. Greedy(), Multinomial()), "
            f"got {type(sampler).__name__}"
        )
    if eos_token_id is None:
        eos_token_id = model.eos_token_id
    elif isinstance(eos_token_id, int):
        eos_token_id = (eos_token_id,)
    eos_token_id = tuple(int(i) for i in eos_token_id)
    if pad_token_id is None:
        pad_token_id = model.pad_token_id
        if pad_token_id is None:
            pad_token_id = eos_token_id[0] if eos_token_id else 0
    return Step(
        model=model,
        processors=as_processors(processors),
        search=as_search(sampler),
        stop_strings=stop_strings,
        eos_token_id=eos_token_id,
        pad_token_id=int(pad_token_id),
        top_logprobs=top_logprobs,
        logprobs_mode=logprobs_mode,
    )


def as_search(sampler: AbstractSampler | AbstractSearch) -> AbstractSearch:
    """The search of a `sampler` argument: a search as it is, a sampler as `Sample(sampler)`."""
    return sampler if isinstance(sampler, AbstractSearch) else Sample(sampler)
