"""What each slot of the `Engine` carries: a request (`Request`) and its sampling parameters as
per-row fields (`SlotParams`, applied by the `SlotDecoding` processor).
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .. import processors as P
from ..generation.options import SAMPLING_FIELDS, GenerationOptions
from ..generation.samplers import AbstractSampler, Greedy, Multinomial
from ..processors.base import AbstractStatelessLogitsProcessor, Context, per_row_field
from ..reductions import argmax


@dataclasses.dataclass(frozen=True)
class Resume:
    """How a preempted request continues (`serving.preemption.Preemptor.make_room`, vLLM's
    recompute preemption): what its slot held that the tokens alone do not give back.

    **Attributes:** `generated`: how many of the resumed `Request.token_ids` (the last ones) the
    request had generated (they count against its `max_new_tokens` and, for the penalties, as
    generated, not as prompt); `key_data`, `key_impl`: its slot's PRNG key
    (`jax.random.key_data` as ints, and the implementation's name), so that step `n` draws with
    `fold_in(key, n)` as before, a seed drawn at random included; `constraint_state`: its
    automaton state in the constraint pool (`SlotConstraint`; `INITIAL` when unconstrained),
    the state after the tokens it had generated.
    """

    generated: int
    key_data: tuple[int, ...]
    key_impl: str
    constraint_state: int


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation request as the engine sees it (host values, validated by `Engine.request`).

    **Attributes:** `token_ids` (the prompt), `max_new_tokens`, `temperature` (0 = greedy),
    `top_p` (1 = off), `min_p` (0 = off), `repetition_penalty` (1 = off), `presence_penalty`,
    `frequency_penalty` (0 = off; OpenAI's), `logit_bias` (token id -> bias added to its
    logit), `seed` (the key is `fold_in(jax.random.key(seed), 0)`; `None` draws one), `top_k`
    (0 = off; at most `MAX_TOP_K`), `stop_token_ids` (vLLM's: ids that end the request like an
    EOS, besides the model's; checked on the host, so a slot may decode up to `num_steps - 1`
    tokens past one, which are dropped); `resume`: `None` for a new request; a `Resume` for a
    preempted one queued again, whose `token_ids` are then its prompt followed by the
    `resume.generated` tokens it had generated (built by the engine, not by callers).
    """

    token_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    resume: Resume | None = None

    @property
    def prompt_length(self) -> int:
        """The prompt's tokens: `token_ids` less those generated before a preemption."""
        return len(self.token_ids) - (0 if self.resume is None else self.resume.generated)


def request_processors(request: Request) -> tuple[list, AbstractSampler]:
    """The processors and sampler `fg.generate` runs for `request` alone, in `SlotDecoding`'s
    order: `LogitBias`, `RepetitionPenalty`, `PresencePenalty`, `FrequencyPenalty`, then (when
    `temperature > 0`, with `Multinomial()`; else `Greedy()`) `Temperature`, `TopK`, `TopP`,
    `MinP`, each only where the request sets it."""
    processors = []
    if request.logit_bias:
        bias: dict[int, float] = {}
        for token, value in request.logit_bias:
            bias[token] = bias.get(token, 0.0) + value
        processors.append(P.LogitBias(bias))
    if request.repetition_penalty != 1:
        processors.append(P.RepetitionPenalty(request.repetition_penalty))
    if request.presence_penalty:
        processors.append(P.PresencePenalty(request.presence_penalty))
    if request.frequency_penalty:
        processors.append(P.FrequencyPenalty(request.frequency_penalty))
    if request.temperature <= 0:
        return processors, Greedy()
    if request.temperature != 1:
        processors.append(P.Temperature(request.temperature))
    if request.top_k > 0:
        processors.append(P.TopK(request.top_k))
    if request.top_p < 1:
        processors.append(P.TopP(request.top_p))
    if request.min_p > 0:
        processors.append(P.MinP(request.min_p))
    return processors, Multinomial()


MAX_TOP_K = 256
"""The largest per-slot `top_k`: the step takes the `MAX_TOP_K` largest logits of every row
(`lax.top_k`, static) and keeps those at least the row's `k`-th. Measured on the 2-core CPU,
8 rows of 49,152 logits: 1.2 ms per step at 256, 14 ms at 1,024, 309 ms for a full sort."""


def checked_request(
    token_ids: tuple[int, ...], max_new_tokens: int, vocab_size: int, sampling: dict
) -> Request:
    """The `Request` of a prompt's `token_ids` with the sampling parameters `sampling` (the
    fields of `Request`), checked and normalised (numbers as floats, `top_k=-1` as 0), for
    `Engine.request` (which checks the prompt and `max_new_tokens` against the engine first).

    **Raises:** `ValueError` naming the value: an unknown parameter, a knob out of range, a
    `top_k` outside `[0, MAX_TOP_K]`, `stop_token_ids` or a `logit_bias` id outside
    `[0, vocab_size)`, a bias outside `[-100, 100]`.
    """
    unknown = sorted(set(sampling) - {f.name for f in dataclasses.fields(Request)})
    if unknown:
        raise ValueError(f"unknown sampling parameters: {unknown}")
    knobs = dict(sampling)
    for name in (
        "temperature",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    ):
        if name in knobs:
            value = knobs[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"`{name}` must be a number, got {value!r}")
            knobs[name] = float(value)
    knobs["logit_bias"] = tuple((int(t), float(b)) for t, b in knobs.get("logit_bias", ()))
    top_k = knobs.get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not -1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"`top_k`={top_k!r} must be an integer in [0, {MAX_TOP_K}] (-1 = 0 = off)")
    knobs["top_k"] = max(top_k, 0)
    stop_ids = knobs.get("stop_token_ids", ())
    if isinstance(stop_ids, (str, bytes)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in stop_ids
    ):
        raise ValueError(f"`stop_token_ids`={stop_ids!r} must be token ids in [0, {vocab_size})")
    knobs["stop_token_ids"] = tuple(stop_ids)
    request = Request(token_ids, max_new_tokens, **knobs)
    checks = (
        ("temperature", request.temperature, 0.0, float("inf")),
        ("top_p", request.top_p, 0.0, 1.0),
        ("min_p", request.min_p, 0.0, 1.0),
        ("repetition_penalty", request.repetition_penalty, 1e-6, float("inf")),
        ("presence_penalty", request.presence_penalty, -2.0, 2.0),
        ("frequency_penalty", request.frequency_penalty, -2.0, 2.0),
    )
    for name, value, low, high in checks:
        if not (isinstance(value, (int, float)) and low <= value <= high) or (
            name == "top_p" and value == 0
        ):
            raise ValueError(f"`{name}`={value!r} is outside [{low}, {high}]")
    for token, bias in request.logit_bias:
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"logit_bias names token {token}, outside the vocabulary [0, {vocab_size})"
            )
        if not -100 <= bias <= 100:
            raise ValueError(f"logit_bias {bias} for token {token} is outside [-100, 100]")
    return request


