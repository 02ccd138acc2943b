"""Every supported family against transformers' own PyTorch model of a tiny random config.

Each variant is built with transformers' config class (`Qwen3Config`, `Gemma2Config`,
`Gemma3TextConfig`, `Phi3Config`, `SmolLM3Config`, ...), saved with `save_pretrained`
(safetensors) and loaded by `fg.load_model`: the reference is transformers' eager attention,
float32. The families with a sliding window get a window of 8 tokens, so the 12-token logits and
the 16-token generations cross it.
"""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import UnsupportedConfigError, config_from_hf
from functional_gen.models.attention import RotaryEmbedding

from ..helpers import save_checkpoint

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=100,
    pad_token_id=0,
)
WINDOW = 8
LOCAL_GLOBAL = ["sliding_attention", "sliding_attention", "full_attention"]

VARIANTS = {
    "llama-llama3-rope": (
        "LlamaConfig",
        dict(
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "mistral": ("MistralConfig", dict(sliding_window=WINDOW)),
    "qwen3": (
        "Qwen3Config",
        dict(
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        ),
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            sliding_window=WINDOW,
            query_pre_attn_scalar=24,
            # small caps so that soft-capping changes the result of random weights
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(
            sliding_window=WINDOW,
            layer_types=LOCAL_GLOBAL,
            query_pre_attn_scalar=24,
            rope_parameters={
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
            },
        ),
    ),
    "phi3-partial-rotary": (
        "Phi3Config",
        dict(
            sliding_window=WINDOW,
            rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75
            ),
        ),
    ),
    "phi3-longrope": (
        "Phi3Config",
        dict(
            original_max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                partial_rotary_factor=0.75,
                short_factor=[1.0 + 0.25 * i for i in range(6)],
                long_factor=[2.0 + i for i in range(6)],
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "smollm3": ("SmolLM3Config", dict(no_rope_layers=[1, 0, 1], tie_word_embeddings=True)),
}


def hf_model(cls_name, **overrides):
    """A transformers model of `SMALL` plus `overrides`, weights ~ N(0, 0.2), eager attention."""
    hf_config = getattr(transformers, cls_name)(**{**SMALL, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def family(request, tmp_path_factory):
    """`(name, transformers model, our model, tokenizer, checkpoint directory)` of one variant."""
    cls_name, overrides = VARIANTS[request.param]
    hf = hf_model(cls_name, **overrides)
    path = save_checkpoint(hf, tmp_path_factory.mktemp(request.param))
    model, tokenizer = fg.load_model(path)
    return request.param, hf, model, tokenizer, path


def left_padded(rng, lengths, seq):
    """Token ids, attention mask and positions (`-1` on padding) of a left-padded batch."""
    token_ids = rng.integers(2, 100, (len(lengths), seq))
    mask = np.zeros((len(lengths), seq), np.int64)
    for row, n in enumerate(lengths):
        mask[row, seq - n :] = 1
        token_ids[row, : seq - n] = 0
    positions = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, -1)
    return token_ids, mask, positions


def test_config_maps_the_declared_differences(family):
    """The family's config fields land where the decoder reads them."""
    name, hf, model, _, _ = family
    c = model.config
    assert c.model_type == hf.config.model_type
    gemma = name.startswith("gemma")
    assert (c.rms_norm_unit_offset, c.sandwich_norms, c.scale_embeddings) == (gemma,) * 3
    assert c.hidden_act == ("gelu_pytorch_tanh" if gemma else "silu")
    assert c.qk_norm == (name in ("qwen3", "gemma3_text"))
    if name.startswith("phi3"):
        assert c.rotary_dim == 12
    if name == "smollm3":
        assert c.use_rope == (True, False, True)
    if name == "gemma3_text":
        assert (c.local_rope_theta, c.rope_theta, c.rope_type, c.rope_factor) == (
            10000.0,
            1e6,
            "linear",
            8.0,
        )
        assert c.sliding_window == (WINDOW, WINDOW, None)


def test_logits_of_a_left_padded_batch_match_transformers(family):
    """Logits of every valid position of a left-padded batch within 1e-4 of transformers',
    both through the uncached call and through prefill."""
    _, hf, model, _, _ = family
    seq = 12
    token_ids, mask, positions = left_padded(np.random.default_rng(0), [12, 9], seq)
    with torch.no_grad():
        expected = hf(
            torch.as_tensor(token_ids),
            attention_mask=torch.as_tensor(mask),
            position_ids=torch.as_tensor(np.maximum(positions, 0)),
        ).logits.numpy()
    logits, _ = model(jnp.asarray(token_ids), jnp.asarray(positions), model.init_cache(2, 16))
    valid = mask == 1
    np.testing.assert_allclose(np.asarray(logits)[valid], expected[valid], atol=1e-4, rtol=0)
    last, _ = model.prefill(jnp.asarray(token_ids), jnp.asarray(positions), max_len=16)
    np.testing.assert_allclose(np.asarray(last)[:, 0], expected[:, -1], atol=1e-4, rtol=0)


def test_greedy_generation_equals_transformers_generate(family):
    """16 greedy tokens of `fg.generate` equal transformers' `generate` (crossing the window)."""
    _, hf, model, tokenizer, _ = family
    prompt_ids = [5, 17, 42, 8, 99, 23]
    result = fg.generate(
        model,
        tokenizer,
        [" ".join(f"t{i}" for i in prompt_ids)],
        max_new_tokens=16,
        sampler=fg.samplers.Greedy(),
    )
    with torch.no_grad():
        out = hf.generate(
            torch.as_tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    expected = out[0, len(prompt_ids) :].tolist()
    ours = np.asarray(result.token_ids)[0].tolist()
    if 100 in expected:  # the EOS token ends our row; transformers was told to go on
        expected = expected[: expected.index(100) + 1]
    assert ours[: len(expected)] == expected


def test_prefill_then_decode_equals_the_uncached_forward(family):
    """Prefill of 5 tokens, then one token per call across the window, gives the logits of one
    uncached call over all 14 tokens."""
    _, _, model, _, _ = family
    token_ids = jax.random.randint(jax.random.key(2), (2, 14), 2, 100)
    positions = jnp.broadcast_to(jnp.arange(14), (2, 14))
    full, _ = model(token_ids, positions, model.init_cache(2, 14))
    logits, cache = model.prefill(token_ids[:, :5], positions[:, :5], max_len=14, logits_to_keep=0)
    steps = [logits]
    step = jax.jit(lambda ids, pos, cache: model(ids, pos, cache))  # one compile, 9 calls
    for i in range(5, 14):
        logits, cache = step(token_ids[:, i : i + 1], positions[:, i : i + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5, rtol=0)


@pytest.fixture(scope="module")
def longrope(tmp_path_factory):
    """`(transformers model, our model)` of the Phi-3 longrope variant (original context 64)."""
    cls_name, overrides = VARIANTS["phi3-longrope"]
    hf = hf_model(cls_name, **overrides)
    model, _ = fg.load_model(save_checkpoint(hf, tmp_path_factory.mktemp("longrope")))
    return hf, model


def test_longrope_switches_to_the_long_factors_past_the_original_context(longrope):
    """Past `original_max_position_embeddings` (64), transformers rotates a whole call with the
    long factors: an 80-token prefill, and decode steps crossing 64 after a 60-token prefill
    (the cached keys keep the short factors they were written with), match its logits; the
    short factors alone would not."""
    hf, model = longrope
    ids = np.random.default_rng(3).integers(2, 100, (1, 80))
    with torch.no_grad():
        expected = hf(torch.as_tensor(ids)).logits.numpy()
    positions = jnp.arange(80)[None]
    logits, _ = model(jnp.asarray(ids), positions, model.init_cache(1, 80))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)
    short_only = eqx.tree_at(
        lambda m: m.model.rotary_emb,
        model,
        RotaryEmbedding(model.model.rotary_emb.inv_freq, model.config.rope_attention_factor),
    )
    wrong, _ = short_only(jnp.asarray(ids), positions, model.init_cache(1, 80))
    assert np.abs(np.asarray(wrong) - expected).max() > 1e-2  # the factors matter here
    # decode across the boundary, against transformers' own cache
    with torch.no_grad():
        out = hf(torch.as_tensor(ids[:, :60]), use_cache=True)
        cache, steps = out.past_key_values, []
        for i in range(60, 80):
            out = hf(torch.as_tensor(ids[:, i : i + 1]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits.numpy()[:, -1])
    logits, ours_cache = model.prefill(jnp.asarray(ids[:, :60]), positions[:, :60], max_len=80)
    ours = []
    step = jax.jit(lambda ids, pos, cache: model(ids, pos, cache))  # one compile, 20 calls
    for i in range(60, 80):
        logits, ours_cache = step(
            jnp.asarray(ids[:, i : i + 1]), positions[:, i : i + 1], ours_cache
        )
        ours.append(np.asarray(logits)[:, -1])
    np.testing.assert_allclose(np.stack(ours), np.stack(steps), atol=1e-4, rtol=0)


def test_longrope_factors_are_chosen_per_row(longrope):
    """In a left-padded batch of an 80-token row and a 20-token row, each row's logits equal
    transformers' for that row alone: the long row uses the long factors, the short row the
    short ones (transformers chooses once for the whole batch; a row here never depends on its
    batch mates)."""
    hf, model = longrope
    token_ids, _, positions = left_padded(np.random.default_rng(4), [80, 20], 80)
    logits, _ = model(jnp.asarray(token_ids), jnp.asarray(positions), model.init_cache(2, 80))
    for row, n in enumerate([80, 20]):
        with torch.no_grad():
            expected = hf(torch.as_tensor(token_ids[row : row + 1, 80 - n :])).logits.numpy()
        np.testing.assert_allclose(
            np.asarray(logits)[row, 80 - n :], expected[0], atol=1e-4, rtol=0
        )


@pytest.mark.parametrize("weights", ["int8", "bfloat16"])
def test_int8_and_bfloat16_load_of_gemma3(weights, tmp_path):
    """Gemma 3 with int8 or bfloat16 weights stays close to its float32 logits."""
    cls_name, overrides = VARIANTS["gemma3_text"]
    path = save_checkpoint(hf_model(cls_name, **overrides), tmp_path / "ckpt")
    reference, _ = fg.load_model(path)
    kwargs = {"quantization": "int8"} if weights == "int8" else {"dtype": "bfloat16"}
    model, _ = fg.load_model(path, **kwargs)
    assert model.weight_format == weights
    token_ids = jnp.asarray(np.random.default_rng(1).integers(2, 100, (2, 10)))
    positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
    expected, _ = reference(token_ids, positions, reference.init_cache(2, 10))
    logits, _ = model(token_ids, positions, model.init_cache(2, 10))
    scale = float(jnp.abs(expected).max())
    assert float(jnp.abs(logits - expected).max()) < 0.05 * scale
    agree = float(jnp.mean(logits.argmax(-1) == expected.argmax(-1)))
    assert agree >= 0.9


def tiny_dict(model_type, **extra):
    return {"model_type": model_type, **SMALL, **extra}


@pytest.mark.parametrize(
    "d, message",
    [
        (tiny_dict("gemma3_text", hidden_activation="relu"), "hidden_activation='relu'"),
        (tiny_dict("qwen3", hidden_act="gelu"), "hidden_act='gelu'"),
        (
            tiny_dict("qwen3", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
            "rope_scaling type 'yarn' is not supported",
        ),
        (
            tiny_dict("phi3", rope_scaling={"type": "dynamic", "factor": 2.0}),
            "rope_scaling type 'dynamic' is not supported",
        ),
        (tiny_dict("gemma2", attention_sinks=True), "unknown config.json key.*attention_sinks"),
        (tiny_dict("smollm3", no_rope_layers=[1]), "no_rope_layers has 1 entries"),
        (tiny_dict("gpt_neox"), r"model_type='gpt_neox'.*supported model types"),
    ],
)
def test_unsupported_configs_raise_naming_the_key(d, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        config_from_hf(d)


def test_unsupported_config_is_refused_before_loading_weights(tmp_path):
    """`load_model` refuses the config before it reads weights or compiles anything."""
    (tmp_path / "config.json").write_text(
        json.dumps(tiny_dict("gemma2", hidden_activation="gelu_new"))
    )
    with pytest.raises(UnsupportedConfigError, match="hidden_activation='gelu_new'"):
        fg.load_model(tmp_path)


@pytest.mark.parametrize(
    "cls", ["Qwen3Config", "Gemma2Config", "Gemma3TextConfig", "Phi3Config", "SmolLM3Config"]
)
def test_every_key_transformers_writes_is_known(cls, tmp_path):
    """`save_pretrained` of transformers' own config classes writes only keys we know."""
    getattr(transformers, cls)(**SMALL).save_pretrained(str(tmp_path))
    config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    config_from_hf(transformers.AutoConfig.from_pretrained(str(tmp_path)))


def test_phi4_mini_hub_config_json_is_accepted():
    """The keys of microsoft/Phi-4-mini-instruct's config.json as published (its remote-code
    `auto_map` and knobs included), sizes shrunk: longrope with partial rotary."""
    rotary_half = 6  # head_dim 16 * 0.75 / 2
    published = {
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_phi3.Phi3Config",
            "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
            "AutoTokenizer": "Xenova/gpt-4o",
        },
        "embd_pdrop": 0.0,
        "full_attn_mod": 1,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "interpolate_factor": 1,
        "lm_head_bias": False,
        "mlp_bias": False,
        "model_type": "phi3",
        "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "long_factor": [1.0 + i for i in range(rotary_half)],
            "short_factor": [1.0] * rotary_half,
            "type": "longrope",
        },
        "rope_theta": 10000.0,
        "sliding_window": 262144,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0",
        "use_cache": True,
        **SMALL,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }
    config = config_from_hf(published)
    assert (config.rope_type, config.rotary_dim, config.rope_factor) == ("longrope", 12, 32.0)
    expected = (1 + np.log(32.0) / np.log(4096)) ** 0.5  # _compute_longrope_parameters
    np.testing.assert_allclose(config.rope_attention_factor, expected, rtol=1e-12)
    with pytest.raises(UnsupportedConfigError, match="lm_head_bias=True"):
        config_from_hf({**published, "lm_head_bias": True})
