"""`Engine`: continuous batching from the pure generation state (JetStream's three functions).

    request --prefill--> Prefix  (one prompt's KVCache, next-token logits, sampling parameters)
    Prefix --insert(prefix, decode_state, slot)--> decode_state   (the slot's row overwritten)
    decode_state --generate(decode_state, num_steps)--> (decode_state, token_ids[num_steps, slots])

The decode state is a `GenerationState` over `max_slots` rows plus each slot's sampling
parameters (`SlotParams`), so one compiled step serves requests with different temperatures,
`top_p`, `min_p`, penalties, logit biases, seeds and `max_new_tokens`. All three functions are
jitted and donate the decode state (its `KVCache` is updated in place); the pure programs behind
them live in `functional_gen.serving.programs`.

**Per-slot constraints.** The decode state also holds a constraint table pool (`serving.pool`):
each slot's token automaton, padded to one fixed shape, written by `place` after `insert`, so a
regex, a choice or a JSON Schema compiled as a token automaton decodes in its slot beside the
others with the step compiled once. A constraint that does not fit (pushdown automata, larger
tables) runs alone through `generate_alone`.

**Lockstep slots.** All slots share ONE cache write index (`KVCache.length`, as the rows of a
left-padded `generate` batch do), so a decode step is one batched model call, the code path of
`generate`'s decode: every row writes its new token at the shared index, with its own RoPE
position (`-1` for an idle or finished slot, masked out). `insert` places a prompt's keys and
values so that they END at the shared index (right-aligned; the row's other slots get position
-1), moving the index forward first if the prompt is wider than it. The index advances one slot
per step for every row, so it reaches the end of the cache; before a dispatch, `generate`
compacts the cache (`compact`: every row shifted left by the number of leading slots no busy
slot uses any more) when the dispatch would not fit, or when compacting lets attention read a
shorter static length (`models.attention.attention_lengths`). Ring layers (sliding windows) are
addressed by position, per row, and are not moved. A row attends only to its own positions, so
its tokens do not depend on its slot or its neighbours (batch invariance; only the slot offset
of its keys changes, which can move float rounding, never the masking).

**Paged KV cache.** `Engine(block_size=...)` replaces the lockstep cache with blocks in one
pool per layer, a block table per slot and prefix caching (`serving.paged`, `serving.blocks`,
after vLLM): no shared write index and no compaction; `admit` takes a request's blocks before
its prefill and `release` returns them. With `preemption` (the default), blocks follow the
tokens in use: a request is admitted on its prompt's blocks, takes decode blocks as it grows,
and `make_room` (before each dispatch) preempts the most recently admitted requests when the
pool runs out, handing back the requests to queue again (vLLM's recompute preemption,
`serving.preemption`). With `speculative` as well, each dispatch speculates over the gathered
blocks and scatters back only the kept tokens (`serving.paged_speculative`).

**Shapes.** Prompts are left-padded to `bucket_length` (as `generate` pads them, so the prefill
computes the same logits), prompts longer than `prefill_chunk` are prefilled in chunks of
`prefill_chunk` tokens (`prefill_chunks`, so a long prompt does not hold up the other streams
for its whole prefill); with a paged cache they go straight into the slot's blocks, each chunk
inside the next decode dispatch while other slots decode (`block_prefill`, `mixed_prefill`,
docs/serving.md "Chunked prefill mixed with decode"). After `precompile()`, no request shape
compiles anything new.

**Seeds.** A request with `seed=s` samples with the key `fold_in(jax.random.key(s), 0)`: the key
`generate(..., key=jax.random.key(s))` gives its first row, so a one-prompt `generate` call and the
engine draw the same tokens.
"""

import time
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..generation.buckets import bucket_length
from ..generation.options import GenerationOptions
from ..generation.state import GenerationState
from ..models.attention import attention_lengths
from ..models.base import AbstractCausalLM
from ..sharding import check_mesh, mesh_of, shard
from ..structured.automaton import INITIAL
from ..tokenization import Prompt, encode_prompt
from .alone import run_alone
from .blocks import Admission
from .mesh import check_engine_mesh, place_decode_state, place_proposer
from .orchestrator import Error, Finished, Orchestrator
from .paged import BlockPrefill, PagedDecodeState, PagedKV
from .paged_speculative import SpeculativePagedKV
from .phases import PhaseTimer
from .pool import (
    DEFAULT_POOL_CLASSES,
    DEFAULT_POOL_STATES,
    ConstraintPool,
    PoolEntry,
    pool_entry,
)
from .precompile import precompile as precompile_jobs
from .preemption import Preemption as Preemption, Preemptor
from .programs import (
    DecodeState as DecodeState,
    Prefix as Prefix,
    StepOutput as StepOutput,
    chunked_prefill,
    compact_jit,
    free_jit,
    generate_jit,
    insert_jit,
    layout_jit,
    make_prefix,
    narrow_jit,
    place_jit,
    prefill_jit,
    widen_jit,
)
from .slots import (
    Request as Request,
    SlotDecoding as SlotDecoding,
    SlotParams as SlotParams,
    check_served_options,
    checked_request,
    request_knobs,
)
from .speculative import (
    EngineSpeculation,
    generate_jit as speculative_generate_jit,
    reset_jit,
    squeeze_jit,
)
from .weights import with_prefill_copy
from .widths import checked_decode_widths, default_decode_widths as default_decode_widths

