"""`ExecutionPlan`: the per-backend choices of the decoder, and the GPU plan's code paths run on
the CPU (the plan is overridable, `DecoderForCausalLM.with_plan`).

References: the CPU plan (today's program, compared against transformers elsewhere), a
hand-written numpy softmax attention for the `jax.nn.dot_product_attention` prefill, and the
float32 model of the same (dequantized) weights for int8 and bfloat16 compute. Tiny random
models of `test_families.py`'s shapes, built from transformers' configs (no checkpoint files).
"""

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functional_gen.models import DecoderForCausalLM, ExecutionPlan, config_from_hf
from functional_gen.models.attention import Attention
from functional_gen.models.execution_plan import GPU_COMMAND_BUFFER
from functional_gen.models.quantization import Linear, dequantize_int8

from .test_families import SMALL, VARIANTS, WINDOW, left_padded

transformers = pytest.importorskip("transformers")

# the GPU plan as it runs on a CPU: `implementation=None` (XLA's reference attention); the
# unmodified GPU plan asks for cuDNN, which a CPU does not have
GPU = ExecutionPlan.for_backend("gpu").replace(attention_implementation=None)
CPU = ExecutionPlan.for_backend("cpu")
# bfloat16 compute on a CPU also needs the logits fence: unfenced, XLA folds the transpose after
# the output head into a bfloat16 dot that its CPU backend cannot run ("UNIMPLEMENTED:
# Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32")
GPU_BF16 = GPU.replace(logits_fence=True)
FAMILIES = ["llama-llama3-rope", "gemma3_text", "qwen3", "phi3-partial-rotary", "gemma2"]


@functools.cache
def tiny(name, weights="float32", std=0.2):
    """Our decoder of `test_families.VARIANTS[name]`'s config under the CPU plan, random weights
    ~ N(0, std) stored as `weights` (`"float32"`, `"bfloat16"` or `"int8"`); made once."""
    cls_name, overrides = VARIANTS[name]
    config = config_from_hf(getattr(transformers, cls_name)(**{**SMALL, **overrides}).to_dict())
    kw = {"quantization": "int8"} if weights == "int8" else {"dtype": jnp.dtype(weights)}
    return DecoderForCausalLM(config, key=jax.random.key(0), std=std, plan=CPU, **kw)


@eqx.filter_jit
def _prefill(model, ids, pos, max_len):
    return model.prefill(ids, pos, max_len=max_len, logits_to_keep=0)


@eqx.filter_jit
def _step(model, ids, pos, cache):
    return model(ids, pos, cache)


def greedy(model, ids, pos, steps, max_len):
    """Prefill logits `[batch, seq, vocab]`, then `steps` greedy tokens `[batch, steps]` and their
    logits `[batch, steps, vocab]`, one jitted model call per step."""
    logits, cache = _prefill(model, ids, pos, max_len)
    prefill_logits = logits
    tokens, step_logits = [], []
    position = pos[:, -1:] + 1
    for _ in range(steps):
        token = jnp.argmax(logits[:, -1:], axis=-1)
        tokens.append(token)
        logits, cache = _step(model, token, position, cache)
        step_logits.append(logits)
        position = position + 1
    return prefill_logits, jnp.concatenate(tokens, 1), jnp.concatenate(step_logits, 1)


def batch(seq=2 * WINDOW + 7, lengths=(2 * WINDOW + 7, WINDOW + 2)):
    token_ids, _, positions = left_padded(np.random.default_rng(0), list(lengths), seq)
    return jnp.asarray(token_ids), jnp.asarray(positions)


