"""The command line's weight options: `--quantization int8` and `--dtype {auto,float32,bfloat16}`."""

import pytest

from functional_gen import cli


def test_help_lists_the_weight_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--quantization" in out and "{auto,float32,bfloat16}" in out


def test_unknown_quantization_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hello", "--quantization", "int4"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("option", [["--quantization", "int8"], ["--dtype", "bfloat16"]])
def test_int8_and_bfloat16_answer_like_float32(option, capsys):
    """The chat answer of the default model is the float32 one ("The capital of France is
    Paris.", see tests/test_cli.py) with int8 or bfloat16 weights too."""
    args = ["generate", "What is the capital of France?", "--max-new-tokens", "16", "--greedy"]
    assert cli.main(args + option) == 0
    assert capsys.readouterr().out.strip() == "The capital of France is Paris."