DEFAULT_NUM_STEPS = 4
"""Decode steps per `generate` dispatch (the host sees new tokens every `num_steps` steps).

Measured with `benchmarks/bench_num_steps.py` at 8 busy slots, `max_len=256`, 64 tokens per slot
(output tokens/s over all slots; "gap": the wall time of one dispatch, i.e. the pause a client
sees between two bursts of tokens):

| num_steps | 1 | 2 | 4 | 8 | 16 |
|---|---|---|---|---|---|
| H200, SmolLM2-135M shape (random weights): tokens/s | 1,756 | 2,260 | 3,150 | 3,137 | 3,734 |
| H200: gap (ms) | 4.5 | 7.0 | 10.1 | 20.3 | 34.2 |
| 2-core CPU, SmolLM2-135M, 32 tokens per slot: tokens/s | 34.7 | 43.5 | 40.0 | 43.9 | 42.5 |
| CPU: gap (ms) | 231 | 368 | 800 | 1,459 | 3,014 |

The CPU was shared by 7 jobs (load average ~12), so only ratios mean something there: a step
(~185 ms) dwarfs the host round trip, and beyond 1 step per dispatch the count makes no
difference the noise lets one see. On the accelerator the round trip per dispatch dominates a
~2.5 ms step: 4 steps reach 8's throughput (1.8x one step) with half its gap, and 16 add 19% at
3.4x the gap. 4 also bounds what a finished, stopped (stop string, `stop_token_ids`) or
cancelled request decodes past its end to 3 steps, and how long a new request waits for a
dispatch to end before its `insert`."""

COMPACTION_MIN_STEPS = 16
"""`generate` compacts the cache to let attention read a shorter static length only when that
length then lasts at least this many more steps. A compaction copies the live slots of the cache
(`programs._compact`; 8 slots x 512 of SmolLM2 on the loaded 2-core CPU: 13 ms for 120 live
slots, 68 ms for 256), about 0.2-1 decode step, and reading 256 fewer slots saves ~10% of a
step (8 slots, the same CPU: 52.6 ms of CPU time per step reading 128 slots, 58.6 reading 256):
it pays back within a few steps. (It was 64 while a compaction copied the whole cache three
times, 0.25-0.35 s.)"""


DEFAULT_PREFILL_CHUNK = 256
"""Prompts longer than this are prefilled in chunks of this many tokens."""


