"""The KV cache's dtype (`kv_cache_dtype`): chosen by the model (`load_model`,
`with_kv_cache_dtype`), per call (`GenerationOptions`), by the serving engine and the CLI;
followed by every cache a call makes (prompt, classifier-free guidance, draft model); kept by a
saved `SequenceState`; refused with a clear error when unsupported, before anything compiles.

References: a call with a bfloat16 cache equals the same call on `model.with_kv_cache_dtype`
(the option reaches the program); the cache's keys and values equal a float32 run's rounded to
bfloat16 (keys and values are rounded when written, nothing else); a continued saved state
equals one uninterrupted run. The real model against transformers: test_kv_cache_dtype_real.py.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen import cli
from functional_gen.models import kv_cache
from functional_gen.testing import CountingModel, tiny_config

from ..helpers import tiny_tokenizer
from ..loading.test_bad_inputs_before_compiling import counting_compilations

PROMPTS = ["t3 t4 t5", "t9 t10"]


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer Llama (float32 cache: the CPU's default) and a word-level tokenizer."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(3), std=0.2)
    assert model.kv_cache_dtype == "float32"
    return model, tiny_tokenizer(101)


def ids(result):
    return np.asarray(result.token_ids).tolist()


def cache_dtypes(tree):
    """The dtype names of the keys and values of every `KVCache` inside `tree`."""
    caches = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, fg.models.KVCache))
    return {x.dtype.name for c in caches if isinstance(c, fg.models.KVCache) for x in c.k + c.v}


@pytest.mark.parametrize(
    ("value", "name"),
    [("float32", "float32"), ("bfloat16", "bfloat16"), (jnp.bfloat16, "bfloat16"),
     (np.dtype("float32"), "float32"), ("auto", "float32"), (None, "float32")],
)  # fmt: skip
def test_resolve_accepts_names_dtypes_and_auto(value, name):
    assert jax.default_backend() == "cpu"  # "auto" is float32 off a GPU
    assert kv_cache.resolve_kv_cache_dtype(value) == name


def test_auto_is_bfloat16_on_a_gpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert kv_cache.resolve_kv_cache_dtype("auto") == "bfloat16"
    model = eqx.filter_eval_shape(fg.LlamaForCausalLM, tiny_config(), key=jax.random.key(0))
    assert model.kv_cache_dtype == "bfloat16"
    assert jax.eval_shape(lambda: model.init_cache(1, 4)).k[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("bad", ["float16", jnp.float16, "int8", "bf16", 16, True])
def test_unsupported_dtypes_are_refused_everywhere_before_compiling(tiny, bad):
    model, tok = tiny
    message = r"`kv_cache_dtype` must be one of \('float32', 'bfloat16', 'auto'\)"
    with counting_compilations() as seen:
        with pytest.raises(ValueError, match=message):
            fg.generate(model, tok, PROMPTS, max_new_tokens=2, kv_cache_dtype=bad)
        with pytest.raises(ValueError, match=message):
            fg.generate(model, tok, PROMPTS, fg.GenerationOptions(kv_cache_dtype=bad))
        with pytest.raises(ValueError, match=message):
            fg.stream(model, tok, PROMPTS[0], max_new_tokens=2, kv_cache_dtype=bad)
    assert seen == []
    with pytest.raises(ValueError, match=message):
        model.with_kv_cache_dtype(bad)
    with pytest.raises(ValueError, match=message):
        fg.serving.Engine(model, tok, max_slots=2, kv_cache_dtype=bad)
    with pytest.raises(ValueError, match=message):  # before the path is even looked at
        fg.load_model("/no/such/checkpoint", kv_cache_dtype=bad)


def test_cli_takes_the_cache_dtype(capsys):
    parse = cli.build_parser().parse_args
    assert parse(["generate", "x"]).kv_cache_dtype == "auto"
    assert parse(["generate", "x", "--kv-cache-dtype", "bfloat16"]).kv_cache_dtype == "bfloat16"
    assert parse(["serve", "--kv-cache-dtype", "float32"]).kv_cache_dtype == "float32"
    with pytest.raises(SystemExit):
        parse(["serve", "--kv-cache-dtype", "float16"])
    assert "--kv-cache-dtype" in capsys.readouterr().err


def test_a_model_without_the_field_cannot_change_its_dtype():
    model = CountingModel()
    assert model.kv_cache_dtype == "float32"
    assert model.with_kv_cache_dtype("float32") is model
    with pytest.raises(ValueError, match="CountingModel makes float32 caches"):
        model.with_kv_cache_dtype("bfloat16")


def test_with_kv_cache_dtype_changes_the_cache_only(tiny):
    model, _ = tiny
    half = model.with_kv_cache_dtype("bfloat16")
    assert half.kv_cache_dtype == "bfloat16" and model.kv_cache_dtype == "float32"
    assert half.with_kv_cache_dtype(jnp.bfloat16) is half
    assert half.config_fingerprint == model.config_fingerprint
    assert jax.tree.leaves(half) == jax.tree.leaves(model)  # weights shared
    cache = half.init_cache(2, 8)
    assert {x.dtype for x in cache.k + cache.v} == {jnp.dtype(jnp.bfloat16)}
    assert half.first_layers(1).kv_cache_dtype == "bfloat16"


def test_a_bfloat16_cache_holds_the_float32_keys_rounded(tiny):
    """One prefill: the first layer's keys and values in the bfloat16 cache are the float32
    cache's rounded (they are written rounded and nothing before the write changes); later
    layers' differ by more, as attention reads the rounded keys and values of the layers
    before them."""
    model, _ = tiny
    token_ids = jnp.asarray([[5, 6, 7, 8, 9]])
    positions = jnp.arange(5)[None]
    _, full = model(token_ids, positions, model.init_cache(1, 8))
    half = model.with_kv_cache_dtype("bfloat16")
    _, rounded = half(token_ids, positions, half.init_cache(1, 8))
    assert cache_dtypes(rounded) == {"bfloat16"}
    for a, b in ((full.k[0], rounded.k[0]), (full.v[0], rounded.v[0])):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16)), np.asarray(b))
    np.testing.assert_allclose(
        np.asarray(rounded.k[1].astype(jnp.float32)), np.asarray(full.k[1]), atol=0.1, rtol=0.02
    )


def test_the_option_reaches_every_cache_of_the_call(tiny):
    model, tok = tiny
    half = model.with_kv_cache_dtype("bfloat16")
    out = fg.generate(model, tok, PROMPTS, max_new_tokens=6, kv_cache_dtype="bfloat16")
    want = fg.generate(half, tok, PROMPTS, max_new_tokens=6)
    assert ids(out) == ids(want)
    assert cache_dtypes(out.state.cache) == {"bfloat16"}
    np.testing.assert_array_equal(np.asarray(out.logprobs), np.asarray(want.logprobs))
    # classifier-free guidance's unconditional cache lives in the processor state; a draft
    # model's cache in the search state: the call's dtype, whatever the draft's own
    draft = fg.LlamaForCausalLM(tiny_config(num_hidden_layers=1), key=jax.random.key(4))
    assert draft.kv_cache_dtype == "float32"
    final = fg.generation.generate_state(
        model, tok, PROMPTS, max_new_tokens=4, guidance_scale=1.5,
        speculative=fg.speculative.DraftModel(draft, num_tokens=2), kv_cache_dtype="bfloat16",
    )  # fmt: skip
    assert cache_dtypes(final.cache) == {"bfloat16"}
    assert cache_dtypes(final.processor_states) == {"bfloat16"}
    assert cache_dtypes(final.search_state) == {"bfloat16"}
    # beams: every beam a row of the one cache
    beams = fg.generation.generate_state(
        model, tok, PROMPTS, max_new_tokens=3, num_beams=2, kv_cache_dtype="bfloat16"
    )
    assert cache_dtypes(beams.cache) == {"bfloat16"}


def test_a_saved_bfloat16_state_continues_like_one_run(tiny, tmp_path):
    model, tok = tiny
    half = model.with_kv_cache_dtype("bfloat16")
    whole = fg.generate(half, tok, PROMPTS, max_new_tokens=12, eos_token_id=())
    first = fg.generate(half, tok, PROMPTS, max_new_tokens=6, eos_token_id=())
    first.state.save(tmp_path / "s.safetensors")
    loaded = fg.SequenceState.load(tmp_path / "s.safetensors", tok)
    assert cache_dtypes(loaded.cache) == {"bfloat16"}
    for a, b in zip(first.state.cache.k + first.state.cache.v, loaded.cache.k + loaded.cache.v):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # exact round trip
    # continued with the float32 model and no option: in the state's dtype, as one run
    second = fg.generate(model, tok, loaded, max_new_tokens=6, eos_token_id=())
    assert [a + b for a, b in zip(ids(first), ids(second))] == ids(whole)
    assert cache_dtypes(second.state.cache) == {"bfloat16"}
    # another dtype than the state's cache: refused, converted only on request
    with pytest.raises(ValueError, match=r"holds a bfloat16 one.*with_kv_cache_dtype\('float32'"):
        fg.generate(model, tok, loaded, max_new_tokens=2, kv_cache_dtype="float32")
    widened = loaded.with_kv_cache_dtype("float32")
    assert cache_dtypes(widened.cache) == {"float32"} and cache_dtypes(loaded.cache) == {"bfloat16"}
    np.testing.assert_array_equal(  # bfloat16 -> float32 is exact
        np.asarray(widened.cache.k[0]), np.asarray(loaded.cache.k[0].astype(jnp.float32))
    )
    more = fg.generate(model, tok, widened, max_new_tokens=2, kv_cache_dtype="float32")
    assert cache_dtypes(more.state.cache) == {"float32"}
    assert widened.with_kv_cache_dtype("float32") is widened
