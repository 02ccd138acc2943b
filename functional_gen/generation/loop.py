"""`generate`: resolve the options, plan the call, run the compiled program, build the result.

    prompts --tokenizer--> token ids  (or a SequenceState to continue)
      -> planning (`plan_call`): ONE resolver turns the call's `GenerationOptions` into
         `Settings` (the Step); rows, pending tokens and capacities padded to buckets
      -> program (`run_generation`): prefill, ONE model call over every token the cache does
         not hold yet, then the step inside jax.lax.while_loop until every row has finished
         (EOS, stop string, constraint or max_new_tokens)
      -> result (`build_result`): texts, token_ids, logprobs, finish_reasons, a SequenceState

Shapes decide compilation: see `functional_gen.generation.buckets`.
"""

from collections.abc import Sequence
from typing import Any

from jaxtyping import Array, Key

from ..models.base import AbstractCausalLM
from ..tokenization import Prompt
from .options import GenerationOptions
from .planning import plan_call as plan_call
from .program import run_prepared
from .result import GenerationResult, build_result
from .samplers import AbstractSampler
from .search import AbstractSearch
from .sequence_state import SequenceState
from .state import GenerationState


def generate(
    model: AbstractCausalLM,
    tokenizer,
    prompts: Prompt | Sequence[Prompt] | SequenceState,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    **overrides: Any,
) -> GenerationResult:
    """Generate text for a batch of prompts, or continue a `SequenceState`.

    **Arguments:**

    - `model`: an `AbstractCausalLM`, e.g. from `functional_gen.load_model`.
    - `tokenizer`: its transformers tokenizer.
    - `prompts`: a prompt or a list of prompts (raw text `str`, or a chat: a list of
      `{"role", "content"}` messages, rendered with the tokenizer's chat template); or a
      `SequenceState` (e.g. `result.state`, `state + " more text"`) to continue: every row goes
      on from its last token, an EOS included, and only the tokens its cache lacks are prefilled.
    - `options`: a `GenerationOptions`, every per-call choice (`max_new_tokens`,
      `temperature`, `top_p`, `eos_token_id`, `stop_strings`, `num_return_sequences`,
      `top_logprobs`, `guidance_scale`, ...; see its docstring); default none set.
    - `processors`: logits processors (`functional_gen.processors`) or plain functions
      `fn(logits, context) -> logits`, applied in order (after those of an explicitly passed
      generation config or of decoding options). Continuing a state without `processors` and
      `sampler` continues the previous call's processors, with their states.
    - `sampler`: `functional_gen.samplers.Greedy()`, `Multinomial()` or `BeamSearch(...)` (any
      `AbstractSampler` or `AbstractSearch`); default from the options or the generation config
      (`do_sample`, `num_beams`), else greedy.
    - `key`: PRNG key (keyword-only), required by random samplers; row `r` uses
      `fold_in(key, r)`. A continued state without `key` keeps its rows' keys.
    - `**overrides`: any `GenerationOptions` field as a keyword (`max_new_tokens=32`,
      `stop_strings=["\\n"]`, `guidance_scale=1.5`, `generation_config=...`, ...); a keyword
      wins over the same field of `options` (one given as `None` leaves it as it is). See
      `functional_gen.generation.settings` for the precedence over the generation config.

    **Returns:** a `GenerationResult` whose `state` is the `SequenceState` after this call.

    **Raises:** `ValueError` for a random sampler without `key`, bad prompts, a non-positive
    `max_new_tokens`, rows too long for the model, or an unsupported generation config;
    `ModelMismatchError` for a state made by another model; `TypeError` for bad processors or
    an unknown keyword (named).
    """
    result, _ = generate_with_final_state(
        model, tokenizer, prompts, options, processors=processors, sampler=sampler, key=key,
        **overrides,
    )  # fmt: skip
    return result


def generate_with_final_state(
    model: AbstractCausalLM,
    tokenizer,
    prompts: Prompt | Sequence[Prompt] | SequenceState,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    **overrides: Any,
) -> tuple[GenerationResult, GenerationState]:
    """`generate`, returning besides its `GenerationResult` the final `GenerationState` of the
    same compiled run: every loop row (padding rows after the real ones) and the search's carry
    (`search_state`; under speculative decoding a `SpeculativeState` whose `proposed`,
    `accepted` and `steps` count, per row, the guesses verified, the guesses accepted and the
    verification steps). One run, so the counts belong to exactly the tokens of the result.

    **Arguments**, **Raises:** as `generate`.
    """
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
    final, arrays, prompt_lp = run_prepared(prepared)
    if tokenizer is None and isinstance(prompts, SequenceState):
        tokenizer = prompts.tokenizer
    result = build_result(model, tokenizer, settings, prepared, final, arrays, prompt_lp)
    return result, final
