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
        "--regex", "--json-schema", "--choice", "--grammar", "--max-depth", "--stop",
        "--generation-config", "--typical-p", "--epsilon-cutoff", "--eta-cutoff", "--top-n-sigma",
        "--xtc-threshold", "--xtc-probability", "--mirostat-tau", "--mirostat-eta",
        "--presence-penalty", "--frequency-penalty", "--no-repeat-ngram-size", "--dry-multiplier",
        "--dry-base", "--dry-allowed-length", "--min-new-tokens",
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
        (["--typical-p", "0"], "`typical_p`"),
        (["--dry-base", "2"], "need --dry-multiplier"),
        (["--generation-config", "/nonexistent/gc.json"], "no generation config"),
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
    every = cli.build_parser().parse_args(
        [
            "generate", "x", "--mirostat-tau", "4", "--xtc-probability", "0.3", "--top-n-sigma", "1",
            "--eta-cutoff", "0.001", "--epsilon-cutoff", "0.001", "--typical-p", "0.9", "--top-k", "5",
            "--top-p", "0.9", "--min-p", "0.1", "--temperature", "0.7", "--min-new-tokens", "2",
            "--dry-multiplier", "0.8", "--no-repeat-ngram-size", "3", "--frequency-penalty", "0.2",
            "--presence-penalty", "0.1", "--repetition-penalty", "1.1",
        ]
    )
    built = cli.build_processors(every, eos_token_id=(2, 0), dry_sequence_breakers=[[198]], vocab_size=50)
    assert [type(p).__name__ for p in built] == [
        "RepetitionPenalty", "PresencePenalty", "FrequencyPenalty", "NoRepeatNGram", "DRY",
        "MinNewTokens", "Temperature", "TopK", "TopP", "MinP", "TypicalP", "EpsilonCutoff",
        "EtaCutoff", "TopNSigma", "XTC", "MirostatV2",
    ]
    assert built[5].eos_token_id == (2, 0) and cli.sampling_requested(every)
    assert not cli.sampling_requested(
        cli.build_parser().parse_args(["generate", "x", "--repetition-penalty", "1.2"])
    )


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


@pytest.mark.slow
def test_stop_option_and_generation_config_file(default_model, tmp_path, capsys):
    config = tmp_path / "generation_config.json"
    config.write_text('{"max_new_tokens": 6, "repetition_penalty": 1.3}')
    assert cli.main(["generate", "Count: one, two,", "--raw", "--generation-config", str(config)]) == 0
    captured = capsys.readouterr()
    assert "[6 tokens, finish reason: length" in captured.err
    assert cli.main(["generate", "Count: one, two,", "--raw", "--stop", "four", "--max-new-tokens", "20"]) == 0
    captured = capsys.readouterr()
    assert "finish reason: stop_string" in captured.err and "four" not in captured.out