SERVED_OPTIONS = frozenset(
    {
        "max_new_tokens",
        "stop_strings",
        "do_sample",
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "repetition_penalty",
        "chat_template",
        "prefill_mode",
    }
)
"""The `GenerationOptions` fields the serving engine reads (`Engine.request_from_options`)."""


def check_served_options(options: GenerationOptions) -> None:
    """**Raises:** `ValueError` naming every field of `options` set (not its default) that the
    engine does not serve (`typical_p`, beams, guidance, ...)."""
    defaults = GenerationOptions()
    unserved = [
        f.name
        for f in dataclasses.fields(options)
        if f.name not in SERVED_OPTIONS and getattr(options, f.name) != getattr(defaults, f.name)
    ]
    if unserved:
        raise ValueError(f"the serving engine does not support these options: {unserved}")


def request_knobs(options: GenerationOptions) -> tuple[dict, tuple[str, ...], int]:
    """`(sampling parameters for Engine.request, stop strings, max_new_tokens)` of `options`, as
    `generate` reads them: greedy unless a sampling field is set or `do_sample=True` (and then
    temperature 0 is greedy too), `max_new_tokens` 128 when unset."""
    sampled = options.do_sample
    if sampled is None:
        sampled = any(getattr(options, name) is not None for name in SAMPLING_FIELDS)
    temperature = options.temperature if options.temperature is not None else 1.0
    if not sampled or temperature == 0:
        knobs = {"temperature": 0.0}
    else:
        knobs = {
            "temperature": float(temperature),
            "top_p": 1.0 if options.top_p is None else float(options.top_p),
            "min_p": 0.0 if options.min_p is None else float(options.min_p),
            "top_k": 0 if options.top_k is None else options.top_k,
        }
    if options.repetition_penalty is not None:
        knobs["repetition_penalty"] = float(options.repetition_penalty)
    stops = options.stop_strings or ()
    stops = (stops,) if isinstance(stops, str) else tuple(stops)
    max_new = 128 if options.max_new_tokens is None else options.max_new_tokens
    return knobs, stops, max_new


