"""`SequenceState`: continuing, appending, slicing, forking, saving; the cache is reused.

References: one uninterrupted generation of the same length (token for token), fresh
generations of the sliced / forked prompts, and a subprocess that loads a saved state."""

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.testing import CountingModel, tiny_config
from functional_gen.tokenization import tokenizer_fingerprint

from ..helpers import tiny_tokenizer

PROMPTS = ["t3 t4 t5", "t9", "t20 t21 t22 t23 t24 t25 t26"]


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer Llama (real attention and KV cache) and a word-level tokenizer."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    return model, tiny_tokenizer(101)


def ids(result):
    return np.asarray(result.token_ids).tolist()


def test_continuing_greedy_equals_one_call(tiny):
    model, tok = tiny
    whole = fg.generate(model, tok, PROMPTS, max_new_tokens=32, eos_token_id=())
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=16, eos_token_id=())
    second = fg.generate(model, tok, first.state, max_new_tokens=16)
    assert [a + b for a, b in zip(ids(first), ids(second))] == ids(whole)
    # only what the cache lacked was prefilled: nothing on the continuation
    assert second.prefill_tokens == [0, 0, 0]
    np.testing.assert_allclose(
        np.asarray(second.state.weights), np.asarray(whole.state.weights), rtol=1e-5
    )
    assert second.state.texts() == whole.state.texts()


def test_continuing_multinomial_carries_the_row_keys(tiny):
    model, tok = tiny
    kw = dict(sampler=fg.samplers.Multinomial(), eos_token_id=())
    key = jax.random.key(5)
    whole = fg.generate(model, tok, PROMPTS, max_new_tokens=32, key=key, **kw)
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=16, key=key, **kw)
    # no key: the rows keep their own keys; no sampler: the previous call's settings go on
    second = fg.generate(model, tok, first.state, max_new_tokens=16)
    assert [a + b for a, b in zip(ids(first), ids(second))] == ids(whole)
    # the sampler may also be passed again
    again = fg.generate(model, tok, first.state, max_new_tokens=16, **kw)
    assert ids(again) == ids(second)


def test_save_load_in_a_fresh_process_and_continue(tiny, tmp_path):
    model, tok = tiny
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=8, eos_token_id=())
    path = tmp_path / "state.safetensors"
    first.state.save(path)
    expected = ids(fg.generate(model, tok, first.state, max_new_tokens=8, eos_token_id=()))
    script = textwrap.dedent(
        f"""
        import json, jax, numpy as np
        import functional_gen as fg
        from functional_gen.testing import tiny_config
        model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
        state = fg.SequenceState.load({str(path)!r})
        out = fg.generate(model, None, state, max_new_tokens=8, eos_token_id=())
        print(json.dumps(np.asarray(out.token_ids).tolist()))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == expected


def test_a_loaded_state_continues_like_the_original_token_for_token(tiny, tmp_path):
    """Continuing a saved-and-loaded state with a call's arguments gives the tokens (and
    weights) of continuing the original state with the same arguments: greedy with a processor,
    and sampling with the rows' own saved keys."""
    model, tok = tiny
    path = tmp_path / "state.safetensors"
    greedy = dict(processors=[fg.processors.RepetitionPenalty(1.5)], eos_token_id=())
    sampled = dict(
        sampler=fg.samplers.Multinomial(), processors=[fg.processors.TopK(20)], eos_token_id=()
    )
    for kw, key in ((greedy, None), (sampled, jax.random.key(3))):
        first = fg.generate(model, tok, PROMPTS, max_new_tokens=8, key=key, **kw)
        first.state.save(path)
        loaded = fg.SequenceState.load(path, tokenizer=tok)
        kept = fg.generate(model, tok, first.state, max_new_tokens=8, **kw)
        again = fg.generate(model, tok, loaded, max_new_tokens=8, **kw)
        assert ids(again) == ids(kept)
        np.testing.assert_allclose(
            np.asarray(again.state.weights), np.asarray(kept.state.weights), rtol=1e-6
        )
        assert again.state.texts() == kept.state.texts()


DATA = Path(__file__).parent / "data"


