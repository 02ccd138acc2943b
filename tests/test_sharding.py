"""Tensor- and data-parallel generation on 8 CPU devices (a subprocess, since the device count
is fixed when JAX starts): the same tokens as one device, and weights really split."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import functional_gen as fg
    from jax.sharding import PartitionSpec as P

    model, tok = fg.load_model()
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,", "Hello there",
               "The sea is", "Why is the sky blue?", "A, B, C,", "def add(x, y):"]
    greedy = fg.samplers.Greedy()
    ref = fg.generate(model, tok, prompts, max_new_tokens=8, sampler=greedy)
    ids = jnp.asarray([tok(p + " is a very long text indeed")["input_ids"][:4] for p in prompts])
    pos = jnp.broadcast_to(jnp.arange(4), ids.shape)
    ref_logits = model.prefill(ids, pos, max_len=8, logits_to_keep=0)[0]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    json_kw = dict(max_new_tokens=10, processors=[fg.processors.JsonSchema(schema, tok)])
    beam_kw = dict(max_new_tokens=6, sampler=fg.samplers.BeamSearch(2))
    ref_json = fg.generate(model, tok, prompts[:2], **json_kw)
    ref_beam = fg.generate(model, tok, prompts[:2], **beam_kw)
    out = {}
    for shape in [(1, 8), (2, 4), (8, 1)]:
        mesh = fg.make_mesh(*shape)
        sharded = fg.shard(model, mesh)
        res = fg.generate(sharded, tok, prompts, max_new_tokens=8, sampler=greedy)
        logits = sharded.prefill(ids, pos, max_len=8, logits_to_keep=0)[0]
        w = sharded.model.layers[0].mlp.gate_proj.weight
        row = {
            "same_tokens": np.asarray(res.token_ids).tolist() == np.asarray(ref.token_ids).tolist(),
            "logits_diff": float(jnp.max(jnp.abs(logits - ref_logits))),
            "logits_scale": float(jnp.max(jnp.abs(ref_logits))),
            "gate_shard_shape": list(w.addressable_shards[0].data.shape),
            "gate_replicated": bool(w.sharding.is_fully_replicated),
            "head_shard_shape": list(sharded.model.embed_tokens.weight.addressable_shards[0].data.shape),
            "norm_replicated": bool(sharded.model.norm.weight.sharding.is_fully_replicated),
        }
        if shape == (2, 4):
            j = fg.generate(sharded, tok, prompts[:2], **json_kw)
            b = fg.generate(sharded, tok, prompts[:2], **beam_kw)
            row["json_same"] = j.texts == ref_json.texts
            row["beam_same"] = np.asarray(b.token_ids).tolist() == np.asarray(ref_beam.token_ids).tolist()
        out[str(shape)] = row
    try:
        fg.shard(model, fg.make_mesh(1, 8), rules={"model.norm.weight": P("model")})
        out["bad_rule"] = "no error"
    except ValueError as e:
        out["bad_rule"] = str(e)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_generation_on_meshes_of_8_devices():
    run = subprocess.run(
        [sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=1500,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for shape, model_axis in [("(1, 8)", 8), ("(2, 4)", 4), ("(8, 1)", 1)]:
        row = out[shape]
        assert row["same_tokens"], shape
        # float32 sums in another order (all-reduces): within 1e-4 relative to the logits' scale
        # (about 30 here); ~1e-4 absolute
        assert row["logits_diff"] < 1e-4 * max(1.0, row["logits_scale"]), (shape, row)
        # gate_proj [1536, 576] split by output features, the embedding by vocabulary
        assert row["gate_shard_shape"] == [1536 // model_axis, 576]
        assert row["head_shard_shape"] == [49152 // model_axis, 576]
        assert row["gate_replicated"] == (model_axis == 1)
        assert row["norm_replicated"]
    assert out["(2, 4)"]["json_same"] and out["(2, 4)"]["beam_same"]
    assert "cannot be split" in out["bad_rule"] or "not divisible" in out["bad_rule"]