def primitives(jaxpr) -> set[str]:
    """Every primitive name in a (closed) jaxpr, sub-jaxprs (loops, branches, pjit) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    names |= primitives(sub)
    return names


def test_for_backend_names_and_errors():
    assert ExecutionPlan() == CPU and jax.default_backend() == "cpu"
    assert ExecutionPlan.for_backend() == CPU  # None: jax.default_backend()
    assert ExecutionPlan.for_backend("CUDA") == ExecutionPlan.for_backend("rocm")
    gpu = ExecutionPlan.for_backend("gpu")
    assert not (gpu.attention_fence or gpu.attention_length_buckets or gpu.matmul_fences)
    assert gpu.prefill_attention == "dot_product_attention" and gpu.bf16_compute
    assert hash(gpu) != hash(CPU) and {gpu: 1}[ExecutionPlan.for_backend("cuda")] == 1
    with pytest.raises(ValueError, match="'tpu'"):
        ExecutionPlan.for_backend("tpu")
    with pytest.raises(ValueError, match="prefill_attention 'flash'"):
        CPU.replace(prefill_attention="flash")
    with pytest.raises(ValueError, match="attention_implementation 'triton'"):
        CPU.replace(attention_implementation="triton")
    with pytest.raises(ValueError, match="scan_min_tokens"):
        CPU.replace(scan_min_tokens=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.bf16_compute = False


def test_gpu_compiler_options_are_accepted_by_xla():
    """The per-program options compile (XLA parses every option, whatever the backend: a wrong
    command-buffer value is refused here too), and the CPU plan sets none."""
    assert CPU.jit_compiler_options() == {}
    options = ExecutionPlan.for_backend("gpu").jit_compiler_options()
    assert options == {"xla_gpu_enable_command_buffer": GPU_COMMAND_BUFFER}
    f = jax.jit(lambda x: jnp.cumsum(x) * 2, compiler_options=options)
    np.testing.assert_array_equal(f(jnp.ones(3)), [2.0, 4.0, 6.0])
    with pytest.raises(Exception, match="not a valid enum value"):
        jax.jit(lambda x: x, compiler_options={next(iter(options)): "+WHILE"})(1.0)


def test_with_plan_keeps_the_fingerprint_and_shares_the_weights():
    model = tiny("llama-llama3-rope")
    on_gpu = model.with_plan(GPU)
    assert model.plan == CPU and on_gpu.plan == GPU
    assert on_gpu.config_fingerprint == model.config_fingerprint
    assert on_gpu.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert on_gpu.with_plan(CPU).plan == CPU
    with pytest.raises(TypeError, match="ExecutionPlan"):
        model.with_plan("gpu")
    with pytest.raises(TypeError, match="ExecutionPlan"):
        DecoderForCausalLM(model.config, key=jax.random.key(0), plan="gpu")


@pytest.mark.parametrize("name", ["llama-llama3-rope", "gemma3_text"])
@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_the_gpu_plan_decodes_without_a_conditional(name, weights):
    """A decode step of the GPU plan has no `cond` (no host round trip per layer), over a cache
    long enough for length branches and with rings (Gemma 3); the CPU plan's has them."""
    model = tiny(name, weights)
    cache = model.init_cache(2, 600)
    args = (jnp.ones((2, 1), jnp.int32), jnp.full((2, 1), 3), cache)
    for plan, expected in ((CPU, True), (GPU, False)):
        jaxpr = jax.make_jaxpr(model.with_plan(plan))(*args)
        assert ("cond" in primitives(jaxpr)) == expected, plan.name


@pytest.mark.parametrize("name", FAMILIES)
def test_gpu_plan_equals_cpu_plan(name):
    """float32 weights: the GPU plan's prefill logits (every valid position of a left-padded
    batch across the window) and 6 greedy tokens with their logits equal the CPU plan's.

    The GPU plan exactly as `for_backend("gpu")` makes it: it asks for cuDNN's attention, but a
    float32 cache is outside what cuDNN takes, so the prefill goes to XLA's and runs on a CPU
    (Gemma 2's soft-capping keeps the blocks path)."""
    model = tiny(name)
    ids, pos = batch()
    valid = np.asarray(pos) >= 0
    expected = greedy(model, ids, pos, 6, 48)
    got = greedy(model.with_plan(ExecutionPlan.for_backend("gpu")), ids, pos, 6, 48)
    np.testing.assert_allclose(np.asarray(got[0])[valid], np.asarray(expected[0])[valid], atol=1e-4)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_allclose(got[2], expected[2], atol=1e-4)


def reference_model(model):
    """The float32 model of `model`'s weights (int8 dequantized, bfloat16 upcast)."""

    def to_f32(module):
        if not isinstance(module, Linear) and type(module).__name__ != "Embedding":
            return module
        w = module.weight
        w = dequantize_int8(w, module.scale) if module.scale is not None else w
        return dataclasses.replace(module, weight=w.astype(jnp.float32), scale=None)

    def is_weight(x):
        return isinstance(x, Linear) or type(x).__name__ == "Embedding"

    return jax.tree.map(to_f32, model, is_leaf=is_weight)


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_bf16_compute_is_as_close_to_float32_as_the_cpu_plan(weights):
    """bfloat16 and int8 weights under the GPU plan (bfloat16 operands, float32 accumulation):
    the logits of a left-padded prefill and of 6 decode steps (fed the reference's tokens) stay
    within 2% of the largest logit of the float32 model of the same weights (bfloat16 keeps 8
    bits: ~0.4% per rounded operand); the greedy tokens agree up to the first step where the
    reference's top-two margin is narrower than twice that error."""
    model = tiny("llama-llama3-rope", weights, std=0.05)
    reference = reference_model(model)
    ids, pos = batch()
    valid = np.asarray(pos) >= 0
    ref = greedy(reference, ids, pos, 6, 48)
    errors = {}
    for plan in (CPU, GPU_BF16):
        logits, cache = _prefill(model.with_plan(plan), ids, pos, 48)
        err = np.abs(np.asarray(logits) - np.asarray(ref[0]))[valid].max()
        position = pos[:, -1:] + 1
        for i in range(6):
            logits, cache = _step(model.with_plan(plan), ref[1][:, i : i + 1], position, cache)
            err = max(err, np.abs(np.asarray(logits) - np.asarray(ref[2][:, i : i + 1])).max())
            position = position + 1
        errors[plan.name] = err
    scale = np.abs(np.asarray(ref[0])[valid]).max()
    assert errors["gpu"] < 0.02 * scale, (errors, scale)
    got = greedy(model.with_plan(GPU_BF16), ids, pos, 6, 48)[1]
    top2 = np.sort(np.asarray(ref[2]), axis=-1)[..., -2:]
    wide = (top2[..., 1] - top2[..., 0]) > 2 * errors["gpu"]
    first_narrow = np.argmin(np.concatenate([wide, np.zeros((2, 1), bool)], 1), axis=1)
    for row, n in enumerate(first_narrow):
        np.testing.assert_array_equal(got[row, :n], ref[1][row, :n])


