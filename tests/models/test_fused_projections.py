"""The fused q/k/v and gate/up weights (`functional_gen.models.families.fused`): built from the
separate Hugging Face weights on load, split back by `named_weights`, int8 scales kept per row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functional_gen.models.families import fused
from functional_gen.models.llama import LlamaForCausalLM
from functional_gen.models.quantization import dequantize_int8, quantize_int8
from functional_gen.testing import tiny_config

RNG = np.random.default_rng(0)


def _separate(bias=False):
    w = {
        "model.layers.0.self_attn.q_proj.weight": RNG.normal(size=(8, 64)).astype(np.float32),
        "model.layers.0.self_attn.k_proj.weight": RNG.normal(size=(4, 64)).astype(np.float32),
        "model.layers.0.self_attn.v_proj.weight": RNG.normal(size=(4, 64)).astype(np.float32),
        "model.layers.0.mlp.gate_proj.weight": RNG.normal(size=(16, 64)).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": RNG.normal(size=(16, 64)).astype(np.float32),
        "model.norm.weight": np.ones(64, np.float32),
    }
    if bias:
        for p in ("q", "k", "v"):
            rows = w[f"model.layers.0.self_attn.{p}_proj.weight"].shape[0]
            w[f"model.layers.0.self_attn.{p}_proj.bias"] = RNG.normal(size=rows).astype(np.float32)
    return w


def test_fuse_stacks_rows_in_hf_order_and_split_inverts_it():
    w = _separate(bias=True)
    f = fused.fuse_projections(w, 1)
    assert sorted(f) == [
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.0.self_attn.qkv_proj.bias",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.norm.weight",
    ]
    qkv = f["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (16, 64)
    np.testing.assert_array_equal(qkv[8:12], w["model.layers.0.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(
        f["model.layers.0.mlp.gate_up_proj.weight"][16:], w["model.layers.0.mlp.up_proj.weight"]
    )
    back = fused.split_projections(f, 1, q_rows=8, kv_rows=4)
    assert sorted(back) == sorted(w)
    for name, array in w.items():
        np.testing.assert_array_equal(back[name], array)


def test_mixed_int8_and_float_parts_quantize_the_float_ones_per_row():
    w = _separate()
    q, s = quantize_int8(w["model.layers.0.self_attn.q_proj.weight"])
    w["model.layers.0.self_attn.q_proj.weight"] = q
    w["model.layers.0.self_attn.q_proj.scale"] = s
    f = fused.fuse_projections(w, 1)
    weight = f["model.layers.0.self_attn.qkv_proj.weight"]
    scale = f["model.layers.0.self_attn.qkv_proj.scale"]
    assert weight.dtype == np.int8 and scale.shape == (16, 2)
    # the reference: the whole float matrix quantized at once (per-row blocks, so the same)
    whole = np.concatenate(
        [
            np.asarray(dequantize_int8(jnp.asarray(q), jnp.asarray(s))),
            w["model.layers.0.self_attn.k_proj.weight"],
            w["model.layers.0.self_attn.v_proj.weight"],
        ]
    )
    ref_q, ref_s = quantize_int8(whole)
    np.testing.assert_array_equal(weight[8:], ref_q[8:])
    np.testing.assert_array_equal(scale[8:], ref_s[8:])
    np.testing.assert_array_equal(weight[:8], q)


def test_partial_or_mismatched_parts_raise_naming_them():
    w = _separate()
    del w["model.layers.0.self_attn.v_proj.weight"]
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.0\.self_attn\.v_proj"):
        fused.fuse_projections(w, 1)
    w = _separate()
    w["model.layers.0.mlp.up_proj.weight"] = np.zeros((16, 32), np.float32)
    with pytest.raises(ValueError, match=r"gate_up_proj\.weight cannot be built.*\(16, 32\)"):
        fused.fuse_projections(w, 1)
    w = _separate()
    w["model.layers.0.self_attn.qkv_proj.weight"] = np.zeros((16, 64), np.float32)
    with pytest.raises(ValueError, match=r"both model\.layers\.0\.self_attn\.qkv_proj\.weight"):
        fused.fuse_projections(w, 1)


def test_model_accepts_the_fused_and_the_separate_form_alike():
    model = LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
    separate = {k: np.asarray(v) for k, v in model.named_weights().items()}
    assert "model.layers.0.self_attn.qkv_proj.weight" not in separate
    fused_form = fused.fuse_projections(separate, model.config.num_hidden_layers)
    a = LlamaForCausalLM.from_weights(model.config, separate)
    b = LlamaForCausalLM.from_weights(model.config, fused_form)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    c = model.config
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    assert qkv.shape == ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, 64)


def test_hf_names_read_the_fused_rows():
    """`self_attn.q_proj` / `k_proj` / `v_proj` and `mlp.gate_proj` / `up_proj` (DESIGN.md's
    Hugging Face attribute names) are views that hold the separate weights `named_weights` gives."""
    model = LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
    separate = model.named_weights()
    layer = model.model.layers[1]
    views = {
        "self_attn.q_proj": layer.self_attn.q_proj,
        "self_attn.k_proj": layer.self_attn.k_proj,
        "self_attn.v_proj": layer.self_attn.v_proj,
        "mlp.gate_proj": layer.mlp.gate_proj,
        "mlp.up_proj": layer.mlp.up_proj,
    }
    for name, linear in views.items():
        np.testing.assert_array_equal(
            np.asarray(linear.weight), np.asarray(separate[f"model.layers.1.{name}.weight"])
        )
    x = jnp.asarray(RNG.normal(size=(64, 3)).astype(np.float32))
    np.testing.assert_allclose(
        np.asarray(layer.self_attn.qkv_proj(x)),
        np.concatenate([np.asarray(views[f"self_attn.{p}_proj"](x)) for p in "qkv"]),
        rtol=1e-5,
        atol=1e-5,
    )
    with pytest.raises(ValueError, match=r"rows \[0, 999\)"):
        layer.self_attn.qkv_proj.rows(0, 999)