def test_a_version_1_file_still_loads_and_continues(tiny):
    """`data/sequence_state_v1.safetensors` was written by the version-1 code (commit 7ecd793)
    from this module's tiny model; `sequence_state_v1.json` holds its rows and the tokens that
    code generated when continuing it greedily by 4. A version-1 file records no tokenizer
    fingerprint: it loads with any tokenizer (and then takes that tokenizer's)."""
    model, tok = tiny
    expected = json.loads((DATA / "sequence_state_v1.json").read_text())
    loaded = fg.SequenceState.load(DATA / "sequence_state_v1.safetensors")
    assert loaded.tokenizer_fingerprint is None
    assert loaded.row_token_ids() == expected["token_ids"]
    more = fg.generate(model, tok, loaded, max_new_tokens=4, eos_token_id=())
    assert ids(more) == expected["continuation"]
    with_tok = fg.SequenceState.load(DATA / "sequence_state_v1.safetensors", tokenizer=tok)
    assert with_tok.texts()[1] == "t9 t3 t92 t75"  # t100, the EOS, is a special token
    assert with_tok.tokenizer_fingerprint == tokenizer_fingerprint(tok)


def test_saved_files_are_version_2_and_record_the_tokenizer(tiny, tmp_path):
    from safetensors import safe_open

    model, tok = tiny
    state = fg.generate(model, tok, PROMPTS, max_new_tokens=2).state
    state.save(tmp_path / "s.safetensors")
    with safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as f:
        header = json.loads(f.metadata()["functional_gen"])
    assert header["version"] == 2
    assert header["tokenizer_fingerprint"] == tokenizer_fingerprint(tok)
    assert header["tokenizer_fingerprint"].startswith("sha256:")
    loaded = fg.SequenceState.load(tmp_path / "s.safetensors")
    assert loaded.tokenizer_fingerprint == header["tokenizer_fingerprint"]
    # a state without a tokenizer records none
    bare = fg.SequenceState.from_token_ids([[1, 2]], vocab_size=101)
    bare.save(tmp_path / "bare.safetensors")
    assert fg.SequenceState.load(tmp_path / "bare.safetensors").tokenizer_fingerprint is None


def test_continuing_a_loaded_state_reuses_the_compiled_program(tiny, tmp_path, caplog):
    """A loaded state has no processor or stop-string states (they belong to the processors,
    which are not saved); a call with its own processors does not read them, so continuing a
    loaded state runs the program that continuing the original state compiled."""
    model, tok = tiny
    kw = dict(processors=[fg.processors.RepetitionPenalty(1.3)], eos_token_id=())
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=8, **kw)
    assert first.state.processor_states is not None
    first.state.save(tmp_path / "state.safetensors")
    loaded = fg.SequenceState.load(tmp_path / "state.safetensors", tokenizer=tok)
    assert loaded.processor_states is None
    kept = fg.generate(model, tok, first.state, max_new_tokens=8, **kw)
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        caplog.clear()
        again = fg.generate(model, tok, loaded, max_new_tokens=8, **kw)
        assert [r for r in caplog.records if "_generate_jit" in r.getMessage()] == []
    assert ids(again) == ids(kept)
    # and the other way round (rows of a loaded state first, another batch bucket): the kept
    # state, which still holds processor states, runs the program the loaded one compiled
    fg.generate(model, tok, loaded[0:2], max_new_tokens=8, **kw)
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        caplog.clear()
        fg.generate(model, tok, first.state[0:2], max_new_tokens=8, **kw)
        assert [r for r in caplog.records if "_generate_jit" in r.getMessage()] == []


def test_appending_text_prefills_exactly_the_appended_tokens(tiny):
    model, tok = tiny
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=6, eos_token_id=())
    more = first.state + " t40 t41"
    result = fg.generate(model, tok, more, max_new_tokens=5, eos_token_id=())
    assert result.prefill_tokens == [2, 2, 2]
    # the same as generating from the full token sequence in one fresh call
    rows = more.row_token_ids()
    fresh = fg.generate(
        model,
        tok,
        fg.SequenceState.from_token_ids(rows, vocab_size=101),
        max_new_tokens=5,
        eos_token_id=(),
    )
    assert fresh.prefill_tokens == [len(r) for r in rows]
    assert ids(result) == ids(fresh)


