"""The README is executed: every ```python block runs, in order, in one namespace, and the
command-line synopsis of the README and of docs/index.md matches `functional-gen generate --help`.

The blocks' `fg.load_model()` gets the default model cut to its first 2 of 30 layers
(`two_layer_default_model`: its real tokenizer, chat template, vocabulary and matrix shapes). What
the blocks assert (shapes, finish reasons, a mask's effect, prefill counts, the saved state's
round trip) does not depend on the weights, and the README's ~12 programs compile faster (the
test: 167 s of CPU instead of 387 with the 30 layers, on the loaded 2-core machine); the real model's logits and tokens are checked against transformers in tests/models/test_llama.py,
its answers in tests/test_cli.py and in the notebooks."""

import re
from pathlib import Path

import pytest

from functional_gen import cli

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def fenced(text: str, language: str | None = None) -> list[str]:
    """The bodies of the fenced code blocks of a Markdown text (of one language, if given)."""
    return [body for lang, body in FENCE.findall(text) if language is None or lang == language]


@pytest.mark.slow
def test_every_python_block_of_the_readme_runs(two_layer_default_model, monkeypatch, capsys):
    import functional_gen as fg

    load_model = fg.load_model

    def load_the_two_layer_model(path=None, **kwargs):
        return load_model(two_layer_default_model if path is None else path, **kwargs)

    monkeypatch.setattr(fg, "load_model", load_the_two_layer_model)
    code = fenced((ROOT / "README.md").read_text(), "python")
    assert len(code) >= 4
    namespace: dict = {"__name__": "readme"}
    for i, source in enumerate(code):
        exec(compile(source, f"README.md python block {i}", "exec"), namespace)
    assert namespace["result"].texts and capsys.readouterr().out  # the stream printed text


def _parser_options() -> tuple[set[str], set[str]]:
    """`(our long names, every flag)` of `functional-gen generate` and `functional-gen chat`."""
    parser = cli.build_parser()
    ours, every = set(), set()
    for command in ("generate", "chat"):
        sub = parser._subparsers._group_actions[0].choices[command]
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            every.update(action.option_strings)
            ours.add(next(o for o in action.option_strings if o.startswith("--")))
    return ours, every


@pytest.mark.parametrize("document", ["README.md", "docs/index.md"])
def test_the_cli_synopsis_matches_help(document, capsys):
    text = (ROOT / document).read_text()
    section = text[text.index("## Command line") :]
    section = section[: section.find("\n## ", 3) if "\n## " in section[3:] else len(section)]
    synopsis = fenced(section)[0]
    ours, every = _parser_options()
    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", synopsis))
    assert listed == ours, (sorted(ours - listed), sorted(listed - ours))
    mentioned = set(re.findall(r"`(-{1,2}[a-z][a-z-]*)", section))
    assert mentioned <= every, sorted(mentioned - every)
    help_text = ""
    for command in ("generate", "chat"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        help_text += capsys.readouterr().out
    assert all(flag in help_text for flag in every), sorted(f for f in every if f not in help_text)
