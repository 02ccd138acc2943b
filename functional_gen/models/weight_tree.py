"""`fill_weights`: a model's arrays from a mapping of Hugging Face weight names, by module path.

The model's module tree is the mapping table (`DecoderForCausalLM.from_weights`): the arrays
of a shape-only skeleton (`eqx.filter_eval_shape`) are named by their paths
(`model.layers.0.self_attn.qkv_proj.weight`, `path_name`) and taken from the checkpoint under
those names, checked against the config's shapes, quantized to int8 where the skeleton says so.
Split out of `functional_gen.models.decoder`, which holds the layers and the model.
"""

import jax
import jax.numpy as jnp
import numpy as np

from . import quantization as _quantization


def path_name(path) -> str:
    """The dotted name of a pytree path (`jax.tree_util` keys): attributes and tuple indices as
    in a module tree's Hugging Face names (`model.layers.0.mlp.gate_up_proj.weight`), dict keys
    by their key, any other entry by its `str` (the sharding rules match these names too)."""
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        else:
            parts.append(str(entry))
    return ".".join(parts)


def fill_weights(skeleton, config, weights):
    """`skeleton` (a `DecoderForCausalLM` of `jax.ShapeDtypeStruct` leaves) with every array
    from `weights` (name -> numpy or JAX array, the family's renames and fusions already
    applied: `families.hf_weights`), the computed RoPE inverse frequencies from `config`, and
    int8 scales computed where a float matrix is quantized here (or taken beside an int8 one).

    **Returns:** the model, each array in its skeleton's dtype.

    **Raises:** `ValueError` naming the missing or unexpected weights, a weight whose shape
    differs from the config's, an int8 weight without its scale, or an int8 weight for a model
    that is not quantized."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(skeleton)
    names = [path_name(path) for path, _ in leaves]
    computed = {"model.rotary_emb.inv_freq", "model.rotary_emb_local.inv_freq"}
    scales = {n for n in names if n.endswith(".scale")}  # int8 scales: computed if absent
    expected = set(names) - computed - scales
    ignorable = {"lm_head.weight", "lm_head.scale"} if config.tie_word_embeddings else set()
    ignorable |= {n for n in weights if n.endswith("rotary_emb.inv_freq")}
    missing = sorted(expected - set(weights))
    unexpected = sorted(set(weights) - expected - ignorable - scales)
    if missing or unexpected:
        raise ValueError(
            "checkpoint weights do not match the config: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    quantized = {}  # name of a scale -> the scale computed with its weight
    arrays = []
    for name, (_, spec) in zip(names, leaves):
        if name in computed:
            local = name == "model.rotary_emb_local.inv_freq"
            arrays.append(jnp.asarray(config.rope_inv_freq(local=local)))
            continue
        if name in scales:
            arrays.append(jnp.asarray(quantized.pop(name), dtype=jnp.float32))
            continue
        w = weights[name]
        if tuple(w.shape) != tuple(spec.shape):
            raise ValueError(
                f"weight {name!r} has shape {tuple(w.shape)}, expected {tuple(spec.shape)} "
                "from the config"
            )
        if spec.dtype == jnp.int8:
            scale_name = name.removesuffix("weight") + "scale"
            if np.dtype(w.dtype) == np.int8:
                if scale_name not in weights:
                    raise ValueError(f"int8 weight {name!r} comes without {scale_name!r}")
                scale = weights[scale_name]
            else:
                w, scale = _quantization.quantize_int8(np.asarray(w))
            quantized[scale_name] = scale
        elif np.dtype(w.dtype) == np.int8:
            raise ValueError(f"weight {name!r} is int8 but the model is not quantized")
        arrays.append(jnp.asarray(w, dtype=spec.dtype))
    return jax.tree_util.tree_unflatten(treedef, arrays)