def test_counting_model_continues_from_every_rows_last_token():
    model, tok = CountingModel(eos_token_id=(31,)), tiny_tokenizer(32)
    first = fg.generate(model, tok, ["t3", "t10 t11"], max_new_tokens=3)
    assert ids(first) == [[4, 5, 6], [12, 13, 14]]
    assert ids(fg.generate(model, tok, first.state + [20], max_new_tokens=2)) == [
        [21, 22],
        [21, 22],
    ]
    # a row that ended on EOS goes on after it when continued
    eos = fg.generate(model, tok, ["t29"], max_new_tokens=5)
    assert ids(eos) == [[30, 31, 0, 0, 0]] and eos.finish_reasons == ["eos"]
    assert ids(fg.generate(model, tok, eos.state, max_new_tokens=2)) == [[0, 1]]


def test_slicing_rows_and_forking_equal_fresh_generations(tiny):
    model, tok = tiny
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=8, eos_token_id=())
    both = fg.generate(model, tok, first.state[[0, 2]], max_new_tokens=8)
    fresh = fg.generate(model, tok, [PROMPTS[0], PROMPTS[2]], max_new_tokens=16, eos_token_id=())
    assert [a + b for a, b in zip(np.asarray(first.token_ids)[[0, 2]].tolist(), ids(both))] == ids(
        fresh
    )
    one = fg.generate(model, tok, first.state[1], max_new_tokens=8)
    assert len(one.texts) == 1
    forked = fg.generate(model, tok, first.state[1:].repeat(2), max_new_tokens=8)
    alone = [
        ids(fg.generate(model, tok, [p], max_new_tokens=16, eos_token_id=()))[0][8:]
        for p in PROMPTS[1:]
    ]
    assert ids(forked) == [alone[0], alone[0], alone[1], alone[1]]