class SlotParams(eqx.Module):
    """Sampling parameters of every slot (leading axis: the slots, `batch`; none in a `Prefix`).

    **Attributes:** `greedy: Bool[Array, "*batch"]`; `temperature`, `top_p`, `min_p`,
    `repetition_penalty`, `presence_penalty`, `frequency_penalty`: `Float[Array, "*batch"]`;
    `logit_bias: Float[Array, "*batch vocab"]` (added to the logits first); `top_k:
    Int[Array, "*batch"]` (0 = off).
    """

    greedy: Bool[Array, "*batch"]
    temperature: Float[Array, "*batch"]
    top_p: Float[Array, "*batch"]
    min_p: Float[Array, "*batch"]
    repetition_penalty: Float[Array, "*batch"]
    presence_penalty: Float[Array, "*batch"]
    frequency_penalty: Float[Array, "*batch"]
    logit_bias: Float[Array, "*batch vocab"]
    top_k: Int[Array, "*batch"]


# Templates whose (per-row) knob is replaced inside the jitted step (`eqx.tree_at` does not
# validate, so a traced value is fine); built once, with valid values.
_REPETITION = P.RepetitionPenalty(1.5)
_PRESENCE = P.PresencePenalty(0.5)
_FREQUENCY = P.FrequencyPenalty(0.5)
_TEMPERATURE = P.Temperature(0.5)
_TOP_P = P.TopP(0.5)
_MIN_P = P.MinP(0.5)


def _with(template, name: str, value):
    return eqx.tree_at(lambda p: getattr(p, name), template, value)


KNOBS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k",
         "top_p", "min_p")  # fmt: skip
"""The knobs of `SlotDecoding` in the order it applies them (the entries of `SlotDecoding.used`)."""


def knobs_used(params: SlotParams, busy: Bool[Array, " batch"]) -> Bool[Array, " 7"]:
    """For each of `KNOBS`, whether any `busy` slot of `params` sets it (`SlotDecoding.used`)."""
    sampled = ~params.greedy & busy
    return jnp.stack(
        [
            jnp.any(busy & (params.repetition_penalty != 1)),
            jnp.any(busy & (params.presence_penalty != 0)),
            jnp.any(busy & (params.frequency_penalty != 0)),
            jnp.any(sampled & (params.temperature != 1)),
            jnp.any(sampled & (params.top_k > 0)),
            jnp.any(sampled & (params.top_p < 1)),
            jnp.any(sampled & (params.min_p > 0)),
        ]
    )


class SlotSampler(AbstractSampler):
    """The engine's sampler: `Multinomial`'s draw (`reductions.categorical`'s inverse
    transform sampling, with the row's key) when some busy slot samples, else `Greedy`'s largest logit (`reductions.argmax`: XLA's
    CPU `jnp.argmax` is an unvectorized variadic reduce, 0.90 against 0.20 ms over 8 x 49,152
    logits), chosen for the whole batch by a `lax.cond` on `sampled`.

    `SlotDecoding` leaves a greedy row only its largest logit, so both branches give a greedy row
    the same token and a sampled row is drawn exactly as `Multinomial` draws it; the switch only
    skips the draw's block sums and random bits when no busy slot needs them (it was written for
    the Gumbel-max draw of 8 x 49,152 random numbers, ~6-8 ms a step on the 2-core CPU; the
    inverse-transform draw that replaced it costs ~0.6 ms, so the switch now saves little).

    **Attributes:** `sampled: Bool[Array, ""]`, shared by all rows (not vmapped): whether some
    busy slot samples (`temperature > 0`).

    Source: `Multinomial` (inverse transform sampling, as `torch.multinomial`) and `Greedy`.
    """

    sampled: Bool[Array, ""]

    def __call__(self, logits: Float[Array, " vocab"], *, key) -> Int[Array, ""]:
        return jax.lax.cond(
            self.sampled,
            lambda x, k: Multinomial()(x, key=k),
            lambda x, k: Greedy()(x, key=k),
            logits,
            key,
        )

    @property
    def needs_key(self) -> bool:
        """`True`: a sampled slot draws with its key."""
        return True


