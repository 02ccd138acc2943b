"""Weight formats of the linear layers and embeddings: float32, bfloat16 and weight-only int8.

Activations, the `KVCache` and the logits stay float32 in every format; only the stored weights
change, which is what decode on a CPU is bound by (it reads every weight once per step).

- **bfloat16**: the weights rounded to bfloat16 (`jnp.bfloat16`), as transformers'
  `torch_dtype=torch.bfloat16` stores them.
- **int8** (`quantization="int8"`): symmetric per-block quantization along the input dimension,
  blocks of `BLOCK = 32` weights with one float32 scale each: exactly the layout of llama.cpp's
  Q8_0 (`ggml-quants.c`, `quantize_row_q8_0`), so a Q8_0 GGUF loads without any rounding and
  4-bit blocks (Q4_0, Q4_1) keep their 16 levels almost exactly. Block `b` of row `o` of a weight
  `W[out, in]` is stored as `q[o, 32b:32b+32] = round(W[o, 32b:32b+32] / s[o, b])` in
  `[-127, 127]` with `s[o, b] = max|W[o, 32b:32b+32]| / 127`, so `W ~= q * s` (each scale
  repeated over its block) with an error of at most `s[o, b] / 2` per element. A weight whose
  input size is not a multiple of 32 gets one block per row (per-output-channel, the scheme of
  LLM.int8()'s vector-wise weights, Dettmers et al. 2022). A tied embedding uses the same scales
  for the lookup (row = token) and the output head (row = logit).

  Why blocks: one scale per row cost SmolLM2 3% of its top-1 agreement with float32 (96.97%,
  under the 97% target of issue #13), blocks of 32 cost 1.8% (98.24%), in a float32 simulation
  of the weights alone (`benchmarks/accuracy_quantization.py` measures the real paths). Scales
  fitted to minimise each row's squared error, input-column scales folded into the activations,
  or float32 outlier columns did not reach 97.5% (notes of issue #13).

**Formulation table.** XLA's CPU backend compiles mathematically equal matmuls into kernels
whose speed differs 10x (environment notes §6, issue #13): a bfloat16 dot runs either much faster
or 10-20x slower than float32 depending on the operand layout and the token count, and an int8
weight is best upcast inside a GEMV at one token but multiplied as int8 x int8 -> int32 at a few.
`FORMULATIONS` records, per format, which formulation to use up to how many tokens (the `tokens`
axis of `[in, tokens]` activations: rows times new tokens per row), from
`benchmarks/bench_matmul.py` run on the project's 2-core AVX-512 (Zen 4) machine; the choice is
static (shapes are known at trace time), so it costs nothing at run time.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Float32, Int, Int8

from .execution_plan import CPU_PLAN, ExecutionPlan

QUANTIZATIONS = ("int8",)
"""Accepted values of `quantization=` (besides `None`, the float weights of `dtype`)."""

WEIGHT_DTYPES = ("float32", "bfloat16")
"""Accepted float weight dtypes (`dtype=`)."""


def check_quantization(quantization: str | None) -> str | None:
    """Validate a `quantization=` argument.

    **Returns:** `quantization` unchanged (`None` or `"int8"`).

    **Raises:** `ValueError` naming the bad value and the accepted ones.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"unsupported quantization {quantization!r}; expected None or one of {QUANTIZATIONS}"
        )
    return quantization


BLOCK = 32
"""Weights per int8 scale along the input dimension (llama.cpp's `QK8_0`)."""


def blocks_of(in_features: int, block: int | None = BLOCK) -> int:
    """How many int8 scales a row of `in_features` weights gets: `in_features / block` when that
    divides, else (or for `block=None`) 1, one scale per row."""
    return in_features // block if block and in_features % block == 0 else 1


def quantize_int8(
    weight: Float[np.ndarray, "out in"] | Float[Array, "out in"],
    block: int | None = BLOCK,
) -> (
    tuple[Int8[np.ndarray, "out in"], Float32[np.ndarray, "out blocks"]]
    | tuple[Int8[Array, "out in"], Float32[Array, "out blocks"]]
):
    """Symmetric per-block int8 quantization of a `[out, in]` weight (float32 math), blocks of
    `BLOCK` along `in` (one block per row when `in` is not a multiple of `BLOCK`).

    **Arguments:** `weight`: a float array of shape `[out, in]`; a numpy array gives numpy
    results (what the loaders use, no device memory), a JAX array (or tracer) JAX results.
    `block`: weights per scale; `None` for one scale per row (per-output-channel).

    **Returns:** `(q, scale)`: `q` int8 in `[-127, 127]` and `scale` float32
    `[out, blocks_of(in, block)]`, with `|weight - dequantize_int8(q, scale)| <= scale / 2` per block
    (plus float32 rounding). An all-zero block gets scale 1.

    **Raises:** `ValueError` if `weight` is not 2-D.
    """
    xp = np if isinstance(weight, np.ndarray) else jnp
    w = weight.astype(np.float32)
    if w.ndim != 2:
        raise ValueError(f"int8 quantization needs a 2-D [out, in] weight, got shape {w.shape}")
    out, inp = w.shape
    blocks = w.reshape(out, blocks_of(inp, block), -1)
    scale = xp.max(xp.abs(blocks), axis=2) / np.float32(127.0)
    scale = xp.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    q = xp.clip(xp.rint(blocks / scale[..., None]), -127, 127).astype(np.int8)
    return q.reshape(out, inp), scale