# --- jax.nn.dot_product_attention prefill against a hand-written softmax attention -----------


def numpy_attention(q, k, v, positions, scale, window=None, prefix=None):
    """Reference: `q` `[batch, seq, heads, d]`, `k`, `v` `[batch, seq, kv_heads, d]`, positions
    `[batch, seq]` (`-1` padding). Key `s` is visible to query `t` when both are tokens and
    `pos[s] <= pos[t]` (or `pos[s] < prefix` for prefix-LM), and `pos[t] - pos[s] < window`.
    Returns `[batch, seq, heads, d]`, zeros for padding queries."""
    b, seq, heads, d = q.shape
    groups = heads // k.shape[2]
    out = np.zeros((b, seq, heads, d))
    for r in range(b):
        for t in range(seq):
            pt = positions[r, t]
            if pt < 0:
                continue
            for h in range(heads):
                ok = [
                    positions[r, s] >= 0
                    and (
                        positions[r, s] <= pt
                        or (prefix is not None and positions[r, s] < prefix[r])
                    )
                    and (window is None or pt - positions[r, s] < window)
                    for s in range(seq)
                ]
                scores = np.array([q[r, t, h] @ k[r, s, h // groups] for s in range(seq)]) * scale
                scores = np.where(ok, scores, -np.inf)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[r, t, h] = p @ v[r, :, h // groups]
    return out


def attention_layer(window, scalar=None):
    """An `Attention` of 4 query heads and 2 key/value heads of 16 (its projections unused)."""
    dummy = Linear(jnp.zeros((1, 1)), None)
    return Attention(dummy, dummy, 4, 2, 16, window, query_pre_attn_scalar=scalar)


@pytest.mark.parametrize(
    "case", ["causal", "sliding-window", "prefix-lm", "left-padded", "right-padded", "bf16"]
)
def test_dot_product_prefill_matches_a_numpy_attention(case):
    """`Attention._dot_product_prefill` (GQA, `query_pre_attn_scalar` scale) against
    `numpy_attention` and against the blocks path (`_attend`) on every token query."""
    rng = np.random.default_rng(1)
    batch_size, seq = 2, 13
    lengths = {"left-padded": (13, 8), "right-padded": (13, 9)}.get(case, (13, 13))
    positions = np.full((batch_size, seq), -1)
    for r, n in enumerate(lengths):
        start = 0 if case == "right-padded" else seq - n
        positions[r, start : start + n] = np.arange(n) + (3 if r else 0)
    window = 4 if case in ("sliding-window", "left-padded") else None
    prefix = np.array([5, 2]) if case == "prefix-lm" else None
    layer = attention_layer(window, scalar=24.0)
    dtype = jnp.bfloat16 if case == "bf16" else jnp.float32
    q = rng.normal(size=(2, 2, 16, batch_size, seq)).astype(np.float32)  # kv, groups, d, b, s
    k, v = (rng.normal(size=(batch_size, 2, seq, 16)).astype(np.float32) for _ in range(2))
    k, v = jnp.asarray(k, dtype), jnp.asarray(v, dtype)
    pos = jnp.asarray(positions, jnp.int32)
    args = (jnp.asarray(q), k, v, pos, pos, None if prefix is None else jnp.asarray(prefix))
    got = np.asarray(layer._dot_product_prefill(*args, GPU))  # [kv, groups, d, b, s]
    # the blocks path's attention; a bfloat16 cache under the plan that casts the query to it
    blocks = np.asarray(layer._attend(*args, GPU if case == "bf16" else CPU))
    to_bthd = (3, 4, 0, 1, 2)
    got = got.transpose(to_bthd).reshape(batch_size, seq, 4, 16)
    blocks = blocks.transpose(to_bthd).reshape(batch_size, seq, 4, 16)
    qn = q.transpose(to_bthd).reshape(batch_size, seq, 4, 16)
    kn, vn = (np.asarray(t, np.float32).transpose(0, 2, 1, 3) for t in (k, v))
    if case == "bf16":
        qn = np.asarray(jnp.asarray(qn, jnp.bfloat16), np.float32)
    expected = numpy_attention(qn, kn, vn, positions, 24**-0.5, window, prefix)
    token = positions >= 0
    tol = 2e-2 if case == "bf16" else 1e-5
    np.testing.assert_allclose(got[token], expected[token], atol=tol)
    np.testing.assert_allclose(blocks[token], expected[token], atol=tol)
    assert np.all(got[~token] == 0)


def test_generate_compiles_with_the_plans_compiler_options():
    """`fg.generate_token_ids` under the GPU plan runs the whole `generate` program compiled with
    the plan's per-program options (command buffers for `while` and conditionals, which XLA's
    CPU backend parses and ignores), and gives the CPU plan's greedy tokens."""
    import functional_gen as fg
    from functional_gen.generation import program

    model = tiny("llama-llama3-rope")
    ids = np.random.default_rng(1).integers(3, 100, (2, 7)).tolist()
    options = GPU.compiler_options
    assert model.compiler_options == () and model.with_plan(GPU).compiler_options == options
    assert program.generation_program(()) is program.run_generation
    expected = fg.generate_token_ids(model, ids, max_new_tokens=5, eos_token_id=()).token_ids
    calls = []
    original = program.generation_program

    def spy(compiler_options):
        calls.append(compiler_options)
        return original(compiler_options)

    program.generation_program = spy
    try:
        got = fg.generate_token_ids(
            model.with_plan(GPU), ids, max_new_tokens=5, eos_token_id=()
        ).token_ids
    finally:
        program.generation_program = original
    assert calls == [options]
    assert program.generation_program(options) is program._PROGRAMS[options]
    assert program.generation_program(options) is not program.run_generation
    np.testing.assert_array_equal(got, expected)


def test_stream_steps_compile_with_the_plans_compiler_options():
    """`fg.stream` under the GPU plan calls its per-token step compiled with the plan's options
    (`program.step_program`), and streams the CPU plan's greedy tokens."""
    import functional_gen as fg
    from functional_gen.generation import program, streaming

    from ..helpers import tiny_tokenizer

    model = tiny("llama-llama3-rope")
    tokenizer = tiny_tokenizer(model.config.vocab_size)
    prompt = "t5 t17 t3 t40"
    kwargs = dict(max_new_tokens=4, eos_token_id=())
    expected = fg.generate(model, tokenizer, prompt, **kwargs).token_ids
    calls = []

    def spy(compiler_options):
        calls.append(compiler_options)
        return program.step_program(compiler_options)

    streaming.step_program, original = spy, streaming.step_program
    try:
        stream = fg.stream(model.with_plan(GPU), tokenizer, prompt, **kwargs)
        "".join(stream)
    finally:
        streaming.step_program = original
    assert calls and set(calls) == {GPU.compiler_options}
    assert program.step_program(()) is not program.step_program(GPU.compiler_options)
    np.testing.assert_array_equal(stream.result.token_ids, expected)


def test_serving_engine_programs_compile_with_the_plans_compiler_options():
    """The serving engine's programs that take the model (prefill, the decode dispatch) are
    compiled with the plan's per-program options (`serving.mesh.program`: one jitted function
    per set of options), and the engine under the GPU plan serves the CPU plan's greedy tokens."""
    import functional_gen as fg
    from functional_gen.serving import programs

    from ..helpers import tiny_tokenizer

    model = tiny("llama-llama3-rope")
    tokenizer = tiny_tokenizer(model.config.vocab_size)
    ids = [5, 17, 3, 40, 9]
    expected = fg.generate(model, tokenizer, "t5 t17 t3 t40 t9", max_new_tokens=6, eos_token_id=())
    engine = fg.serving.Engine(model.with_plan(GPU), tokenizer, max_slots=2, max_len=32)
    state = engine.init_decode_state()
    state = engine.insert(engine.prefill(engine.request(ids, 6, temperature=0)), state, 0)
    tokens = []
    while len(tokens) < 6:
        state, out = engine.generate(state)
        tokens += [t for t in out.token_ids[:, 0].tolist() if t >= 0]
    assert tokens[:6] == np.asarray(expected.token_ids[0]).tolist()
    for jitted in (programs.prefill_jit, programs.generate_jit):
        assert GPU.compiler_options in jitted.programs, jitted.__name__
    # programs without the model (the slot writes) need no options
    assert set(programs.insert_jit.programs) == {()}
