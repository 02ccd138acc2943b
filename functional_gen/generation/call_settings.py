"""`Settings`: the one type for what a generation call decided, from a generation config or
from the whole call.

Two functions fill it, with the same fields:

- `functional_gen.generation.generation_config.settings_from_generation_config` translates a
  transformers `GenerationConfig` alone: its processors and sampler, lengths, EOS and pad ids,
  stop strings, `num_return_sequences`, `guidance_scale`; `step` is `None` and a length the
  config does not set is `None`.
- `functional_gen.generation.settings.resolve_settings` merges a call's `GenerationOptions` over
  such a config (the precedence is written there, once) and fills every field: the `Step` is
  built, `max_new_tokens` is set, and `processors`, `sampler`, `eos_token_id`, `pad_token_id`
  are the step's.
"""

import dataclasses

from .samplers import AbstractSampler
from .search import AbstractSearch
from .step import Step


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a generation config asks for, or what a generation call decided before compiling.

    **Attributes:**

    - `processors`: the logits processors, in order (a tuple).
    - `sampler`: the `AbstractSampler` or `AbstractSearch` that picks the tokens (`None`: not
      chosen, greedy).
    - `max_new_tokens`: tokens to generate per row, excluding what is already there (`None`:
      not set).
    - `max_length`: a config's total length including the prompt (`None`: not set); a resolved
      call has turned it into `max_new_tokens`.
    - `eos_token_id`: every token id that ends a row (a tuple; `None`: the model's).
    - `pad_token_id`: the id written after a row's end (`None`: the model's).
    - `stop_strings`: the stop texts (a tuple).
    - `num_return_sequences`: sequences per prompt.
    - `guidance_scale`: classifier-free guidance asked for by a config (a scale other than 1),
      else `None`.
    - `prefix_lm`, `prefill_mode`, `prompt_logprobs`: the call's prompt handling and outputs.
    - `carry_processor_states`: the call continues the processors of the state it was given.
    - `step`: the `Step` (model, processors, search, stop-string matcher, EOS and pad ids), or
      `None` before a call resolves it.
    """

    processors: tuple = ()
    sampler: AbstractSampler | AbstractSearch | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    eos_token_id: tuple[int, ...] | None = None
    pad_token_id: int | None = None
    stop_strings: tuple[str, ...] = ()
    num_return_sequences: int = 1
    guidance_scale: float | None = None
    prefix_lm: bool = False
    prefill_mode: str = "one_pass"
    prompt_logprobs: bool = False
    carry_processor_states: bool = False
    step: Step | None = None

    def with_step(self, step: Step) -> "Settings":
        """These settings with `step` and the fields it settles (`processors`, `sampler`,
        `eos_token_id`, `pad_token_id`) taken from it, so that they never disagree."""
        return dataclasses.replace(
            self,
            step=step,
            processors=step.processors,
            sampler=step.sampler,
            eos_token_id=step.eos_token_id,
            pad_token_id=step.pad_token_id,
        )