def dequantize_int8(
    q: Int8[Array, "out in"], scale: Float[Array, "out blocks"]
) -> Float[Array, "out in"]:
    """`q` times its block's scale, in float32 (the inverse of `quantize_int8`, up to its
    rounding); `scale` has one column per block of `in / blocks` weights."""
    out, inp = q.shape
    blocks = scale.shape[-1]
    return (q.astype(jnp.float32).reshape(out, blocks, inp // blocks) * scale[..., None]).reshape(
        out, inp
    )


def split_int8(
    weight: Float[np.ndarray, "out in"], parts: int
) -> tuple[tuple[Int8[np.ndarray, "out part"], ...], Float32[np.ndarray, "out parts"]]:
    """`quantize_int8` with blocks of `in / parts` inputs, each column block returned as an array
    of its own (the layout of `"sum_b int8 [W_b] . 2-digit int8 x_b -> int32 * s_b"`).

    **Returns:** `(blocks, scale)`: `parts` int8 `[out, in / parts]` arrays and float32
    `[out, parts]`.

    **Raises:** `ValueError` if `in` is not a multiple of `parts` or `weight` is not 2-D.
    """
    w = np.asarray(weight, np.float32)
    if w.ndim != 2 or w.shape[1] % parts:
        raise ValueError(f"cannot split a weight of shape {w.shape} into {parts} column blocks")
    q, scale = quantize_int8(w, block=w.shape[1] // parts)
    return tuple(np.ascontiguousarray(b) for b in np.split(q, parts, axis=1)), scale


# ---------------------------------------------------------------------------------------------
# Formulations: f(weight[out, in], scale[out] | None, x[in, tokens] float32) -> y[out, tokens] f32


def _dot(a, b, contract, preferred=None):
    batch = ((1,), (0,)) if a.ndim == 3 else ((), ())  # [out, blocks, k] . [blocks, k, tokens]
    return lax.dot_general(a, b, (contract, batch), preferred_element_type=preferred)


def _int8_activations(x: Float[Array, "in tokens"]):
    """Activations quantized per token (column), symmetric int8, for the int8 x int8 dot."""
    sx = jnp.max(jnp.abs(x), axis=0) / 127.0
    sx = jnp.where(sx > 0, sx, 1.0)
    return jnp.round(x / sx).astype(jnp.int8), sx


def _int8_dot(w, s, x):
    xq, sx = _int8_activations(x)
    acc = _dot(w, xq, ((1,), (0,)), jnp.int32)
    return acc.astype(jnp.float32) * s[:, None] * sx[None, :]


def _int8_dot_t(w, s, x):
    xq, sx = _int8_activations(x)
    acc = _dot(xq.T, w, ((1,), (1,)), jnp.int32)
    return (acc.astype(jnp.float32) * sx[:, None] * s[None, :]).T


def _int8_dot_two_digits(w, s, x):
    """int8 x int8 -> int32 with the activations as two int8 "digits": `x ~= q1 * sx + q2 * sx/254`
    (q2 quantizes the remainder, |error| <= max|x| / 64,516 per token). Per-token int8 activations alone cost SmolLM2 3% perplexity and 10% of
    its top-1 agreement (benchmarks/accuracy_quantization.py); two digits are as exact as the
    bfloat16 activations of the prefill path, for a second int8 dot."""
    q1, sx = _int8_activations(x)
    fine = sx / 254.0
    q2 = jnp.round((x - q1.astype(jnp.float32) * sx) / fine).astype(jnp.int8)
    # two dots of `tokens` columns, not one of 2 * tokens: XLA's kernel for 16 columns ran the
    # output head 6x slower than two of 8 (benchmarks/bench_matmul.py)
    coarse = _dot(w, q1, ((1,), (0,)), jnp.int32).astype(jnp.float32)
    residual = _dot(w, q2, ((1,), (0,)), jnp.int32).astype(jnp.float32)
    return (coarse * sx[None, :] + residual * fine[None, :]) * s[:, None]


def _int8_split_dot(w, s, x):
    """int8 x int8 -> int32 over column blocks stored as separate arrays (`split_int8`: `w` a
    tuple of `n` int8 `[out, in / n]`, `s` `[out, n]`), activations in two int8 digits: `2 n`
    plain dots, each block's partial sums scaled by its own per-row scale."""
    q1, sx = _int8_activations(x)
    fine = sx / 254.0
    q2 = jnp.round((x - q1.astype(jnp.float32) * sx) / fine).astype(jnp.int8)
    width = w[0].shape[1]
    y = None
    for i, wi in enumerate(w):
        cols = slice(i * width, (i + 1) * width)
        coarse = _dot(wi, q1[cols], ((1,), (0,)), jnp.int32).astype(jnp.float32)
        residual = _dot(wi, q2[cols], ((1,), (0,)), jnp.int32).astype(jnp.float32)
        part = (coarse * sx[None, :] + residual * fine[None, :]) * s[:, i : i + 1]
        y = part if y is None else y + part
    return y


def _bf16(a):
    return a.astype(jnp.bfloat16)


def _blockwise_dot(w, s, x):
    """Per-block partial products `[blocks, out, tokens]` (a batched dot over the blocks), then
    scaled and summed."""
    out, inp = w.shape
    blocks, tokens = s.shape[1], x.shape[1]
    w3 = w.astype(jnp.float32).reshape(out, blocks, inp // blocks)
    part = _dot(w3, x.reshape(blocks, inp // blocks, tokens), ((2,), (1,)), None)
    return jnp.einsum("bot,ob->ot", part, s)


def _blockwise_int8_dot(w, s, x):
    """`_blockwise_dot` as int8 x int8 -> int32 dots with two-digit activations (see
    `_int8_dot_two_digits`)."""
    out, inp = w.shape
    blocks, tokens = s.shape[1], x.shape[1]
    q1, sx = _int8_activations(x)
    fine = sx / 254.0
    q2 = jnp.round((x - q1.astype(jnp.float32) * sx) / fine).astype(jnp.int8)
    w3 = w.reshape(out, blocks, inp // blocks)

    def part(xq):
        return _dot(w3, xq.reshape(blocks, inp // blocks, tokens), ((2,), (1,)), jnp.int32)

    p = part(q1).astype(jnp.float32) * sx + part(q2).astype(jnp.float32) * fine
    return jnp.einsum("bot,ob->ot", p, s)


ROW_BLOCK = 4096
"""Output rows per block of the row-blocked formulations (`matmul_row_blocks`): 4,096 rows of
Gemma 3's 640 inputs are 10.5 MB in float32, a block the 32 MB L3 cache holds; of 2,048, 4,096,
8,192 and 16,384 rows, 4,096 was the fastest for the 262,144-row output head at 8 tokens (one
run, int8: 31, 27, 155, 256 ms; float32: 83, 42, 85, 273 ms; the machine loaded)."""


def matmul_row_blocks(
    weight: Float[Array, "out in"] | Int8[Array, "out in"],
    scale: Float[Array, "out blocks"] | None,
    x: Float[Array, "in tokens"],
    rows: int = ROW_BLOCK,
    fence: bool = True,
) -> Float[Array, "out tokens"]:
    """`weight @ x` (the weight dequantized with its `scale` when int8) computed in blocks of
    `rows` output rows: a `jax.lax.scan` over the blocks, each copied (dequantized to float32)
    into a buffer of its own and multiplied there; the last `out % rows` rows are one product
    more.

    Why: at a few tokens XLA's CPU backend runs one `[out, in] @ [in, tokens]` dot over a matrix
    much larger than the caches (the 262,144 x 640 output head of Gemma 3) far from the memory
    bandwidth, and an int8-block weight has no fast dot at all there: its dequantized copy is
    materialised whole (`"dot([bf16(deq(W))], bf16 x)->f32"`: 496 ms for Gemma 3's head at 8
    tokens against 27 ms in blocks, one run on the loaded machine). A block's copy stays in
    cache, so the weight is read from memory once, in its stored format.

    **Arguments:** `weight`, `scale` as in `matmul` (float32 or bfloat16 weights take `None`);
    `x`: float32 `[in, tokens]`; `rows`: output rows per block (static); `fence`: order an
    int8 matrix's dequantization after `x` with a conditional (`ExecutionPlan.matmul_fences`).

    **Returns:** float32 `[out, tokens]`, equal to `dequantize_int8(weight, scale) @ x` (or
    `weight @ x`) up to float32 rounding.
    """

    def product(w, s):
        w = w.astype(jnp.float32) if s is None else dequantize_int8(w, s)
        return w @ x

    out = weight.shape[0]
    full = out // rows
    if full < 2:
        if scale is not None and fence:
            # The scale through a conditional on `x`, so that the dequantization waits for the
            # activations: XLA removes `optimization_barrier`s, and a dequantization that
            # depends on the weights alone ran before the first layer, every matrix of every
            # layer at once (a float32 copy of all the weights written and read per step).
            scale = lax.cond(x[0, 0] == x[0, 0], lambda s: s, lambda s: s + 0.0, scale)
        return product(weight, scale)

    def block(carry, i):
        w = lax.dynamic_slice_in_dim(weight, i * rows, rows)
        s = None if scale is None else lax.dynamic_slice_in_dim(scale, i * rows, rows)
        return carry, product(w, s)

    _, y = lax.scan(block, None, jnp.arange(full))
    y = y.reshape(full * rows, x.shape[1])
    if out % rows:
        rest = product(weight[full * rows :], None if scale is None else scale[full * rows :])
        y = jnp.concatenate([y, rest])
    return y


CANDIDATES: dict[str, tuple[str, Callable]] = {
    # name: (weight format, f(weight, scale, x) -> float32 y); "x.T" forms are token-major.
    "W @ x": ("float32", lambda w, s, x: w @ x),
    "W @ x in row blocks": ("float32", matmul_row_blocks),
    "(x.T @ W.T).T": ("float32", lambda w, s, x: (x.T @ w.T).T),
    "bf16 W @ bf16 x": ("bfloat16", lambda w, s, x: (w @ _bf16(x)).astype(jnp.float32)),
    "(bf16 x.T @ W.T).T": ("bfloat16", lambda w, s, x: (_bf16(x.T) @ w.T).T.astype(jnp.float32)),
    "dot(W, bf16 x)->f32": (
        "bfloat16",
        lambda w, s, x: _dot(w, _bf16(x), ((1,), (0,)), jnp.float32),
    ),
    "dot(bf16 x.T, W)->f32 .T": (
        "bfloat16",
        lambda w, s, x: _dot(_bf16(x.T), w, ((1,), (1,)), jnp.float32).T,
    ),
    "f32(W) @ x": ("bfloat16", lambda w, s, x: w.astype(jnp.float32) @ x),
    "(x.T @ f32(W).T).T": ("bfloat16", lambda w, s, x: (x.T @ w.astype(jnp.float32).T).T),
    "(f32(W) @ x) * s": ("int8", lambda w, s, x: (w.astype(jnp.float32) @ x) * s[:, None]),
    "((x.T @ f32(W).T) * s).T": (
        "int8",
        lambda w, s, x: ((x.T @ w.astype(jnp.float32).T) * s).T,
    ),
    "(f32(W) * s) @ x": ("int8", lambda w, s, x: (w.astype(jnp.float32) * s[:, None]) @ x),
    "int8 W . int8 x -> int32": ("int8", _int8_dot),
    "int8 x.T . W -> int32 .T": ("int8", _int8_dot_t),
    "int8 W . 2-digit int8 x -> int32": ("int8", _int8_dot_two_digits),
    "dot(bf16(W), bf16 x)->f32 * s": (
        "int8",
        lambda w, s, x: _dot(_bf16(w), _bf16(x), ((1,), (0,)), jnp.float32) * s[:, None],
    ),
    "dot(bf16 x.T, bf16(W))->f32 * s .T": (
        "int8",
        lambda w, s, x: (_dot(_bf16(x.T), _bf16(w), ((1,), (1,)), jnp.float32) * s).T,
    ),
    # int8 with per-block scales (`s` is [out, blocks]); `deq(W)` = `dequantize_int8(W, s)`
    "(x.T @ deq(W).T).T": ("int8-block", lambda w, s, x: (x.T @ dequantize_int8(w, s).T).T),
    "deq(W) @ x": ("int8-block", lambda w, s, x: dequantize_int8(w, s) @ x),
    "deq(W) @ x in row blocks": ("int8-block", matmul_row_blocks),
    "dot([bf16(deq(W))], bf16 x)->f32": (
        "int8-block",
        lambda w, s, x: _dot(
            lax.optimization_barrier(_bf16(dequantize_int8(w, s))),
            _bf16(x),
            ((1,), (0,)),
            jnp.float32,
        ),
    ),
    "dot(bf16(deq(W)), bf16 x)->f32": (
        "int8-block",
        lambda w, s, x: _dot(_bf16(dequantize_int8(w, s)), _bf16(x), ((1,), (0,)), jnp.float32),
    ),
    "sum_b (W_b @ x_b) * s_b": ("int8-block", _blockwise_dot),
    "sum_b (int8 W_b . 2-digit int8 x_b -> int32) * s_b": ("int8-block", _blockwise_int8_dot),
    # int8 column blocks as separate arrays, a scale per row and block (`split_int8`)
    "sum_b int8 [W_b] . 2-digit int8 x_b -> int32 * s_b": ("int8-split", _int8_split_dot),
}
"""Every formulation `benchmarks/bench_matmul.py` times: name -> (weight format, function of
`(weight[out, in], scale[out] | None, x[in, tokens] float32)` returning float32 `[out, tokens]`).
Names say what is computed: `f32(W)`/`bf16 x` are casts, `.` a `dot_general` with the
accumulator type after `->`, `.T` a transpose (a token-major `[tokens, in]` product).
`[...]` is fenced with `lax.optimization_barrier` (materialized). Formats: `"int8"` is int8 with one
scale per row (`s` is `[out]`), `"int8-block"` int8 with `[out, blocks]` scales.
`bf16 W @ bf16 x` and `(bf16 x.T @ W.T).T` round their output to bfloat16: the latter is the
fastest output head at one token (2 ms against 4.8 ms upcast), but logits rounded to bfloat16
(steps of 0.125 near 25) tie the top two tokens and changed SmolLM2's greedy answer, so they are
measured, never chosen."""

_SPLIT = "sum_b int8 [W_b] . 2-digit int8 x_b -> int32 * s_b"
_ANY = 2**62
FORMULATIONS: dict[str, tuple[tuple[int, int, str], ...]] = {
    # format: ((up to this many tokens, up to this many output rows, formulation), ...), first
    # match wins. Measured with benchmarks/bench_matmul.py (see the module doc).
    "float32": ((_ANY, _ANY, "W @ x"),),
    "bfloat16": (
        (1, _ANY, "(x.T @ f32(W).T).T"),
        (_ANY, _ANY, "dot(W, bf16 x)->f32"),
    ),
    "int8": (
        (1, _ANY, "((x.T @ f32(W).T) * s).T"),
        (64, _ANY, "int8 W . 2-digit int8 x -> int32"),
        (_ANY, _ANY, "dot(bf16(W), bf16 x)->f32 * s"),
    ),
    # ms per matmul, float32 `W @ x` vs the best int8-block candidate (bench_matmul's method, load
    # 2.5-4.7): 1 token: MLP 0.096 vs 0.046, head 3.9 vs 1.4 (the dequantization fuses into the
    # GEMV); 8 tokens: MLP 0.24 vs 1.05, head 7.9 vs 31-52 (nothing fuses; every candidate is
    # 4-7x slower than float32 there, see docs/concepts/weights.md). From 2 to 64 tokens the
    # weight is dequantized to float32 in blocks of `ROW_BLOCK` rows (`matmul_row_blocks`), each
    # block after the activations are known: the bfloat16 copy made the whole matrix at once,
    # and XLA ran those copies for every layer before the first one (Gemma 3 270M, batch 8, one
    # decode step on the loaded machine: 748 ms before, 197 ms after; float32 191-214 ms).
    # Re-measured on jaxlib 0.10.2 (YNNPACK): inside SmolLM2 the row blocks are as fast as
    # float32 or faster at 2-8 tokens and beat the int8 x int8 candidates (per-row copy, a
    # batched dot over the blocks of 32, 2-block scans); see docs/concepts/weights.md.
    "int8-block": (
        (1, _ANY, "(x.T @ deq(W).T).T"),
        (64, _ANY, "deq(W) @ x in row blocks"),
        (_ANY, _ANY, "dot([bf16(deq(W))], bf16 x)->f32"),
    ),
    # the layout of `BatchedInt8` (used for 2 to 64 tokens when `with_batched_int8` made one).
    # ms at 8 tokens, float32 `W @ x` / int8-block chosen / split (parts), one run, load 3-4:
    # head 10.9 / 51.5 / 5.18 (6 parts; 18 parts, the blocks of 32 exactly: 37.5); MLP 0.33 /
    # 1.47 / 0.19 (1 part); down 0.165 / 0.94 / 0.19 (1 part; 48 parts: 2.35). K = 32 dots are
    # too small for XLA's int8 kernel, so the copy is requantized to coarser blocks.
    "int8-split": ((_ANY, _ANY, "sum_b int8 [W_b] . 2-digit int8 x_b -> int32 * s_b"),),
}
"""Per weight format, which `CANDIDATES` formulation runs a matmul of a given token count and
output size (the first entry whose limits both hold)."""

BF16_FORMULATIONS: dict[str, str] = {
    "float32": "W @ x",
    "bfloat16": "dot(W, bf16 x)->f32",
    "int8": "dot(bf16(W), bf16 x)->f32 * s",
    "int8-block": "dot(bf16(deq(W)), bf16 x)->f32",
    "int8-split": _SPLIT,
}
"""The formulation of every weight format under `ExecutionPlan.bf16_compute` (the GPU plan), at
any token count: bfloat16 operands with float32 accumulation (`preferred_element_type`), the
int8 weights dequantized to bfloat16 inside the product (on the GPU XLA fuses the upcast into
the matmul's operand); float32 weights stay float32. Not measured on the CPU, where
`FORMULATIONS` holds (a bfloat16 dot there is 10-20x slower at some shapes)."""


def weight_format(weight: Array, scale: Array | None = None) -> str:
    """`"float32"`, `"bfloat16"`, `"int8"` (one scale per row) or `"int8-block"` (several): the
    format of a stored weight, by its dtype and its scale's shape.

    **Raises:** `TypeError` for any other dtype.
    """
    dtype = jnp.dtype(weight.dtype)
    for name in ("float32", "bfloat16", "int8"):
        if dtype == jnp.dtype(name):
            if name == "int8" and scale is not None and scale.shape[-1] > 1:
                return "int8-block"
            return name
    raise TypeError(f"unsupported weight dtype {dtype}; expected float32, bfloat16 or int8")


def formulation_name(fmt: str, tokens: int, out: int = 1) -> str:
    """The `CANDIDATES` formulation `FORMULATIONS` picks for weight format `fmt` (`"float32"`,
    `"bfloat16"`, `"int8"` or `"int8-block"`), `tokens` tokens and a weight of `out` rows."""
    for max_tokens, max_out, name in FORMULATIONS[fmt]:
        if tokens <= max_tokens and out <= max_out:
            return name
    raise AssertionError("the last FORMULATIONS entry covers every shape")  # pragma: no cover


class BatchedInt8(eqx.Module):
    """A second int8 copy of an int8-block weight, for products of 2 to `max_tokens` tokens.

    XLA's CPU backend has a fast int8 x int8 -> int32 kernel only for a plain
    `[out, in] @ [in, tokens]` dot; the per-block scales of the stored weight need a batched dot
    over blocks, which it runs 5-6x slower than float32 at 8 tokens (`benchmarks/bench_matmul.py`).
    This copy stores the weight as `len(blocks)` column blocks, each an array of its own with a
    scale per row (`split_int8`), so a product is `2 * len(blocks)` plain int8 dots (two-digit
    activations). Built by `with_batched_int8`.

    With `scale=None` the copy is one bfloat16 `[out, in]` array instead, multiplied as
    `dot(W, bf16 x)->f32` (`with_batched_int8(head_parts=None)`).

    **Attributes:** `blocks`: int8 `[out, in / parts]` arrays (or one bfloat16 `[out, in]`);
    `scale`: float32 `[out, parts]` (or `None`); `max_tokens` (static): the largest token count
    that uses the copy; `min_tokens` (static): the smallest (2; the serving engine's prefill-only
    bfloat16 copy, `serving.weights.with_prefill_copy`, starts above 64).
    """

    blocks: tuple[Int8[Array, "out part"] | Float[Array, "out in"], ...]
    scale: Float32[Array, "out parts"] | None
    max_tokens: int = eqx.field(static=True, default=64)
    min_tokens: int = eqx.field(static=True, default=2)


HEAD_PARTS = None
"""The output head's `BatchedInt8` copy: `None`, bfloat16 (the int8 head copies in 2, 3 or 6
column blocks all cost top-1 agreement below 97%, and were slower in the whole model)."""
LAYER_PARTS = 1
"""Column blocks of every other matrix's `BatchedInt8` copy (1: one scale per row)."""


def with_batched_int8(
    model,
    head_parts: int | None = HEAD_PARTS,
    layer_parts: int | None = LAYER_PARTS,
    max_tokens: int = 64,
):
    """`model` with a `BatchedInt8` copy next to every int8-block matrix: opt-in, more memory
    and less accuracy for faster batched decode (the issue #13 trade-off, not the default).

    **Arguments:** `model`: a model whose `Linear` / `Embedding` modules hold int8-block weights
    (`quantization="int8"`); `head_parts`: column blocks of the output head's copy (`lm_head`,
    or the tied embedding), `None` for a bfloat16 copy; `layer_parts`: the same for every other
    matrix; `max_tokens`: the
    largest token count per product (rows times new tokens per row) that uses the copies; one
    token (batch-1 decode) and larger products (prefill) keep the int8 blocks.

    The copies are requantized from the dequantized blocks (a second rounding). Measured on
    SmolLM2-135M-Instruct with `benchmarks/accuracy_quantization.py --copy`'s text at 64 tokens
    per call, against float32 (the int8 blocks alone: perplexity x1.0016, top-1 agreement
    98.05%): the defaults (head bfloat16, layers one scale per row) x1.0029 and 97.31%, within
    issue #13's targets; int8 head copies miss them (6 column blocks 96.53%, one scale per row
    everywhere 95.85%). Decode at batch 8 inside `generate`, one run: 1.26x float32 and 1.8x the
    int8 blocks (see `docs/concepts/weights.md`). Memory: one more byte per layer weight and two
    per head weight (SmolLM2-135M: 151 -> 314 MB).

    **Returns:** the new model (the original is unchanged). Its `named_weights()` also lists the
    copies (`....batched.blocks.N`, `....batched.scale`), which `from_weights` does not accept.

    **Raises:** `TypeError` for a model that is not a `DecoderForCausalLM` (`LlamaForCausalLM`); `ValueError` if a part
    count does not divide a matrix's input size, or if the model holds no int8-block matrix.
    """
    if not isinstance(model, eqx.Module) or not hasattr(model, "lm_head"):
        raise TypeError(
            "with_batched_int8 needs a functional_gen.models.DecoderForCausalLM, got "
            f"{type(model).__name__}"
        )
    found = []
    untied = model.lm_head is not None  # then the embedding is a lookup only

    def convert(path, module):
        if not isinstance(module, (Linear, Embedding)) or module.scale is None:
            return module
        name = jax.tree_util.keystr(path)
        if untied and "embed_tokens" in name:
            return module
        parts = head_parts if ("embed_tokens" in name or "lm_head" in name) else layer_parts
        w = np.asarray(dequantize_int8(module.weight, module.scale))
        found.append(name)
        if parts is None:  # a bfloat16 copy
            copy = BatchedInt8((jnp.asarray(w, jnp.bfloat16),), None, max_tokens)
        else:
            blocks, scale = split_int8(w, parts)
            blocks = tuple(jnp.asarray(b) for b in blocks)
            copy = BatchedInt8(blocks, jnp.asarray(scale), max_tokens)
        return eqx.tree_at(lambda m: m.batched, module, copy, is_leaf=lambda x: x is None)

    def is_module(x):
        return isinstance(x, (Linear, Embedding))

    new = jax.tree_util.tree_map_with_path(convert, model, is_leaf=is_module)
    if not found:
        raise ValueError("with_batched_int8 needs a model with int8 weights (quantization='int8')")
    return new


def matmul(
    weight: Float[Array, "out in"] | Int8[Array, "out in"],
    scale: Float[Array, "out blocks"] | None,
    x: Float[Array, "in tokens"],
    batched: BatchedInt8 | None = None,
    plan: ExecutionPlan | None = None,
) -> Float[Array, "out tokens"]:
    """`weight @ x` for a float32, bfloat16 or int8 (with its `scale`) weight, in float32.

    **Arguments:**

    - `weight`: `[out, in]`, float32, bfloat16, or int8 (then `scale` is required).
    - `scale`: float32 `[out, blocks]` for int8 weights (`dequantize_int8(weight, scale)` is the
      real weight; `blocks` is 1 for one scale per row), else `None`.
    - `x`: float32 `[in, tokens]` activations (feature-major).
    - `batched`: an optional `BatchedInt8` copy of the weight; used instead of it for
      `batched.min_tokens` to `batched.max_tokens` tokens.
    - `plan`: the `ExecutionPlan` (`None`: the CPU plan); its `bf16_compute` picks
      `BF16_FORMULATIONS` instead of `FORMULATIONS`, its `matmul_fences` the fences.

    **Returns:** float32 `[out, tokens]`, computed with the formulation `FORMULATIONS` picks for
    this format and token count (`BF16_FORMULATIONS` under `plan.bf16_compute`).

    **Raises:** `TypeError` for an unsupported weight dtype; `ValueError` for an int8 weight
    without `scale`.
    """
    plan = CPU_PLAN if plan is None else plan
    fences = plan.matmul_fences
    if batched is not None and batched.min_tokens <= x.shape[-1] <= batched.max_tokens:
        if batched.scale is None:  # a bfloat16 copy
            return run_formulation("dot(W, bf16 x)->f32", batched.blocks[0], None, x, fences)
        return run_formulation(_SPLIT, batched.blocks, batched.scale, x, fences)  # BatchedInt8
    fmt = weight_format(weight, scale)
    if fmt == "int8" and scale is None:
        raise ValueError("an int8 weight needs its float32 `scale`")
    if plan.bf16_compute:
        name = BF16_FORMULATIONS[fmt]
    else:
        name = formulation_name(fmt, x.shape[-1], weight.shape[0])
    return run_formulation(name, weight, scale, x, fences)


_MATERIALIZE_X = frozenset({"int8-block", "bfloat16"})
"""Weight formats whose one-token matmul reads `x` from its own buffer (`_materialized`)."""


def _materialized(x: Float[Array, "in tokens"]) -> Float[Array, "in tokens"]:
    """`x` itself, computed into a buffer of its own `[in, tokens]` shape before the matmul.

    At one token XLA's CPU backend turns the upcast-in-operand GEMV into one loop fusion (the
    dot, the weight's upcast and scale, and whatever computed `x`) and vectorizes it along the
    input axis. When `x` is a reshape of another shape (the attention output `[kv_heads, groups,
    head_dim]` before `o_proj`) every vector of `x` is then gathered element by element through
    a `udiv`/`urem` index (LLVM IR of the fusion), and when `x` is an RMSNorm or SiLU it is
    recomputed for every output row: `o_proj` took 0.25 ms per layer in int8 against 0.04 ms for
    `q_proj` of the same shape (profile of a decode step, issue #13). `lax.optimization_barrier`
    does not stop it (XLA drops the barriers before fusion); a conditional does, as its result
    is a buffer. Its predicate is true unless the input is NaN, and both branches return `x`.
    """
    return lax.cond(x[0, 0] == x[0, 0], lambda x: x, lambda x: x + 0.0, x)


def run_formulation(
    name: str,
    weight: Float[Array, "out in"] | Int8[Array, "out in"] | tuple[Int8[Array, "out _"], ...],
    scale: Float[Array, "out blocks"] | None,
    x: Float[Array, "in tokens"],
    fences: bool = True,
) -> Float[Array, "out tokens"]:
    """Compute `weight @ x` with the `CANDIDATES` formulation `name` (float32 result).

    For bfloat16 and int8 weights the product is fenced with `lax.optimization_barrier` on both
    sides: without it XLA's CPU backend fuses the neighbouring ops (a transpose, the softmax
    after the output head) into the dot and picks another kernel, measured 2-30x slower, or for
    a bfloat16 x bfloat16 -> float32 dot one that does not exist ("UNIMPLEMENTED: Unsupported
    element type for DotThunk::Execute: BF16 x BF16 = F32"). Fenced, the dot runs the kernel
    `benchmarks/bench_matmul.py` timed, whatever surrounds it.

    `fences=False` (`ExecutionPlan.matmul_fences` off, the GPU plan) leaves every fence out:
    the plain formulation, which XLA may fuse with its neighbours.
    """
    fmt, fn = CANDIDATES[name]
    x = x.astype(jnp.float32)
    if fmt == "int8":
        scale = scale.reshape(-1)  # [out, 1] -> [out]: the per-row formulations
    if not fences:
        if fn is matmul_row_blocks:
            return matmul_row_blocks(weight, scale, x, fence=False)
        return fn(weight, scale, x).astype(jnp.float32)
    if fmt == "float32":
        return fn(weight, scale, x)
    # the weight goes through the fence with `x`: inside `generate`'s while loop the weight is
    # loop-invariant, and XLA hoisted its upcast out of the loop, which made the loop carry a
    # float32 copy of every matrix (a 4x larger copy per step: int8 decode ran 63 ms/step
    # against 23 ms for the same step outside the loop). Fenced with `x` it is not invariant.
    weight, scale, x = lax.optimization_barrier((weight, scale, x))
    if x.shape[1] == 1 and fmt in _MATERIALIZE_X:
        x = _materialized(x)
    y = fn(weight, scale, x)
    return lax.optimization_barrier(y.astype(jnp.float32))


def embed(
    weight: Float[Array, "vocab hidden"] | Int8[Array, "vocab hidden"],
    scale: Float[Array, "vocab blocks"] | None,
    token_ids: Int[Array, " tokens"],
) -> Float[Array, "hidden tokens"]:
    """Embedding lookup for any weight format: rows `token_ids` of `weight` (dequantized with
    their `scale` for int8), float32, transposed to feature-major `[hidden, tokens]`."""
    rows = weight[token_ids]
    if scale is not None:
        return dequantize_int8(rows, scale[token_ids]).T
    return rows.astype(jnp.float32).T


__all__ = [
    "BLOCK",
    "CANDIDATES",
    "FORMULATIONS",
    "QUANTIZATIONS",
    "ROW_BLOCK",
    "WEIGHT_DTYPES",
    "BatchedInt8",
    "Embedding",
    "Linear",
    "blocks_of",
    "check_quantization",
    "dequantize_int8",
    "embed",
    "formulation_name",
    "matmul",
    "matmul_row_blocks",
    "quantize_int8",
    "run_formulation",
    "weight_format",
    "with_batched_int8",
]


class Linear(eqx.Module):
    """`y = weight @ x + bias` on feature-major activations, for float32, bfloat16 or int8 weights.

    The matmul formulation is chosen per weight format and token count from measurements (see
    the formulations of this module); activations and outputs are float32.

    **Attributes:** `weight`: `Float[Array, "out in"]` (torch layout; float32 or bfloat16) or
    `Int8[Array, "out in"]`; `bias`: float32 `Float[Array, " out"]` or `None`; `scale`: the
    float32 `Float[Array, "out blocks"]` of an int8 weight, one per block of `in / blocks` inputs
    (`dequantize_int8(weight, scale)` is the real weight), else `None`; `batched`:
    `None`, or an opt-in second int8 copy for products of a few tokens
    (`with_batched_int8`).
    """

    weight: Float[Array, "out in"] | Int8[Array, "out in"]
    bias: Float[Array, " out"] | None
    scale: Float[Array, "out blocks"] | None = None
    batched: "BatchedInt8 | None" = None

    def __call__(
        self, x: Float[Array, "in tokens"], plan: ExecutionPlan | None = None
    ) -> Float[Array, "out tokens"]:
        """`weight @ x + bias` (float32 `[out, tokens]`), the product as `matmul` computes it
        under `plan` (`None`: the CPU plan)."""
        y = matmul(self.weight, self.scale, x, self.batched, plan)
        if self.bias is not None:
            y = y + self.bias[:, None]
        return y

    def rows(self, start: int, stop: int) -> "Linear":
        """The output rows `[start, stop)` as a `Linear` of their own (weight, bias and scale
        sliced; `batched` dropped): the view behind a fused projection's Hugging Face names
        (`Attention.q_proj`, `MLP.gate_proj`, ...).

        **Raises:** `ValueError` when `0 <= start < stop <= out` does not hold.
        """
        out = self.weight.shape[0]
        if not 0 <= start < stop <= out:
            raise ValueError(f"rows [{start}, {stop}) are not inside the {out} output rows")
        return Linear(
            weight=self.weight[start:stop],
            bias=None if self.bias is None else self.bias[start:stop],
            scale=None if self.scale is None else self.scale[start:stop],
        )


class Embedding(eqx.Module):
    """Token embedding table (float32, bfloat16, or int8 with per-block scales); lookups are
    float32. **Attributes:** `weight`: `Float[Array, "vocab hidden"]` or
    `Int8[Array, "vocab hidden"]`; `scale`: `Float[Array, "vocab blocks"]` for int8, else
    `None`; `batched`: `None` or the tied output head's second int8 copy
    (`with_batched_int8`)."""

    weight: Float[Array, "vocab hidden"] | Int8[Array, "vocab hidden"]
    scale: Float[Array, "vocab blocks"] | None = None
    batched: "BatchedInt8 | None" = None

    def __call__(self, token_ids: Int[Array, " tokens"]) -> Float[Array, "hidden tokens"]:
        return embed(self.weight, self.scale, token_ids)
