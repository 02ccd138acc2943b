"""Tensor- and data-parallel generation on 8 CPU devices (a subprocess, since the device count
is fixed when JAX starts): the same tokens as one device, and weights really split.

The model is the default model cut to its first 2 of 30 layers (`two_layer_default_model`: real
weights, vocabulary, tokenizer and every matrix shape): the sharding rules and the collectives are
per layer, and each of the ~20 programs compiles many times faster than with 30 layers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import functional_gen as fg
    from jax.sharding import PartitionSpec as P

    checkpoint = sys.argv[1]
    model, tok = fg.load_model(checkpoint)
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
    ref_two = fg.generate(model, tok, prompts[:2], max_new_tokens=8, sampler=greedy)
    ref_no_eos = fg.generate(model, tok, prompts, max_new_tokens=8, sampler=greedy, eos_token_id=())
    ref_cfg = fg.generate(model, tok, prompts[:2], max_new_tokens=6, guidance_scale=1.5)
    out = {}
    for shape in [(1, 8), (2, 4), (8, 1)]:
        mesh = fg.make_mesh(*shape)
        sharded = fg.shard(model, mesh)
        res = fg.generate(sharded, tok, prompts, max_new_tokens=8, sampler=greedy)
        logits = sharded.prefill(ids, pos, max_len=8, logits_to_keep=0)[0]
        w = sharded.model.layers[0].mlp.gate_up_proj.weight
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
            loaded, _ = fg.load_model(checkpoint, mesh=mesh)  # built on the host, placed into its shards
            lw = loaded.model.layers[0].mlp.gate_up_proj.weight
            row["loaded_shard_shape"] = list(lw.addressable_shards[0].data.shape)
            again = fg.generate(loaded, tok, prompts, max_new_tokens=8, sampler=greedy)
            row["loaded_same"] = np.asarray(again.token_ids).tolist() == np.asarray(ref.token_ids).tolist()
            # streaming, a continued SequenceState and classifier-free guidance on the mesh
            streamed = [""] * 2
            for r, piece in fg.stream(sharded, tok, prompts[:2], max_new_tokens=8, sampler=greedy):
                streamed[r] += piece
            row["stream_same"] = streamed == ref_two.texts
            # (no EOS: a continuation goes on after an EOS, one call would stop there)
            half = fg.generate(sharded, tok, prompts, max_new_tokens=4, sampler=greedy, eos_token_id=())
            rest = fg.generate(sharded, tok, half.state, max_new_tokens=4)
            joined = np.concatenate([np.asarray(half.token_ids), np.asarray(rest.token_ids)], 1)
            row["continue_same"] = joined.tolist() == np.asarray(ref_no_eos.token_ids).tolist()
            for cfg in ("processor", "batched"):
                g = fg.generate(sharded, tok, prompts[:2], max_new_tokens=6, guidance_scale=1.5, cfg=cfg)
                row[f"cfg_{cfg}_same"] = g.texts == ref_cfg.texts
            j = fg.generate(sharded, tok, prompts[:2], **json_kw)
            b = fg.generate(sharded, tok, prompts[:2], **beam_kw)
            row["json_same"] = j.texts == ref_json.texts
            row["beam_same"] = np.asarray(b.token_ids).tolist() == np.asarray(ref_beam.token_ids).tolist()
        out[str(shape)] = row
    from functional_gen.sharding import plan
    from functional_gen.testing import tiny_config

    config = tiny_config(vocab_size=128)
    planned = plan(config, (2, 4), 8, 64, "float32")
    tiny = fg.shard(fg.LlamaForCausalLM(config, key=jax.random.key(0)), fg.make_mesh(2, 4))
    device = jax.devices()[0]
    measured = sum(
        s.data.nbytes for leaf in jax.tree.leaves(tiny) for s in leaf.addressable_shards
        if s.device == device
    )
    out["plan"] = {"planned": planned["weights_bytes"], "measured": measured,
                   "arguments": planned["argument_bytes"], "cache": planned["cache_bytes"],
                   "collectives": sum(planned["collectives"].values())}
    try:
        # a vocabulary of 101 rows cannot be split 8 ways
        fg.shard(fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0)), fg.make_mesh(1, 8))
        out["bad_rule"] = "no error"
    except ValueError as e:
        out["bad_rule"] = str(e)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_generation_on_meshes_of_8_devices(two_layer_default_model):
    checkpoint = two_layer_default_model
    run = subprocess.run(
        [sys.executable, "-c", WORKER, str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=1500,
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
        # gate_up_proj [2 * 1536, 576] split by output features, the embedding by vocabulary
        assert row["gate_shard_shape"] == [2 * 1536 // model_axis, 576]
        assert row["head_shard_shape"] == [49152 // model_axis, 576]
        assert row["gate_replicated"] == (model_axis == 1)
        assert row["norm_replicated"]
    assert out["(2, 4)"]["json_same"] and out["(2, 4)"]["beam_same"]
    for check in ("stream_same", "continue_same", "cfg_processor_same", "cfg_batched_same"):
        assert out["(2, 4)"][check], check
    assert out["(2, 4)"]["loaded_same"] and out["(2, 4)"]["loaded_shard_shape"] == [
        2 * 1536 // 4,
        576,
    ]
    assert "cannot be split" in out["bad_rule"] or "not divisible" in out["bad_rule"]
    # the plan's per-device weight bytes are what fg.shard really puts on a device, and XLA's
    # argument size is weights + cache + the token ids/positions
    plan = out["plan"]
    assert plan["planned"] == plan["measured"]
    assert (
        plan["planned"] + plan["cache"]
        <= plan["arguments"]
        <= plan["planned"] + plan["cache"] + 4096
    )
    assert plan["collectives"] > 0
