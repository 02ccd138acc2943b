"""Fused projections: the decoder stores q/k/v as ONE `self_attn.qkv_proj` matrix and gate/up as
ONE `mlp.gate_up_proj` matrix, for every family (transformers' Phi-3 stores them so; the other
families' checkpoints have them separate, and `fuse_projections` concatenates them on load).

Why: each decoder layer then runs 4 matrix products instead of 7. XLA's CPU backend emits its own
LLVM kernel for every batch-1 matrix-vector product of a decode step, so fewer products should
compile faster (issue 40 item 6). Measured: -10 to -28% CPU seconds in one process on a loaded
machine (`benchmarks/bench_fused.py`), but 0.95-0.98x only in fresh processes on a quiet one
(`benchmarks/bench_startup.py --baseline`), with decode equal or slightly faster (see
docs/concepts/long_prompts.md). The rows are concatenated as they are:
`qkv_proj` holds the `num_attention_heads * head_dim` query rows, then the
`num_key_value_heads * head_dim` key rows, then as many value rows; `gate_up_proj` the
`intermediate_size` gate rows, then the up rows. int8 weights keep their per-row block scales
(`functional_gen.models.quantization.quantize_int8` quantizes each row on its own, so
concatenating quantized parts equals quantizing the concatenation).

`split_projections` is the inverse, for `DecoderForCausalLM.named_weights` (Hugging Face's
separate names, which every family's `from_weights` accepts).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..quantization import quantize_int8

FUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)
"""Each fused module of a layer and the Hugging Face modules it is built from, in row order."""


def fuse_projections(weights: Mapping[str, Any], num_hidden_layers: int) -> dict[str, Any]:
    """`weights` with each layer's `q_proj`/`k_proj`/`v_proj` concatenated by rows into
    `qkv_proj` and `gate_proj`/`up_proj` into `gate_up_proj` (`.weight`, `.bias` and int8
    `.scale`); weights already fused (Phi-3) and every other name pass unchanged.

    **Arguments:** `weights`: Hugging Face name -> array (numpy or JAX; torch `[out, in]`
    layout); an int8 weight comes with its float32 `[out, blocks]` `.scale`.
    `num_hidden_layers`: the layers to look at.

    **Returns:** a new dict (numpy arrays for the fused entries). When some parts of a fused
    weight are int8 and others float, the float ones are quantized here (per-row blocks, as
    `from_weights` would).

    **Raises:** `ValueError` naming the parts when only some of a fused weight's parts are given,
    when a part is given beside the fused weight, when the parts' input sizes differ, or when an
    int8 part comes without its scale.
    """
    out = dict(weights)
    for i in range(num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in FUSED:
            _fuse_one(out, prefix + fused, [prefix + p for p in parts])
    return out


def _fuse_one(out: dict[str, Any], fused: str, parts: list[str]) -> None:
    names = [p + ".weight" for p in parts]
    given = [n in out for n in names]
    if not any(given):
        return
    if not all(given):
        missing = [n for n, g in zip(names, given) if not g]
        raise ValueError(
            f"missing {missing}: {fused}.weight is built from {names}, given only some of them"
        )
    if fused + ".weight" in out:
        raise ValueError(f"both {fused}.weight and its parts {names} are given")
    ws = [out.pop(n) for n in names]
    scales = [out.pop(p + ".scale", None) for p in parts]
    widths = {tuple(np.shape(w)[1:]) for w in ws}
    if len(widths) != 1 or any(np.ndim(w) != 2 for w in ws):
        shapes = {n: tuple(np.shape(w)) for n, w in zip(names, ws)}
        raise ValueError(f"{fused}.weight cannot be built from parts of shapes {shapes}")
    int8 = [np.dtype(w.dtype) == np.int8 for w in ws]
    if any(int8) and not (all(int8) and all(s is None for s in scales)):
        # (int8 parts without any scale are left for `from_weights` to judge: an int8 weight
        # of a float model is refused there, naming the fused weight)
        for j, (w, s) in enumerate(zip(ws, scales)):
            if np.dtype(w.dtype) != np.int8:
                ws[j], scales[j] = quantize_int8(np.asarray(w, np.float32))
            elif s is None:
                raise ValueError(f"int8 weight {names[j]!r} comes without {parts[j] + '.scale'!r}")
        out[fused + ".scale"] = np.concatenate([np.asarray(s, np.float32) for s in scales])
    out[fused + ".weight"] = np.concatenate([np.asarray(w) for w in ws])
    biases = [out.pop(p + ".bias", None) for p in parts]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            missing = [p + ".bias" for p, b in zip(parts, biases) if b is None]
            raise ValueError(f"missing {missing}: {fused}.bias needs every part's bias")
        out[fused + ".bias"] = np.concatenate([np.asarray(b) for b in biases])


def split_projections(
    weights: Mapping[str, Any], num_hidden_layers: int, q_rows: int, kv_rows: int
) -> dict[str, Any]:
    """The inverse of `fuse_projections`: each layer's `qkv_proj` split by rows into `q_proj`
    (`q_rows` = `num_attention_heads * head_dim`), `k_proj` and `v_proj` (`kv_rows` each), and
    `gate_up_proj` into halves `gate_proj`, `up_proj` (`.weight`, `.bias`, `.scale`); other names
    (including int8 `batched` copies) unchanged. The parts are slices of the given arrays."""
    out = dict(weights)
    bounds = {
        "self_attn.qkv_proj": (0, q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows),
    }
    for i in range(num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in FUSED:
            for suffix in (".weight", ".bias", ".scale"):
                array = out.pop(prefix + fused + suffix, None)
                if array is None:
                    continue
                rows = np.shape(array)[0]
                edges = bounds.get(fused, (0, rows // 2, rows))
                for part, a, b in zip(parts, edges[:-1], edges[1:]):
                    out[prefix + part + suffix] = array[a:b]
    return out
