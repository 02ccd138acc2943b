"""Test helpers: tiny random transformers models saved as checkpoints (PyTorch), a checkpoint cut
to its first layers, a switch for the runtime type checks, transformers' GGUF loading with
`open_gguf`'s faster reader, and a speculative `generate` that checks guesses were accepted."""

import contextlib
import json
import shutil
from typing import NamedTuple

import gguf
import numpy as np
import pytest

from functional_gen.generation import generate_with_final_state
from functional_gen.loading.gguf_file import gguf_reader_class


@contextlib.contextmanager
def without_runtime_type_checks():
    """Turn off jaxtyping's runtime checks (the suite runs with `--jaxtyping-packages`) for a test
    of a function's OWN argument errors: a value that contradicts the annotation (2.5 for an
    `int`, a 1-D array for `"out in"`) otherwise fails the annotation check first, with a
    `TypeCheckError` instead of the function's `ValueError`."""
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


@contextlib.contextmanager
def transformers_reads_gguf_with_plain_arrays():
    """While inside, `gguf.GGUFReader` is `gguf_reader_class()`, the reader `open_gguf` uses: for
    the oracles loaded with `from_pretrained(..., gguf_file=...)`, since transformers constructs
    `gguf.GGUFReader` (twice per model, once per tokenizer). The file is parsed by gguf's own
    code either way (the subclass only hands it a plain ndarray view of the memory map;
    tests/loading/test_gguf.py checks that every field and tensor come out equal), about 3x
    faster: ~7 s less per parse of Gemma 3's 262,144-token vocabulary on 2 cores."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", gguf_reader_class())
        yield


def tiny_hf_model(
    model_type="llama",
    *,
    seed=0,
    std=0.2,
    **config,
):
    """A transformers PyTorch model with a tiny random config (weights ~ N(0, std))."""
    import torch
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[model_type]
    defaults = dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=100,
        pad_token_id=0,
    )
    defaults.update(config)
    hf_config = cls(**defaults)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model


def save_checkpoint(model, path, tokenizer=None, **save_kwargs):
    """`save_pretrained` plus a tokenizer (a tiny word-level one if none is given)."""
    model.save_pretrained(str(path), **save_kwargs)
    (tokenizer or tiny_tokenizer(model.config.vocab_size)).save_pretrained(str(path))
    return path


def tiny_tokenizer(vocab_size: int):
    """A word-level tokenizer over `t0 ... t{vocab_size-1}` (transformers fast tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", pad_token="t0", eos_token=f"t{vocab_size - 1}"
    )


def torch_logits(model, token_ids, attention_mask=None):
    """Float32 numpy logits of a transformers model for a batch of token ids."""
    import torch

    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long)
    mask = None if attention_mask is None else torch.as_tensor(np.asarray(attention_mask))
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits.float().numpy()


def first_layers_checkpoint(source, target, layers):
    """A copy of the checkpoint directory `source` with only its first `layers` decoder layers."""
    from safetensors.numpy import load_file, save_file

    target.mkdir(parents=True)
    for f in source.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, target / f.name)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (target / "config.json").write_text(json.dumps(config))
    weights = load_file(source / "model.safetensors")
    kept = {
        k: v
        for k, v in weights.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    save_file(kept, target / "model.safetensors")
    return target


class SpeculationCounts(NamedTuple):
    """Per row of a result (`Int` numpy arrays): guesses verified (`proposed`), accepted
    (`accepted`), verified though the target's processed logits forbid them (`forbidden`), and
    verification steps (`steps`): a `SpeculativeState`'s counts without its padding rows."""

    proposed: np.ndarray
    accepted: np.ndarray
    forbidden: np.ndarray
    steps: np.ndarray


def speculative_generate(model, tokenizer, prompts, options=None, **kwargs):
    """`fg.generate` with speculation (`speculative=` or `assistant_model=` among `kwargs`), and
    its `SpeculationCounts`, from the same run (`generate_with_final_state`).

    Asserts that some guesses were verified AND some accepted: a lossless test passes with
    speculation silently off, so each one checks, through this, that it speculated.
    """
    result, final = generate_with_final_state(model, tokenizer, prompts, options, **kwargs)
    rows = len(result.texts)
    state = final.search_state
    counts = SpeculationCounts(
        *(np.asarray(x)[:rows] for x in (state.proposed, state.accepted, state.forbidden,
                                          state.steps))
    )  # fmt: skip
    proposed, accepted = counts.proposed, counts.accepted
    assert proposed.sum() > 0, f"no guess was verified (per row: {proposed.tolist()})"
    assert accepted.sum() > 0, f"no guess was accepted (verified per row: {proposed.tolist()})"
    assert np.all(accepted <= proposed), (accepted, proposed)
    return result, counts
