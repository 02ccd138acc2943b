"""The serving engine on a `("data", "model")` mesh (`Engine(..., mesh=...)`): on 8 CPU devices
in a subprocess (the device count is fixed when JAX starts), a tiny random model's engine gives
every request the tokens `fg.generate` gives it alone on one device, its decode state keeps
the layout of `serving.mesh.decode_state_specs` through every program (slots over `"data"`, key
and value heads over `"model"`), donated states are consumed, and a second run of the same
schedule compiles nothing new; with speculative decoding too (prompt lookup over the paged cache,
a draft model over the lockstep one: guesses verified, and kept). In-process: the refusals,
before anything is placed."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

import functional_gen as fg
from functional_gen.serving.mesh import check_engine_mesh, decode_state_specs
from functional_gen.testing import tiny_config

from ..helpers import tiny_tokenizer

WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    import functional_gen as fg
    from jax.sharding import NamedSharding, PartitionSpec as P
    from functional_gen.serving.mesh import decode_state_specs
    from functional_gen.sharding import mesh_of
    from functional_gen.testing import tiny_config
    from tests.helpers import tiny_tokenizer

    compiles = [0]
    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles[0] += 1
    jax.monitoring.register_event_duration_secs_listener(listen)

    VOCAB = 128
    model = fg.LlamaForCausalLM(tiny_config(vocab_size=VOCAB, eos_token_id=(127,)), key=jax.random.key(0))
    tok = tiny_tokenizer(VOCAB)
    rng = np.random.default_rng(0)

    def alone(request, speculative=None):
        state = fg.SequenceState.from_token_ids([list(request.token_ids)], vocab_size=VOCAB, tokenizer=tok)
        kw = {}
        if request.temperature:  # sampled: the same draws as the engine's with the same guesses
            kw = dict(temperature=request.temperature, key=jax.random.key(request.seed),
                      speculative=speculative)
        out = fg.generate(model, tok, state, max_new_tokens=request.max_new_tokens, **kw)
        k = int(out.state.arrays.length[0]) - len(request.token_ids)
        return [int(t) for t in out.token_ids[0, :k]]

    def laid_out(engine, state):  # every array has the shardings decode_state_specs gives it
        specs = decode_state_specs(state, engine.mesh)
        pairs = zip(jax.tree.leaves(state), jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)))
        return all(x.sharding.is_equivalent_to(NamedSharding(engine.mesh, s), x.ndim) for x, s in pairs)

    def serve(engine, schedule, checks, counts):
        state = engine.init_decode_state()
        checks.append(laid_out(engine, state))
        got = [[] for _ in schedule]
        running, dispatch = {}, 0
        while dispatch <= max(d for d, _, _ in schedule) or running:
            for i, (d, slot, request) in enumerate(schedule):
                if d == dispatch:
                    admission = engine.admit(request, slot) if engine.paged else None
                    state = engine.insert(engine.prefill(request, admission), state, slot)
                    running[slot] = i
            before = state
            state, out = engine.generate(state)
            if out.verified is not None:  # speculative: guesses verified and accepted
                counts[0] += int(np.asarray(out.verified).sum())
                counts[1] += int(np.asarray(out.accepted).sum())
            checks.append(laid_out(engine, state))
            checks.append(before.generation.logits.is_deleted())  # donated and consumed
            for slot, i in list(running.items()):
                got[i] += [t for t in np.asarray(out.token_ids[:, slot]).tolist() if t >= 0]
                if bool(out.done[slot]):
                    del running[slot]
                    engine.release(slot)
            dispatch += 1
        return got

    def prompt(n, period=None):  # `period`: a repeated pattern, for prompt lookup to find
        ids = rng.integers(2, VOCAB - 2, period or n).tolist()
        return (ids * n)[:n]

    lookup = fg.speculative.PromptLookup(num_tokens=3)
    draft = fg.LlamaForCausalLM(tiny_config(vocab_size=VOCAB, eos_token_id=(127,), num_hidden_layers=1),
                                key=jax.random.key(1))

    out = {}
    # every request: a prompt of one bucket (16) and 12 new tokens, so that the references
    # (`alone`) compile once; the requests end at different dispatches as they arrive
    for name, shape, kw, arrivals in [
        # 8 slots, 4 data x 2 model; a narrower width of 2 (replicated: 2 rows over 4)
        ("lockstep", (4, 2), dict(max_slots=8, max_len=48, decode_widths=(2,)),
            [(0, 0, 5), (0, 3, 9), (1, 5, 3), (2, 1, 14), (4, 7, 6)]),
        ("paged", (4, 2), dict(max_slots=4, max_len=48, block_size=8),
            [(0, 0, 5), (0, 2, 11), (2, 3, 12)]),
        # speculative decoding: prompt lookup over the paged cache, a draft model (placed on
        # the mesh by the engine, its cache rows over "data") over the lockstep cache
        ("lookup_paged", (4, 2), dict(max_slots=4, max_len=64, block_size=8, speculative=lookup),
            [(0, 0, 5), (0, 2, 11), (1, 3, 12)]),
        ("draft_lockstep", (4, 2), dict(max_slots=4, max_len=64, speculative=fg.speculative.DraftModel(draft, num_tokens=2)),
            [(0, 0, 5), (1, 3, 9)]),
    ]:
        mesh = fg.make_mesh(*shape)
        engine = fg.serving.Engine(model, tok, mesh=mesh, **kw)
        speculative = kw.get("speculative")
        period = None if speculative is None else 3
        schedule = [(d, s, engine.request(prompt(n, period), 12)) for d, s, n in arrivals]
        if name in ("lockstep", "lookup_paged"):  # one seeded, sampled request
            slot = 2 if name == "lockstep" else 1
            schedule.append((1, slot, engine.request(prompt(7, period), 12, temperature=0.8, seed=3)))
        checks, counts = [], [0, 0]
        got = serve(engine, schedule, checks, counts)
        before = compiles[0]
        again = serve(engine, schedule, checks, [0, 0]) if name != "paged" else got
        new_compiles = compiles[0] - before
        state = engine.init_decode_state()
        cache = (state.paged if engine.paged else state.generation.cache).k[0]
        out[name] = {
            "same": got == [alone(r, speculative) for _, _, r in schedule],
            "speculative": speculative is not None,
            "draft_on_mesh": not isinstance(speculative, fg.speculative.DraftModel)
            or mesh_of(engine.speculation.proposer.draft) == engine.mesh,
            "verified": counts[0],
            "accepted": counts[1],
            "again": again == got,
            "lengths": [len(g) for g in got],
            "checks": all(checks),
            "new_compiles": new_compiles,
            "cache_shard": list(cache.addressable_shards[0].data.shape),
            "cache_shape": list(cache.shape),
        }
    print(json.dumps(out))
    """
)


