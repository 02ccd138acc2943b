"""functional_gen runs without torch: converting the default model, loading it from its GGUF and
generating (raw text and chat) work in a process where `import torch` fails, as on an install
without the `test` extra. torch is only the tests' reference implementation."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Makes torch look uninstalled: `import torch` raises ModuleNotFoundError and
# `importlib.util.find_spec("torch")` returns None (so transformers takes its no-torch paths).
BLOCKER = 'import sys\nsys.modules["torch"] = None\n'

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    try:
        import torch  # noqa: F401
        torch_importable = True
    except ImportError:
        torch_importable = False
    import functional_gen as fg
    from functional_gen.loading import default_gguf_path
    from functional_gen.loading.default_model import converted_default_dir

    prompts = ["The capital of France is", [{"role": "user", "content": "Hi!"}]]
    out = {"torch_importable": torch_importable, "torch_spec": importlib.util.find_spec("torch")}
    for name, path in (("converted", None), ("gguf", default_gguf_path())):
        model, tokenizer = fg.load_model(path)
        result = fg.generate(
            model, tokenizer, prompts, max_new_tokens=6, sampler=fg.samplers.Greedy()
        )
        out[name] = {
            "texts": result.texts,
            "token_ids": result.token_ids.tolist(),
            "chat_ids": tokenizer.apply_chat_template(
                prompts[1], add_generation_prompt=True, tokenize=True, return_dict=False
            ),
        }
    out["converted_dir"] = str(converted_default_dir())
    out["torch_loaded"] = sys.modules.get("torch") is not None
    print(json.dumps(out, default=str))
    """
)


@pytest.mark.slow
def test_convert_load_and_generate_without_torch(tmp_path, default_model):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(blocker), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "FUNCTIONAL_GEN_CACHE": str(tmp_path / "cache"),  # empty: the default model is converted
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["torch_importable"] and out["torch_spec"] is None and not out["torch_loaded"]
    assert Path(out["converted_dir"]).is_relative_to(tmp_path / "cache")
    assert (Path(out["converted_dir"]) / "tokenizer.json").is_file()

    # The same tokens as the in-process default model (converted with torch importable).
    import functional_gen as fg

    model, tokenizer = default_model
    prompts = ["The capital of France is", [{"role": "user", "content": "Hi!"}]]
    expected = fg.generate(
        model, tokenizer, prompts, max_new_tokens=6, sampler=fg.samplers.Greedy()
    )
    chat_ids = tokenizer.apply_chat_template(
        prompts[1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    for name in ("converted", "gguf"):
        assert out[name]["texts"] == expected.texts, name
        assert out[name]["token_ids"] == expected.token_ids.tolist(), name
        assert out[name]["chat_ids"] == list(chat_ids), name
