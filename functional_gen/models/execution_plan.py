"""`ExecutionPlan`: the one declared place for the per-backend choices of the decoder.

The model's program is tuned per backend: XLA's CPU backend needs fusion barriers and static
length branches that an accelerator pays for with a host round trip each (DESIGN.md,
"Accelerators": on one H200, calling decode attention directly instead of through
`lax.cond`/`lax.switch` took the SmolLM2-135M step from 2.94 to 2.27 ms; command buffers for
`while` and conditionals 2.94 -> 2.14 ms; both 1.86 ms). Every such choice is a field here, read
at trace time by the layers (`DecoderForCausalLM.plan`, passed down to `Attention` and `Linear`);
no other module asks which platform it runs on. The plan is static (part of the jitted
program's cache key) and never part of `config_fingerprint`: a `SequenceState` file made under
one plan loads under another.

`ExecutionPlan.for_backend("cpu")` is exactly the program the model traced before plans existed
(its fields' defaults); `for_backend("gpu")` (also `"cuda"`, `"rocm"`) has no conditional inside
the layer stack, prefill attention through `jax.nn.dot_product_attention`, and bfloat16 matmul
operands with float32 accumulation. Overridable: `model.with_plan(ExecutionPlan.for_backend(
"gpu"))` runs the GPU program on a CPU (what the tests do), `dataclasses.replace(plan, ...)`
changes one choice (what a benchmark does).
"""

import dataclasses

import jax

CPU_BACKENDS = ("cpu",)
"""Backend names (`jax.default_backend()`) that get the CPU plan."""

GPU_BACKENDS = ("gpu", "cuda", "rocm")
"""Backend names that get the GPU plan."""

PREFILL_ATTENTION = ("blocks", "dot_product_attention")
"""Accepted values of `ExecutionPlan.prefill_attention`."""

PAGED_ATTENTION = ("gather", "pallas", "pallas_interpret")
"""Accepted values of `ExecutionPlan.paged_attention`."""

DOT_PRODUCT_ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn")
"""Accepted values of `ExecutionPlan.attention_implementation` (`jax.nn.dot_product_attention`'s
`implementation=`)."""