def test_engine_on_meshes_of_8_devices():
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", WORKER],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name, row in out.items():
        assert row["same"] and row["again"], (name, row)
        assert row["checks"], (name, row)  # laid out after every program; inputs donated
        assert row["draft_on_mesh"], (name, row)
        assert row["new_compiles"] == 0, (name, row)
        assert min(row["lengths"]) > 0, (name, row)
        if row["speculative"]:  # guesses were verified; prompt lookup's were also kept
            assert row["verified"] > 0, (name, row)
            assert row["accepted"] > 0 or name == "draft_lockstep", (name, row)
    # lockstep cache [slots, kv_heads, kv_seq, head_dim]: 8 slots over 4, 2 heads over 2
    s = out["lockstep"]["cache_shape"]
    assert out["lockstep"]["cache_shard"] == [s[0] // 4, s[1] // 2, s[2], s[3]]
    # paged pool [kv_heads, blocks, block_size, head_dim]: heads over "model", no slot axis
    s = out["paged"]["cache_shape"]
    assert out["paged"]["cache_shard"] == [s[0] // 2, s[1], s[2], s[3]]


def _mesh(data, model):
    """A `("data", "model")` mesh of that shape without devices (only its shape is read)."""
    return AbstractMesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def tiny():
    """`(model, tokenizer)`: the tiny random Llama (4 query, 2 key/value heads)."""
    model = fg.LlamaForCausalLM(tiny_config(vocab_size=128), key=jax.random.key(0))
    return model, tiny_tokenizer(128)


def test_decode_state_layout(tiny):
    """Slots over "data" when they divide (else replicated), lockstep key/value heads over
    "model" when they divide (2 heads over 4: replicated, as vLLM replicates them), paged pools
    by heads only, with no slot axis."""
    model, tok = tiny
    state = fg.serving.Engine(model, tok, max_slots=4, max_len=32).init_decode_state()
    specs = decode_state_specs(state, _mesh(4, 2))
    assert specs.generation.cache.k[0] == P("data", "model")  # [slots, kv_heads, kv_seq, head_dim]
    assert specs.generation.token_ids == P("data") and specs.params.logit_bias == P("data")
    assert specs.generation.top_logprobs == P()  # top_logprobs=0: an empty array
    assert decode_state_specs(state, _mesh(2, 4)).generation.cache.k[0] == P("data", None)
    assert decode_state_specs(state, _mesh(8, 1)).generation.length == P()  # 4 slots over 8
    paged = fg.serving.Engine(model, tok, max_slots=4, max_len=32, block_size=8)
    specs = decode_state_specs(paged.init_decode_state(), _mesh(4, 2))
    assert specs.paged.k[0] == P("model")  # [kv_heads, blocks, block_size, head_dim]
    assert specs.paged.block_tables == P("data")


DRAFT_OF_2_HEADS = fg.LlamaForCausalLM(
    tiny_config(vocab_size=128, num_attention_heads=2, num_key_value_heads=1),
    key=jax.random.key(1),
)


@pytest.mark.parametrize(
    "shape, slots, speculative, message",
    [
        ((4, 2), 6, None, "`max_slots`=6 is not divisible by the mesh's data axis (4)"),
        (
            (1, 8),
            8,
            None,
            "model's num_attention_heads=4 is not divisible by the mesh's model axis (8)",
        ),
        (
            (1, 4),
            8,
            fg.speculative.DraftModel(DRAFT_OF_2_HEADS),
            "draft model's num_attention_heads=2 is not divisible by the mesh's model axis (4)",
        ),
    ],
)
def test_engine_refuses_a_mesh_that_does_not_fit(tiny, shape, slots, speculative, message):
    """Slots the data axis does not divide and heads the model axis does not divide (the
    target's, or a draft model's: it is split as the target is) are refused by name (before
    anything is placed or compiled)."""
    with pytest.raises(ValueError) as error:
        check_engine_mesh(_mesh(*shape), tiny[0], slots, speculative)
    assert message in str(error.value)


def test_engine_accepts_a_prompt_lookup_on_a_mesh(tiny):
    """A proposer without weights of its own (or a draft whose heads divide) passes."""
    check_engine_mesh(_mesh(2, 2), tiny[0], 4, fg.speculative.PromptLookup())
    check_engine_mesh(_mesh(1, 2), tiny[0], 4, fg.speculative.DraftModel(DRAFT_OF_2_HEADS))


def test_engine_refuses_a_mesh_argument_that_is_no_mesh(tiny):
    with pytest.raises(TypeError, match=r"`mesh` must be a jax\.sharding\.Mesh"):
        fg.serving.Engine(*tiny, mesh="cpu")