class SlotDecoding(AbstractStatelessLogitsProcessor):
    """The processors of a slot, with every knob per row: logit bias, `RepetitionPenalty`,
    `PresencePenalty`, `FrequencyPenalty`, then (sampled rows) `Temperature`, `TopK`, `TopP`, `MinP`,
    in the order `generate` builds them from a generation config. A knob at its neutral value
    leaves the logits exactly as they are (each processor is selected per row, not applied), so
    a slot computes what `generate` with only that request's options computes. A greedy row
    keeps only its largest logit (the first on ties), so `Multinomial` draws it: `Greedy`'s token.

    **Attributes:** the fields of `SlotParams`, one value per row; `used`: `Bool[Array, " 7"]`,
    shared by all rows, or `None` (all true): per knob of `KNOBS`, whether any row sets it
    (`knobs_used`). A knob no row sets is skipped for the whole batch (a `lax.cond`, not a
    per-row select): a batch of greedy requests runs no sort, no `top_k`, no softmax. A row's
    result does not depend on it (a row that does not set a knob is left as it is either way).

    Source: transformers' `LogitsProcessorList` order; OpenAI's `presence_penalty`,
    `frequency_penalty`, `logit_bias`.
    """

    greedy: Bool[Array, "*rows"] = per_row_field()
    temperature: Float[Array, "*rows"] = per_row_field()
    top_p: Float[Array, "*rows"] = per_row_field()
    min_p: Float[Array, "*rows"] = per_row_field()
    repetition_penalty: Float[Array, "*rows"] = per_row_field()
    presence_penalty: Float[Array, "*rows"] = per_row_field()
    frequency_penalty: Float[Array, "*rows"] = per_row_field()
    logit_bias: Float[Array, "*rows vocab"] = per_row_field(row_ndim=1)
    top_k: Int[Array, "*rows"] = per_row_field()
    used: Bool[Array, " 7"] | None = None

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        def when(knob, fn, x):  # fn(x) if some row of the batch sets `knob`, else x
            if self.used is None:
                return fn(x)
            return jax.lax.cond(self.used[KNOBS.index(knob)], fn, lambda x: x, x)

        def apply(on, template, name, value, x):
            return when(
                name, lambda x: jnp.where(on, _with(template, name, value)(x, context), x), x
            )

        def top_k(x):
            # TopK with a per-row k: the k-th largest of the MAX_TOP_K largest (what TopK's
            # `kth_largest` gives for this k), without a full sort
            largest = jax.lax.top_k(x, min(MAX_TOP_K, x.shape[-1]))[0]
            kth = jnp.min(jnp.where(jnp.arange(largest.shape[0]) < self.top_k, largest, jnp.inf))
            return jnp.where(sampled & (self.top_k > 0) & (x < kth), -jnp.inf, x)

        x = logits + self.logit_bias
        x = apply(
            self.repetition_penalty != 1,
            _REPETITION,
            "repetition_penalty",
            self.repetition_penalty,
            x,
        )
        x = apply(
            self.presence_penalty != 0, _PRESENCE, "presence_penalty", self.presence_penalty, x
        )
        x = apply(
            self.frequency_penalty != 0, _FREQUENCY, "frequency_penalty", self.frequency_penalty, x
        )
        sampled = ~self.greedy
        x = apply(
            sampled & (self.temperature != 1),
            _TEMPERATURE,
            "temperature",
            jnp.where(self.temperature > 0, self.temperature, 1.0),
            x,
        )
        x = when("top_k", top_k, x)
        x = apply(sampled & (self.top_p < 1), _TOP_P, "top_p", self.top_p, x)
        x = apply(sampled & (self.min_p > 0), _MIN_P, "min_p", self.min_p, x)
        best = jnp.arange(x.shape[-1]) == argmax(x, axis=-1)
        return jnp.where(self.greedy & ~best, -jnp.inf, x)