GPU_COMMAND_BUFFER = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
"""The GPU plan's `xla_gpu_enable_command_buffer`: XLA's default command types plus `WHILE` and
`CONDITIONAL`, so that the `generate` loop's `while` (and any conditional left, e.g. a
processor's) is recorded into CUDA graphs instead of returning to the host each iteration
(DESIGN.md "Accelerators": 2.94 -> 2.14 ms per SmolLM2-135M step on an H200). Per program the
value must list every type: the command-line form's `+WHILE,+CONDITIONAL` is refused there
("'+WHILE' is not a valid enum value", jax 0.10.2)."""


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """The per-backend choices of the decoder's program, fixed at trace time (frozen, hashable:
    a static field of `DecoderForCausalLM`).

    Make one with `ExecutionPlan.for_backend(...)`; the defaults of the fields are the CPU plan.

    **Fields:**

    - `name`: a label (`"cpu"`, `"gpu"`), for benchmark tables and reprs only; no code reads it.
    - `attention_fence`: decode attention over a cache read in full (a single length, and a
      ring layer's decode) is called inside a `lax.cond` whose two branches are the same. CPU
      (True): the conditional makes the updated cache one materialised operand; called
      directly, XLA's CPU fusion duplicated each `dynamic_update_slice` into the dot's operand
      fusion and copied every key and value buffer 4 times per step (3-4% of a 160-slot decode
      step, 6x the step time at 2,048 slots; `Attention._attend_written`). GPU (False): each
      conditional is a host round trip (DESIGN.md "Accelerators").
    - `attention_length_buckets`: decode attention reads the written part of the cache rounded
      up to one of `attention_lengths(max_len, batch)`, picked at run time by a `lax.switch`.
      CPU (True): a step over a 4,096-slot cache took 1.5x (batch 1) to 3x (batch 4) one over
      256 slots (`attention_lengths` has the measurements). GPU (False): the whole cache is read
      every step, with no branch: the switch would be a host round trip per layer, and at batch
      1 a step is bound by launches and round trips, not by the cache's bytes (`generate`'s
      cache is sized to the prompt plus the new tokens, so the slots read stay within ~2x of
      the written ones there). Independent of `attention_fence`: with both False, decode
      attention is one direct call.
    - `cache_write_fence`: this call's keys and values pass an `optimization_barrier` before
      they are written into the cache. CPU (True): with the transpose fused in, XLA's CPU
      backend rewrote every slot of the cache instead of updating it in place (0.11 ms per layer
      and step at batch 8). GPU (False): the barrier only splits a fusion.
    - `prefill_attention`: `"blocks"` (CPU): query blocks of `prefill_block(seq)` tokens, each
      reading only the keys causality allows, and a sliding-window layer's band of keys
      (`Attention._prefill`, `_attend_band`; written for XLA's CPU dot, which has no fused
      attention). `"dot_product_attention"` (GPU): one `jax.nn.dot_product_attention` call per
      layer, so that cuDNN's flash attention runs the masked square on tensor cores (see
      `Attention._dot_product_prefill` for which masks go to cuDNN).
    - `attention_implementation`: the `implementation=` of that call where the mask allows
      cuDNN: `None` (XLA's reference, CPU-safe), `"xla"` or `"cudnn"` (GPU plan; it raises on a
      machine without cuDNN, so CPU tests of the GPU plan set `None`).
    - `matmul_fences`: the bfloat16 and int8 matmuls are fenced: `optimization_barrier`s around
      the product, a `lax.cond` that materialises a one-token input
      (`quantization._materialized`) and one that orders an int8 dequantization after the
      activations (`matmul_row_blocks`). CPU (True): without them XLA's CPU backend fused
      neighbours into the dot and picked kernels measured 2-30x slower, or hoisted every
      dequantization out of the loop (63 against 23 ms per int8 step; `run_formulation`).
      GPU (False): a conditional is a host round trip, and the fused dequantization is what a
      GPU matmul wants.
    - `bf16_compute`: CPU (False): the formulation `quantization.FORMULATIONS` measured per
      weight format and token count (float32 activations; a bfloat16 weight is upcast at one
      token, where XLA's CPU bf16 dot is 10-20x slower). GPU (True): bfloat16 and int8 weights
      multiply bfloat16 operands with float32 accumulation (`preferred_element_type=float32`,
      the tensor-core rate); float32 weights stay float32; norms, softmax and logits stay
      float32; attention casts the query to the cache's dtype, accumulates scores in float32
      and casts the probabilities to the cache's dtype for the product with the values.
    - `scan_min_tokens`: a prefill of at least this many tokens (rows times tokens) runs its
      layers as a `lax.scan` over stacked weights (`DecoderModel._scan_layers`), shorter calls
      and decode unrolled; `None`: the module constant `decoder.SCAN_MIN_TOKENS` (1,024; its
      docstring has the CPU measurements: one layer group to compile against a copy of each
      layer's weights). CPU and GPU: `None` (on the GPU unmeasured: compile time matters as
      much there, and a prefill is one call, so the loop's per-iteration cost is small against
      its arithmetic).
    - `logits_fence`: the output head's `[vocab, tokens]` product passes an
      `optimization_barrier` before its transpose. CPU (True): otherwise XLA folded the
      transpose into the dot and computed the token-major product, whose CPU kernel took 43 ms
      at 2-4 tokens (3 ms fenced). GPU (False): the GPU's matmul takes either layout. With
      bfloat16 compute XLA's CPU backend cannot run the unfenced head at all (the folded dot
      is "UNIMPLEMENTED: Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"),
      so the GPU plan's bfloat16 path runs on a CPU (tests) with `logits_fence=True`.
    - `paged_attention`: how a decode step over a `PagedKVCache` (the serving engine's block
      pool, `functional_gen.models.paged_cache`) reads the keys and values. `"gather"` (CPU):
      each layer gathers the rows' blocks through their tables into `[rows, kv_heads, blocks *
      block_size, head_dim]` and attends as over a contiguous cache (XLA's CPU dot reads the
      copy in place). `"pallas"` (GPU): jax's Pallas paged-attention kernel
      (`jax.experimental.pallas.ops.gpu.paged_attention`, after vLLM's PagedAttention) reads
      the pool through the tables inside the kernel, no copy, every row only as far as its
      own length; a sliding-window layer keeps the gather (the kernel has no window).
      `"pallas_interpret"`: the same kernel in Pallas's interpret mode (any backend, slow: what
      the CPU tests of the GPU plan use).
    - `compiler_options`: per-program XLA options, `((name, value), ...)`, for the jitted
      `generate` loop (`jax.jit(..., compiler_options=plan.jit_compiler_options())`). CPU: none.
      GPU: `xla_gpu_enable_command_buffer=GPU_COMMAND_BUFFER`.
    """

    name: str = "cpu"
    attention_fence: bool = True
    attention_length_buckets: bool = True
    cache_write_fence: bool = True
    prefill_attention: str = "blocks"
    attention_implementation: str | None = None
    matmul_fences: bool = True
    bf16_compute: bool = False
    scan_min_tokens: int | None = None
    logits_fence: bool = True
    paged_attention: str = "gather"
    compiler_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.prefill_attention not in PREFILL_ATTENTION:
            raise ValueError(
                f"unknown prefill_attention {self.prefill_attention!r}; expected one of "
                f"{PREFILL_ATTENTION}"
            )
        if self.paged_attention not in PAGED_ATTENTION:
            raise ValueError(
                f"unknown paged_attention {self.paged_attention!r}; expected one of "
                f"{PAGED_ATTENTION}"
            )
        if self.attention_implementation not in DOT_PRODUCT_ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"unknown attention_implementation {self.attention_implementation!r}; expected "
                f"one of {DOT_PRODUCT_ATTENTION_IMPLEMENTATIONS}"
            )
        if self.scan_min_tokens is not None and (
            isinstance(self.scan_min_tokens, bool)
            or not isinstance(self.scan_min_tokens, int)
            or self.scan_min_tokens < 1
        ):
            raise ValueError(
                f"scan_min_tokens must be a positive int or None, got {self.scan_min_tokens!r}"
            )
        if not isinstance(self.compiler_options, tuple) or not all(
            isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str)
            for o in self.compiler_options
        ):
            raise ValueError(
                "compiler_options must be a tuple of (name, value) pairs, got "
                f"{self.compiler_options!r}"
            )

    @classmethod
    def for_backend(cls, backend: str | None = None) -> "ExecutionPlan":
        """The plan for a backend.

        **Arguments:** `backend`: `"cpu"`, or `"gpu"` / `"cuda"` / `"rocm"` (case-insensitive);
        `None` (default): `jax.default_backend()`.

        **Returns:** the CPU plan (the fields' defaults: the program as measured on XLA's CPU
        backend) or the GPU plan (no conditional in the layer stack, prefill through
        `jax.nn.dot_product_attention` with cuDNN, bfloat16 operands with float32
        accumulation, command buffers for `while` and conditionals).

        **Raises:** `ValueError` naming an unknown backend and the accepted names (a TPU has no
        plan yet).
        """
        name = jax.default_backend() if backend is None else backend
        if not isinstance(name, str):
            raise ValueError(f"backend must be a string or None, got {backend!r}")
        name = name.lower()
        if name in CPU_BACKENDS:
            return cls()
        if name in GPU_BACKENDS:
            return cls(
                name="gpu",
                attention_fence=False,
                attention_length_buckets=False,
                cache_write_fence=False,
                prefill_attention="dot_product_attention",
                attention_implementation="cudnn",
                matmul_fences=False,
                bf16_compute=True,
                logits_fence=False,
                paged_attention="pallas",
                compiler_options=(("xla_gpu_enable_command_buffer", GPU_COMMAND_BUFFER),),
            )
        raise ValueError(
            f"no execution plan for backend {backend!r}; expected None or one of "
            f"{CPU_BACKENDS + GPU_BACKENDS}"
        )

    def replace(self, **changes) -> "ExecutionPlan":
        """A copy with `changes` (field name -> value), checked as a new plan is.

        **Raises:** `TypeError` for an unknown field; `ValueError` for a bad value."""
        return dataclasses.replace(self, **changes)

    def jit_compiler_options(self) -> dict[str, str]:
        """`compiler_options` as the dict `jax.jit(..., compiler_options=...)` and
        `jitted.lower(...).compile(...)` take (empty for the CPU plan)."""
        return dict(self.compiler_options)


def check_plan(plan) -> ExecutionPlan:
    """`plan` itself if it is an `ExecutionPlan`.

    **Raises:** `TypeError` naming the type given otherwise (e.g. the string `"gpu"`: use
    `ExecutionPlan.for_backend("gpu")`)."""
    if not isinstance(plan, ExecutionPlan):
        raise TypeError(
            f"`plan` must be a functional_gen.models.ExecutionPlan, got {type(plan).__name__}"
        )
    return plan


CPU_PLAN = ExecutionPlan()
"""The CPU plan (`ExecutionPlan.for_backend("cpu")`): also what a layer called without a plan
uses, so every caller outside the model keeps today's program."""
