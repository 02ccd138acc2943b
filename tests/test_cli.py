"""The `functional-gen` command line."""

import pytest

from functional_gen import cli


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in [
        "--model", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
        "--repetition-penalty", "--seed", "--greedy", "--sample", "--stream", "--raw", "--dtype",
        "--regex", "--json-schema", "--choice", "--grammar", "--max-depth",
    ]:
        assert option in out
    assert "SmolLM2-135M-Instruct" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--top-p", "1.5"], "`top_p` must be in (0.0, 1.0], got 1.5"),
        (["--temperature", "0"], "`temperature` must be in (0.0, inf), got 0.0"),
        (["--greedy", "--temperature", "0.7"], "cannot be combined"),
        (["--model", "/nonexistent/model"], "no such model file or directory"),
    ],
)
def test_bad_options_exit_with_a_clear_message(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hello", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_max_new_tokens_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hello", "--max-new-tokens", "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got 0" in capsys.readouterr().err


def test_processors_follow_the_options_in_transformers_order():
    args = cli.build_parser().parse_args(
        ["generate", "x", "--min-p", "0.1", "--temperature", "0.5", "--repetition-penalty", "1.2"]
    )
    names = [type(p).__name__ for p in cli.build_processors(args)]
    assert names == ["RepetitionPenalty", "Temperature", "MinP"]
    sample = cli.build_parser().parse_args(["generate", "x", "--sample"])
    assert [type(p).__name__ for p in cli.build_processors(sample)] == [
        "Temperature", "TopK", "TopP", "MinP"
    ]


@pytest.mark.slow
def test_generate_prints_the_answer(default_model, capsys):
    assert cli.main(["generate", "What is the capital of France?", "--max-new-tokens", "16"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "The capital of France is Paris."
    assert "finish reason: eos" in captured.err


@pytest.mark.slow
def test_stream_and_raw_print_the_same_text_as_without_stream(default_model, capsys):
    common = ["generate", "Once upon a time", "--raw", "--max-new-tokens", "12", "--greedy"]
    cli.main(common)
    plain = capsys.readouterr().out
    cli.main(common + ["--stream"])
    streamed = capsys.readouterr().out
    assert plain == streamed and len(plain.strip()) > 10


@pytest.mark.slow
def test_structured_options_constrain_the_output(default_model, capsys):
    assert cli.main(["generate", "Pick a colour.", "--choice", "red", "green", "blue"]) == 0
    assert capsys.readouterr().out.strip() in {"red", "green", "blue"}
    assert cli.main(["generate", "A year:", "--raw", "--regex", "(19|20)[0-9]{2}"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out) == 4 and out[:2] in {"19", "20"} and out.isdigit()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--regex", "["], "invalid regex '['"),
        (["--regex", "a", "--choice", "b"], "give at most one of"),
        (["--json-schema", "{not json"], "--json-schema: not valid JSON"),
        (["--max-depth", "3"], "--max-depth applies to --grammar only"),
    ],
)
def test_bad_structured_options_exit_with_a_clear_message(default_model, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hello", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