def test_num_return_sequences_equals_separate_rows(tiny):
    model, tok = tiny
    kw = dict(sampler=fg.samplers.Multinomial(), key=jax.random.key(11), max_new_tokens=10)
    forked = fg.generate(model, tok, PROMPTS[:2], num_return_sequences=3, **kw)
    separate = fg.generate(model, tok, [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3, **kw)
    assert ids(forked) == ids(separate)
    assert forked.prefill_tokens == [3, 3, 3, 1, 1, 1]
    assert len({tuple(r) for r in ids(forked)[:3]}) > 1  # the copies really sample apart


def test_crop_then_continue_equals_generating_from_the_prefix(tiny):
    model, tok = tiny
    first = fg.generate(model, tok, PROMPTS, max_new_tokens=12, eos_token_id=())
    n = 9
    cropped = first.state[:, :n]
    assert np.asarray(cropped.lengths).tolist() == [min(n, len(p.split()) + 12) for p in PROMPTS]
    again = fg.generate(model, tok, cropped, max_new_tokens=6, eos_token_id=())
    prefixes = [row[:n] for row in first.state.row_token_ids()]
    fresh = fg.generate(
        model,
        tok,
        fg.SequenceState.from_token_ids(prefixes, vocab_size=101),
        max_new_tokens=6,
        eos_token_id=(),
    )
    assert ids(again) == ids(fresh)
    assert again.prefill_tokens == [1, 1, 1]  # the last kept token is run again


def test_stream_a_batch_and_a_state(tiny):
    model, tok = tiny
    expected = fg.generate(model, tok, PROMPTS, max_new_tokens=10, eos_token_id=())
    stream = fg.stream(model, tok, PROMPTS, max_new_tokens=10, eos_token_id=())
    texts = [""] * 3
    for row, piece in stream:
        texts[row] += piece
    assert texts == expected.texts
    assert ids(stream.result) == ids(expected)
    more = fg.generate(model, tok, expected.state, max_new_tokens=4)
    streamed = fg.stream(model, tok, expected.state, max_new_tokens=4)
    texts = [""] * 3
    for row, piece in streamed:
        texts[row] += piece
    assert texts == more.texts


def test_new_lengths_in_a_bucket_do_not_recompile(tiny, caplog):
    model, tok = tiny
    fg.generate(model, tok, PROMPTS, max_new_tokens=17, eos_token_id=())
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        caplog.clear()
        # 3 rows -> a batch bucket of 4; prompts up to 16 tokens; 17..24 new tokens: one program
        first = fg.generate(model, tok, PROMPTS + ["t1"], max_new_tokens=20, eos_token_id=())
        fg.generate(model, tok, ["t1 t2 t3 t4"] * 3, max_new_tokens=24, eos_token_id=())
        loops = [r for r in caplog.records if "_generate_jit" in r.getMessage()]
        assert loops == []
        fg.generate(model, tok, first.state, max_new_tokens=5)
        caplog.clear()
        fg.generate(model, tok, first.state, max_new_tokens=6)  # same buckets: no new program
        assert [r for r in caplog.records if "_generate_jit" in r.getMessage()] == []


def test_bad_inputs_raise_clear_errors(tiny, tmp_path):
    model, tok = tiny
    state = fg.generate(model, tok, PROMPTS, max_new_tokens=2).state
    other = fg.generate(model, tok, PROMPTS[:2], max_new_tokens=2).state
    with pytest.raises(fg.BatchMismatchError, match="2 rows to one of 3"):
        state + other
    with pytest.raises(fg.BatchMismatchError, match="one entry per row"):
        state + ["t1", "t2"]
    with pytest.raises(IndexError, match="row index 3 out of range"):
        state[3]
    with pytest.raises(IndexError, match="row index 5"):
        state[[0, 5]]
    with pytest.raises(ValueError, match="at least one token"):
        state[:, :0]
    with pytest.raises(ValueError, match="out of range"):
        state + [500]
    bigger = fg.LlamaForCausalLM(tiny_config(num_hidden_layers=3), key=jax.random.key(0))
    with pytest.raises(fg.ModelMismatchError, match="another model"):
        fg.generate(bigger, tok, state, max_new_tokens=2)
    (tmp_path / "x.txt").write_text("not a state")
    with pytest.raises(fg.SequenceStateFormatError, match="not a saved SequenceState"):
        fg.SequenceState.load(tmp_path / "x.txt")
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(fg.SequenceStateFormatError, match="not a saved SequenceState"):
        fg.SequenceState.load(tmp_path / "other.safetensors")
    state.save(tmp_path / "s.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        meta = json.loads(f.metadata()["functional_gen"])
    meta["version"] = 99
    save_file(
        tensors, str(tmp_path / "v99.safetensors"), metadata={"functional_gen": json.dumps(meta)}
    )
    with pytest.raises(fg.SequenceStateFormatError, match="version 99"):
        fg.SequenceState.load(tmp_path / "v99.safetensors")
    with pytest.raises(FileNotFoundError):
        fg.SequenceState.load(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="prefix_lm=True applies to a prompt"):
        fg.generate(model, tok, state, max_new_tokens=2, prefix_lm=True)
    with pytest.raises(ValueError, match="prefill_mode"):
        fg.generate(model, tok, PROMPTS, max_new_tokens=2, prefill_mode="fast")


@pytest.mark.slow
def test_text_then_choice_and_chat_with_cache_reuse(two_layer_model):
    """A `Choice` after free text, then a chat turn that prefills only itself: plumbing that
    holds for any weights (the 2-layer cut of the default model, its real chat template)."""
    model, tokenizer = two_layer_model
    chat = [{"role": "user", "content": "Is the sky blue? Think, then answer yes or no."}]
    first = fg.generate(model, tokenizer, [chat], max_new_tokens=12)
    answer = fg.generate(
        model,
        tokenizer,
        first.state + " Final answer:",
        processors=[fg.processors.Choice([" yes", " no"], tokenizer)],
        max_new_tokens=4,
    )
    assert answer.texts[0] in (" yes", " no")
    # a chat turn: only the new turn is prefilled
    turn = [{"role": "user", "content": "And the grass?"}]
    state = first.state + turn
    second = fg.generate(model, tokenizer, state, max_new_tokens=8)
    new_tokens = len(state.row_token_ids()[0]) - len(first.state.row_token_ids()[0])
    assert second.prefill_tokens == [new_tokens] and 5 < new_tokens < 30
    text = tokenizer.decode(state.row_token_ids()[0])
    assert text.endswith("<|im_start|>user\nAnd the grass?<|im_end|>\n<|im_start|>assistant\n")