class Engine:
    """A continuous-batching engine over `max_slots` slots (JetStream's `prefill` / `insert` /
    `generate`), and an `async` streaming API through its orchestrator (`stream`).

    **Arguments:**

    - `model`, `tokenizer`: from `functional_gen.load_model`.
    - `max_slots`: requests decoded together (the batch of the decode step).
    - `max_len`: tokens per slot, prompt (padded to its bucket) plus `max_new_tokens`; longer
      requests are refused.
    - `num_steps`: decode steps per `generate` dispatch (`DEFAULT_NUM_STEPS`).
    - `prefill_chunk`: prompts longer than this are prefilled in chunks (`DEFAULT_PREFILL_CHUNK`).
    - `top_logprobs`: how many most likely alternatives each step reports (static; 0 = none).
    - `constraint_states`, `constraint_classes`: the shape of each slot's constraint tables in
      the pool (`serving.pool`; `DEFAULT_POOL_STATES`, `DEFAULT_POOL_CLASSES`); a constraint
      with larger tables runs alone (`generate_alone`).
    - `prefill_copy`: for a model with int8-block weights (`quantization="int8"`), keep a
      bfloat16 copy of its layer matrices for prefills (`serving.weights.with_prefill_copy`:
      the same logits, no dequantization per prompt; +2 bytes per layer weight); `self.model`
      is then that model. Ignored for other models.
    - `decode_widths`: the batch widths of the compiled decode programs. A dispatch whose busy
      slots fit in a narrower width than `max_slots` gathers them into a state of that width,
      runs its program and writes them back (`default_decode_widths`: why and what it costs).
      `max_slots` is always one of them; `()` runs every dispatch at `max_slots`. Default:
      `default_decode_widths(max_slots)` (8 slots: 1, 2, 4).
    - `kv_cache_dtype`: the dtype of the slots' `KVCache` (`"float32"`, `"bfloat16"`, a jnp
      dtype, or `"auto"`: bfloat16 on a GPU, float32 elsewhere); `None` (default): the model's
      own (`model.kv_cache_dtype`, set by `load_model`). `self.model` makes its caches in it.
    - `block_size`: `None` (default): the lockstep cache above, `max_len` keys and values per
      slot. An integer: a paged KV cache of blocks of this many tokens (`serving.paged`,
      `serving.blocks`, after vLLM): blocks are taken as a request grows and returned when it
      ends, full prompt blocks are shared between requests with the same prefix (prefix
      caching), and an admission that cannot get blocks waits (`admit`). Every dispatch then
      runs at `max_slots` (no narrower `decode_widths`), with no compaction.
    - `num_blocks`: blocks in the paged pool (only with `block_size`; default: enough for every
      slot's `max_len`).
    - `preemption`: only with `block_size`. `True` (the default there): a request is admitted
      when its prompt's blocks and one dispatch of growth fit beside the next dispatch of every
      request already holding blocks, takes decode blocks as it grows, and when the pool runs
      out `make_room` preempts the most recently admitted request and hands it back to be
      queued again and recomputed over its prompt and generated tokens, continuing with the
      same tokens (vLLM's recompute preemption; `serving.preemption`). So a pool smaller than
      `max_slots x max_len` serves as many requests as their actual lengths fit, not as many
      as their worst cases fit; with the default `num_blocks` every slot's worst case fits and
      nothing is ever preempted, so the default changes nothing there. `False`: each admission
      reserves its worst case (prompt plus `max_new_tokens`) and waits until it fits, never
      preempted (`generate` needs no `make_room`).
    - `speculative`: `None` (default): one token per slot per step. A proposer
      (`fg.speculative.PromptLookup`, `DraftModel`, `EarlyExit`): speculative decoding in every
      decode step, each slot accepting its own run of guesses (`serving.speculative`), lossless
      as in `fg.generate(..., speculative=...)`. With `block_size` too (only the kept guesses'
      keys reach the blocks, `serving.paged_speculative`; with `mixed_prefill` as well). Every
      dispatch then runs at `max_slots` (no narrower `decode_widths`), and constrained requests
      run alone (`generate_alone`, without speculation).
    - `mesh`: `None` (default): the mesh the model's weights are on (`fg.shard`,
      `fg.load_model(..., mesh=...)`), or one device for an unsharded model. A `("data",
      "model")` `jax.sharding.Mesh` (`fg.make_mesh`): the model is placed on it (`fg.shard`).
      On a mesh the decode state has its slots over `"data"` and the cache's key/value heads
      over `"model"`, and every program keeps that layout (`serving.mesh`); tokens equal one
      device's. With `speculative` as well (a `DraftModel`'s draft is placed on the mesh as the
      target is; its cache rows go over `"data"` with the slots).
    - `mixed_prefill`: with `block_size`, a prompt whose uncached part is longer than
      `prefill_chunk` is prefilled chunk by chunk straight into its slot's blocks, each chunk
      inside the next decode dispatch while other slots decode (ONE compiled program, vLLM's
      chunked prefill; `block_prefill`, `serving.paged.BlockPrefill`), on its own while none
      does. Default `True`; `False` prefills it into a row of its own between dispatches, as the
      lockstep engine always does (it has no fixed-shape place for a chunk in its state). The
      tokens are the same either way, with `speculative` too (the chunk, then the speculative
      steps, `serving.paged_speculative`).

    **Raises:** `ValueError` for a non-positive `max_slots`, `max_len` or `num_steps`, a
    `mixed_prefill` or `preemption` that is not a bool (or a `preemption` without
    `block_size`), a
    `max_len` beyond the model's context, a `decode_widths` entry that is not an integer in
    `[1, max_slots]`, an unsupported `kv_cache_dtype` (see
    `AbstractCausalLM.with_kv_cache_dtype`), or a proposer the model cannot use (see `generation.speculative.speculative_search`); on a mesh, `max_slots`
    not divisible by its `"data"` axis, or the model's (or a draft model's) attention heads not
    divisible by its `"model"` axis (`serving.mesh.check_engine_mesh`); `TypeError` for a
    `speculative` that is
    not a proposer, or a `mesh` that is not a `jax.sharding.Mesh`.
    """

    def __init__(
        self,
        model: AbstractCausalLM,
        tokenizer,
        max_slots: int = 8,
        *,
        max_len: int = 1024,
        num_steps: int = DEFAULT_NUM_STEPS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        top_logprobs: int = 0,
        constraint_states: int = DEFAULT_POOL_STATES,
        constraint_classes: int = DEFAULT_POOL_CLASSES,
        prefill_copy: bool = True,
        decode_widths: Sequence[int] | None = None,
        kv_cache_dtype=None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        speculative=None,
        mesh=None,
        mixed_prefill: bool = True,
        preemption: bool | None = None,
    ):
        if not isinstance(mixed_prefill, bool):
            raise ValueError(f"`mixed_prefill` must be True or False, got {mixed_prefill!r}")
        if preemption is not None and not isinstance(preemption, bool):
            raise ValueError(f"`preemption` must be True or False, got {preemption!r}")
        if block_size is None and preemption is not None:
            raise ValueError(
                f"`preemption`={preemption!r} needs a `block_size` (a paged cache; the lockstep "
                "cache gives every slot its `max_len`)"
            )
        if mesh is not None:
            check_mesh(mesh)
        if block_size is None and num_blocks is not None:
            raise ValueError(f"`num_blocks`={num_blocks!r} needs a `block_size` (a paged cache)")
        if kv_cache_dtype is not None:
            model = model.with_kv_cache_dtype(kv_cache_dtype)
        for name, value in (
            ("max_slots", max_slots),
            ("constraint_states", constraint_states),
            ("constraint_classes", constraint_classes),
            ("max_len", max_len),
            ("num_steps", num_steps),
            ("prefill_chunk", prefill_chunk),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if mesh is None:
            mesh = mesh_of(model)
        if mesh is not None:
            check_engine_mesh(mesh, model, max_slots, speculative)
            if mesh_of(model) != mesh:
                model = shard(model, mesh)
            speculative = place_proposer(speculative, mesh)
        self.mesh = mesh
        """The `("data", "model")` mesh the engine runs on (`mesh`, or that of a model sharded
        with `fg.shard`), or `None` on one device."""
        limit = model.max_position_embeddings
        if limit is not None and max_len > limit:
            raise ValueError(
                f"`max_len`={max_len} is longer than the model's context "
                f"(max_position_embeddings={limit})"
            )
        self.decode_widths = checked_decode_widths(decode_widths, max_slots)
        """The batch widths of the decode programs, ascending, ending with `max_slots`."""
        self.model = with_prefill_copy(model) if prefill_copy else model
        self.tokenizer = tokenizer
        self.max_slots = max_slots
        self.max_len = max_len
        self.num_steps = num_steps
        self.prefill_chunk = prefill_chunk
        self.mixed_prefill = mixed_prefill
        self.constraint_states = constraint_states
        self.constraint_classes = constraint_classes
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
            raise ValueError(f"`top_logprobs` must be a non-negative integer, got {top_logprobs!r}")
        self.top_logprobs = top_logprobs
        eos = list(model.eos_token_id)
        config = model.generation_config
        config_eos = getattr(config, "eos_token_id", None) if config is not None else None
        if config_eos is not None:
            eos = [config_eos] if isinstance(config_eos, int) else list(config_eos)
        self.eos_token_id = tuple(int(i) for i in eos)
        pad = model.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (eos[0] if eos else 0))
        self._orchestrator = None
        self.compactions = 0
        """How many times `generate` compacted the cache (`compact`)."""
        self._compact_compiled = False
        self.block_size = block_size
        self.speculation = None
        """The speculative search (`serving.speculative.EngineSpeculation`), or `None`."""
        self.cache_len = max_len
        """Slots per row of the lockstep cache: `max_len`, plus room for a dispatch's writes
        under speculation (`num_steps` times `EngineSpeculation.write_width`)."""
        if speculative is not None:
            self.speculation = EngineSpeculation(speculative, self.model, max_slots, max_len)
            self.decode_widths = (max_slots,)
            self.cache_len = max_len + num_steps * self.speculation.write_width
        self.paged = None
        """The paged KV cache (`serving.paged.PagedKV`: its `allocator`, `prefilled_tokens`;
        `serving.paged_speculative.SpeculativePagedKV` with `speculative`), or `None` for the
        lockstep cache."""
        if block_size is not None:
            sizes = (self.model, max_slots, max_len, block_size, num_blocks)
            on = {"preemption": preemption is not False, "num_steps": num_steps}
            self.paged = (
                PagedKV(*sizes, **on)
                if speculative is None
                else SpeculativePagedKV(*sizes, speculation=self.speculation, **on)
            )
            self.decode_widths = (max_slots,)
        self.preemptor = Preemptor(self.paged) if self.preemption else None
        """What `make_room` preempts with (`serving.preemption.Preemptor`, over `paged`), or
        `None` without a paged cache with `preemption`."""
        self.timer = PhaseTimer()
        """Wall seconds per phase of `generate` ("layout", "compact", "dispatch") and of the
        orchestrator's loop (see `Orchestrator`); `timer.sync = True` attributes device time to
        the phase that queued it (for profiling)."""

    # ---- the three functions -------------------------------------------------------------

    def init_decode_state(self) -> DecodeState:
        """An empty decode state: every slot idle (`done`)."""
        slots, vocab = self.max_slots, self.model.vocab_size

        def zeros_f():
            return jnp.zeros((slots,), jnp.float32)

        params = SlotParams(
            greedy=jnp.ones((slots,), bool),
            temperature=zeros_f() + 1,
            top_p=zeros_f() + 1,
            min_p=zeros_f(),
            repetition_penalty=zeros_f() + 1,
            presence_penalty=zeros_f(),
            frequency_penalty=zeros_f(),
            logit_bias=jnp.zeros((slots, vocab), jnp.float32),
            top_k=jnp.zeros((slots,), jnp.int32),
        )

        def zeros_i():  # a buffer of its own per field (the state is donated)
            return jnp.zeros((slots,), jnp.int32)

        gen = GenerationState(
            token_ids=jnp.full((slots, self.max_len), self.pad_token_id, jnp.int32),
            length=zeros_i(),
            prompt_length=zeros_i(),
            start_length=zeros_i(),
            max_new_tokens=zeros_i(),
            done=jnp.ones((slots,), bool),
            finish_reason=zeros_i(),
            logits=jnp.zeros((slots, vocab), jnp.float32),
            logprobs=jnp.zeros((slots, self.max_len), jnp.float32),
            top_token_ids=jnp.zeros((slots, self.max_len, self.top_logprobs), jnp.int32),
            top_logprobs=jnp.zeros((slots, self.max_len, self.top_logprobs), jnp.float32),
            cache=self.model.init_cache(slots, self.cache_len if self.paged is None else 1),
            processor_states=(jnp.full((slots,), INITIAL, jnp.int32), ()),
            stop_state=jnp.zeros((slots, 0), jnp.int32),
            key=jax.random.split(jax.random.key(0), slots),
            key_step=zeros_i(),
            search_state=None if self.speculation is None else self.speculation.init(slots),
        )
        pool = ConstraintPool.empty(slots, vocab, self.constraint_states, self.constraint_classes)
        state = DecodeState(gen, params, pool)
        if self.paged is not None:
            state = self.paged.init_state(state)
        return state if self.mesh is None else place_decode_state(state, self.mesh)

    def request(self, token_ids: Sequence[int], max_new_tokens: int, **sampling) -> Request:
        """A validated `Request` (see its attributes for `sampling`).

        **Raises:** `ValueError` naming the value: an empty prompt, a non-positive
        `max_new_tokens`, a prompt (padded to its bucket) plus `max_new_tokens` beyond `max_len`,
        a knob out of range, a `logit_bias` id outside the vocabulary.
        """
        ids = tuple(int(i) for i in token_ids)
        if not ids:
            raise ValueError("the prompt encodes to no tokens")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ValueError(f"`max_new_tokens` must be a positive integer, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be a positive integer, got {max_new_tokens!r}")
        width = self.prefill_width(len(ids))
        if self.paged is not None:
            self.paged.check_fits(len(ids) + max_new_tokens)
        if width + max_new_tokens > self.max_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens (padded to {width}) and max_new_tokens="
                f"{max_new_tokens}: more than this engine's max_len={self.max_len}"
            )
        return checked_request(ids, max_new_tokens, self.model.vocab_size, sampling)

    def prefill_width(self, prompt_length: int) -> int:
        """Cache slots a prompt of `prompt_length` tokens takes: its bucket, or a multiple of
        `prefill_chunk` when it is chunked."""
        if prompt_length > self.prefill_chunk:
            return -(-prompt_length // self.prefill_chunk) * self.prefill_chunk
        return bucket_length(prompt_length)

    def prefill_chunks(
        self, request: Request, admission: Admission | None = None, decode_state=None
    ) -> Iterator[Prefix | None]:
        """Prefill `request`, yielding `None` between chunks (the orchestrator decodes the other
        slots there) and the `Prefix` last. A prompt of at most `prefill_chunk` tokens is ONE
        model call over the left-padded prompt (what `generate` computes); a longer one runs
        `prefill_chunk` tokens per call into a cache of the padded width. With a paged cache,
        `admission` (from `admit`) and `decode_state`: a prompt with cached prefix blocks is
        prefilled from its first uncached position over them (`PagedKV.prefill_cached`: its
        blocks are read from `decode_state` at this call, before the state is donated)."""
        if self.paged is not None:
            if admission is not None and admission.cached_tokens:
                return self.paged.prefill_cached(self, request, admission, decode_state)
            self.paged.prefilled_tokens += len(request.token_ids)
        return self._prefill_chunks(request)

    def _prefill_chunks(self, request: Request) -> Iterator[Prefix | None]:
        ids = np.asarray(request.token_ids, np.int32)
        n = len(ids)
        width = self.prefill_width(n)
        token_ids = np.full((1, width), self.pad_token_id, np.int32)
        positions = np.full((1, width), -1, np.int32)
        token_ids[0, width - n :] = ids
        positions[0, width - n :] = np.arange(n)
        rings = self.paged is None or not self.paged.rings
        if n <= self.prefill_chunk and rings:
            logits, cache = prefill_jit(self.model, jnp.asarray(token_ids), jnp.asarray(positions))
        else:  # a paged engine's cache keeps every position of every layer (no rings)
            logits, cache = yield from chunked_prefill(
                self.model,
                self.model.init_cache(1, width) if rings else self.paged.prefill_cache(width),
                token_ids,
                positions,
                self.prefill_chunk,
            )
        yield self._prefix(request, logits, cache)

    def prefill(self, request: Request, admission=None, decode_state=None) -> Prefix:
        """Prefill `request` at once (all of `prefill_chunks`). **Returns:** its `Prefix`."""
        *_, prefix = self.prefill_chunks(request, admission, decode_state)
        return prefix

    def admit(self, request: Request, slot: int) -> Admission | None:
        """Paged cache only: take blocks for `request` in `slot` before its prefill
        (`BlockAllocator.admit`: cached prefix blocks shared, the rest of the prompt's taken, and
        its worst case reserved, or with `preemption` room kept for one dispatch); `None` when
        the pool cannot hold it now (it must wait). Pass the result to `prefill`; call
        `release(slot)` when the request ends.

        **Raises:** `ValueError` without a paged cache, or for a busy slot."""
        if self.paged is None:
            raise ValueError("`admit` needs a paged KV cache (`Engine(block_size=...)`)")
        return self.paged.admit(request, slot)

    def block_prefill(self, request: Request, admission: Admission) -> BlockPrefill | None:
        """Paged cache with `mixed_prefill`: a `BlockPrefill` for `request` (admitted by `admit`)
        when its uncached prompt is longer than `prefill_chunk`, else `None` (prefill it with
        `prefill_chunks`). Run its chunks with `run_chunk` or inside `generate(...,
        prefill=...)`, then `insert(block_prefix(prefill), ...)`.

        **Raises:** `ValueError` without a paged cache."""
        if self.paged is None:
            raise ValueError("`block_prefill` needs a paged KV cache (`Engine(block_size=...)`)")
        return self.paged.block_prefill(self, request, admission)

    def run_chunk(self, decode_state: PagedDecodeState, prefill: BlockPrefill) -> PagedDecodeState:
        """The next chunk of `prefill` on its own, into its slot's blocks (`decode_state` is
        donated). **Raises:** `ValueError` when no chunk is left."""
        if not prefill.pending:
            raise ValueError(f"all {prefill.num_chunks} prefill chunks have run")
        return self.paged.run_chunk(decode_state, prefill)

    def block_prefix(self, prefill: BlockPrefill) -> Prefix:
        """The `Prefix` to `insert` after every chunk of `prefill` ran (`PagedKV.prefix`).

        **Raises:** `ValueError` while chunks are left."""
        return self.paged.prefix(self, prefill)

    def release(self, slot: int, token_ids: Sequence[int] | None = None) -> None:
        """Paged cache only: the request in `slot` ended; its blocks return to the pool (a
        no-op for the lockstep cache). `token_ids`: its prompt and generated tokens whose keys
        and values are written (all but the last generated one): their full blocks stay in the
        prefix cache for a later prompt that starts with them (a conversation's next turn;
        `PagedKV.release`). The orchestrator passes them for every request that finishes."""
        if self.paged is not None:
            self.paged.release(slot, token_ids)

    @property
    def preemption(self) -> bool:
        """Whether the engine preempts (a paged cache with `preemption` on; see `make_room`)."""
        return self.paged is not None and self.paged.preemption

    def make_room(
        self, decode_state: DecodeState, num_steps: int | None = None
    ) -> tuple[DecodeState, list[Preemption]]:
        """Call before each `generate` (paged cache with `preemption`; otherwise it returns
        `(decode_state, [])`): give every busy slot the blocks for `num_steps` (default
        `self.num_steps`) more steps' writes, oldest admission first, preempting the most
        recently admitted requests (busy, or admitted and not yet inserted) while the pool has
        too few (`Preemptor.make_room`; vLLM's recompute preemption). A preempted slot's blocks
        are back and it is idle; `decode_state` is donated when one is freed.

        **Returns:** `(decode_state, preemptions)`: each `Preemption` names the `slot` and the
        `request` to queue again at the front (in the order given: the oldest ends up first)
        and to `admit`, prefill and `insert` like any other; its tokens then continue exactly
        where they stopped. `preemptions` is newest first; `paged.preemptions` counts them."""
        if not self.preemption:
            return decode_state, []
        n = self.num_steps if num_steps is None else num_steps
        return self.preemptor.make_room(decode_state, n * self.paged.tokens_per_step)

    def _prefix(self, request: Request, logits, cache) -> Prefix:
        return make_prefix(request, logits, cache, self.max_len, self.pad_token_id)

    def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
        """Put `prefix` into `slot` of `decode_state` (donated: do not use it afterwards).

        **Raises:** `ValueError` for a slot outside `[0, max_slots)`."""
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} is outside [0, {self.max_slots})")
        if self.paged is not None:
            return self.paged.insert(prefix, decode_state, slot)
        state = insert_jit(prefix, decode_state, jnp.asarray(slot, jnp.int32))
        if self.speculation is not None:
            state = reset_jit(self.speculation, state, jnp.asarray(slot, jnp.int32))
        return state

    def constraint_entry(self, constraint) -> PoolEntry | None:
        """`constraint`'s tables padded to this engine's pool (host work: call it off the device
        thread), or `None` when they do not fit it (a pushdown automaton, or tables larger than
        `constraint_states` x `constraint_classes`) or the engine speculates: such a request
        runs alone.

        **Raises:** see `serving.pool.pool_entry`."""
        if self.speculation is not None:
            return None
        return pool_entry(
            constraint, self.model.vocab_size, self.constraint_states, self.constraint_classes
        )

    def place(self, entry: PoolEntry, decode_state: DecodeState, slot: int) -> DecodeState:
        """Constrain `slot` (after its `insert`) with `entry` (from `constraint_entry`), written
        into the slot's row of the table pool; `decode_state` is donated. Compiles nothing new
        after the first call (the pool's shape is fixed).

        **Raises:** `ValueError` for a slot outside `[0, max_slots)`."""
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} is outside [0, {self.max_slots})")
        if self.paged is not None:  # the pool and tables are left out, and put back
            s = decode_state
            base = DecodeState(s.generation, s.params, s.pool)
            base = place_jit(entry, base, jnp.asarray(slot, jnp.int32))
            return PagedDecodeState(base.generation, base.params, base.pool, s.paged)
        return place_jit(entry, decode_state, jnp.asarray(slot, jnp.int32))

    def free(self, decode_state: DecodeState, slot: int) -> DecodeState:
        """Mark `slot` finished (a cancelled request); `decode_state` is donated. (With a paged
        cache, `release(slot)` returns its blocks.)"""
        return free_jit(decode_state, jnp.asarray(slot, jnp.int32))

    def generate(
        self,
        decode_state: DecodeState,
        num_steps: int | None = None,
        *,
        until_finish=False,
        prefill: BlockPrefill | None = None,
    ):
        """Run up to `num_steps` decode steps (default `self.num_steps`) in ONE dispatch
        (a `lax.while_loop`, left early when every slot is done, and with `until_finish=True`
        after the first step in which a busy slot finishes: the orchestrator asks for it while
        requests wait, so that a freed slot is refilled at once instead of idling for the rest
        of the dispatch; an array argument, so either value runs the same compiled program).

        Before the dispatch it reads the cache layout (one small transfer) and compacts the
        cache (`compact`) when the dispatch would run past the cache's end or when compacting
        lets attention read a shorter static length for at least `COMPACTION_MIN_STEPS` steps; a dispatch that still would not fit (a
        `num_steps` beyond what the busy slots leave free) runs fewer steps, the rest of its
        output `-1`. When the busy slots fit a narrower width of `decode_widths`, the dispatch
        runs that width's program on their rows (gathered, then written back); the output still
        has a column per slot. With `prefill` (paged cache: a `BlockPrefill` with chunks left),
        its next chunk runs first in the same compiled program (the mixed dispatch). A paged
        dispatch gathers only each table's first blocks, the smallest bucket of
        `paged.gather_buckets` that holds the busy slots (`PagedKV.generate`). A paged
        cache with `preemption` needs `make_room` first when its pool may run short.

        **Arguments:** `decode_state` (donated).

        **Raises:** `ValueError` for a `prefill` without a paged cache or with no chunk left;
        `RuntimeError` when a busy slot cannot get its blocks (`preemption`, no `make_room`).

        **Returns:** `(decode_state, output)`, `output` a `StepOutput` (`output.token_ids:
        Int[Array, "steps batch"]`, the token each slot took at each step, `-1` where none).
        """
        n = self.num_steps if num_steps is None else num_steps
        timer, clock = self.timer, time.perf_counter
        start = clock()
        if prefill is not None and (self.paged is None or not prefill.pending):
            raise ValueError("`prefill` needs a paged KV cache and a BlockPrefill with chunks left")
        if self.paged is not None:
            out = self.paged.generate(self, decode_state, n, until_finish, prefill)
            return timer.add("dispatch", start, out)
        layout, done = timer.add(
            "layout",
            start,
            jax.device_get((layout_jit(decode_state), decode_state.generation.done)),
        )
        write, dead = (int(x) for x in layout)
        lengths = attention_lengths(self.cache_len, self.max_slots)

        def read(used):  # the static length attention reads with `used` slots written
            return next((m for m in lengths if m >= used), self.cache_len)

        per_step = 1 if self.speculation is None else self.speculation.write_width
        full = write + n * per_step > self.cache_len
        shorter = read(write - dead + n + COMPACTION_MIN_STEPS) < read(write + n)
        start = clock()
        if full and self.speculation is not None:  # holes of rejected guesses too
            self.compactions += 1
            decode_state = timer.add("compact", start, squeeze_jit(decode_state))
            write = self.max_len  # at most: no row holds more live slots
        elif dead and (full or shorter):
            decode_state = timer.add("compact", start, self.compact(decode_state))
            write -= dead
        elif not self._compact_compiled:  # compiled with the first dispatch, not by a later request
            decode_state = compact_jit(decode_state)
            self._compact_compiled = True
            write -= dead
        limit = max(1, min(n, (self.cache_len - write) // per_step))
        busy = np.flatnonzero(~done)
        width = next(w for w in self.decode_widths if w >= len(busy))
        rows = None
        if busy.size and width < self.max_slots:
            rows = np.concatenate([busy, np.flatnonzero(done)[: width - busy.size]])
        start = clock()
        return timer.add(
            "dispatch", start, self._dispatch(decode_state, n, limit, until_finish, rows)
        )

    def _dispatch(self, decode_state, n, limit, until_finish, rows):
        """`generate_jit` over every slot, or (`rows`: distinct slot indices holding every busy
        one) over those slots gathered into a narrower state and written back."""
        args = (
            n,
            jnp.asarray(limit, jnp.int32),
            self.eos_token_id,
            self.pad_token_id,
            jnp.asarray(bool(until_finish)),
        )
        if self.speculation is not None:
            fixed = (self.model, self.speculation)
            return speculative_generate_jit(fixed, decode_state, *args)
        if rows is None:
            return generate_jit(self.model, decode_state, *args)
        rows = jnp.asarray(rows, jnp.int32)
        narrow, out = generate_jit(self.model, narrow_jit(decode_state, rows), *args)
        return widen_jit(decode_state, narrow, out, rows)

    def compact(self, decode_state: DecodeState) -> DecodeState:
        """The decode state with every slot's keys and values shifted to the front of the cache
        by the number of leading slots no busy slot uses, and the shared write index with them
        (`decode_state` is donated; `generate` calls it when needed). Counted in
        `compactions`."""
        self.compactions += 1
        self._compact_compiled = True
        return compact_jit(decode_state)

    def precompile(self, *, progress: bool = True) -> None:
        """Compile every prefill bucket, chunk, insert, the constraint pool's `place` and the
        decode step now (a `tqdm` bar when `progress`), so that no request compiles later. With
        a paged cache also the decode and mixed dispatches of every bucket of
        `PagedKV.gather_buckets` (over idle slots: no step runs), and each prefill bucket's
        prefill over cached prefix blocks (`prefill_cached`): it leaves one block of
        `block_size` zero tokens in the prefix cache (evictable, and right for any prompt that
        starts with those tokens). The job list is `serving.precompile`."""
        precompile_jobs(self, progress=progress)

    def generate_alone(
        self, request: Request, constraint
    ) -> tuple[list[int], list[float], list, str]:
        """Run `request` on its own with `constraint` (a structured-generation processor, e.g.
        `fg.processors.Regex`) through `fg.generate`, whose processors are `[constraint]` then
        the request's knobs in `SlotDecoding`'s order.

        This is how the server runs the constrained requests that do not fit the constraint
        pool (`constraint_entry` is `None`: pushdown automata, tables larger than the pool): the
        orchestrator runs such a request between two decode dispatches and the other slots wait
        for it; each new table shape compiles a program (`serving.alone.run_alone`).

        **Returns:** `(token_ids, logprobs, top_logprobs, finish_reason)` (a `FINISH_REASONS`
        name).
        """
        return run_alone(self.model, self.tokenizer, request, constraint, self.top_logprobs)

    # ---- the orchestrated, asynchronous side -------------------------------------------------

    @property
    def orchestrator(self) -> Orchestrator:
        """The `Orchestrator` that runs this engine for many callers (started on first use)."""
        if self._orchestrator is None:
            self._orchestrator = Orchestrator(self)
            self._orchestrator.start()
        return self._orchestrator

    def close(self) -> None:
        """Stop the orchestrator's thread (requests in flight end with an error)."""
        if self._orchestrator is not None:
            self._orchestrator.close()
            self._orchestrator = None

    def request_from_options(
        self, prompt: Prompt, options: GenerationOptions | None = None, *, seed: int | None = None
    ) -> tuple[Request, tuple[str, ...]]:
        """The `Request` and stop strings of a prompt (raw text, or a chat rendered with the
        chat template) and `GenerationOptions`, as `generate` reads them: `temperature`,
        `top_p`, `min_p` (any of them implies sampling unless `do_sample=False`),
        `do_sample`, `repetition_penalty`, `max_new_tokens` (default 128), `stop_strings`,
        `chat_template`; `seed` picks the key (see the module docstring).

        **Raises:** `ValueError` naming an option the engine does not serve (`top_k`,
        `typical_p`, beams, guidance, ...) or a value out of range (see `request`).
        """
        options = options or GenerationOptions()
        check_served_options(options)
        ids = encode_prompt(self.tokenizer, prompt, chat_template=options.chat_template)
        knobs, stops, max_new = request_knobs(options)
        return self.request(ids, max_new, seed=seed, **knobs), stops

    async def stream(
        self, prompt: Prompt, options: GenerationOptions | None = None, *, seed: int | None = None
    ):
        """Generate for `prompt` among the other callers, yielding `str` pieces as they come
        (never half a UTF-8 character; no EOS; nothing from a stop string on). Their
        concatenation equals `generate(model, tokenizer, prompt, options,
        key=jax.random.key(seed)).texts[0]`.

        **Raises:** `ValueError` (see `request_from_options`), before anything is queued;
        `RuntimeError` when the engine stops before the request finished.
        """
        request, stops = self.request_from_options(prompt, options, seed=seed)
        handle = self.orchestrator.submit(request, stops)
        try:
            async for event in handle.events():
                if isinstance(event, Error):
                    raise RuntimeError(event.message)
                if isinstance(event, Finished):
                    return
                if event.text:
                    yield event.text
        finally:
            handle.cancel()
