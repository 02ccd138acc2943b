"""The `functional-gen` command line."""

import importlib.util
import sys

import jax
import pytest

from functional_gen import cli
from functional_gen.cli import arguments as cli_arguments


@pytest.fixture(scope="module", autouse=True)
def each_model_loaded_once():
    """`load_model` in the commands (`arguments.load_model_from_args`) runs once per distinct model, dtype
    and quantization in this module, and later calls get the same `(model, tokenizer)`: about 20
    commands here load the default model, ~1 s each on 2 cores (safetensors, tokenizer, arrays)
    that repeat what the first load checked. A load that raises is not kept."""
    loaded = {}

    def wrap(load):
        def load_once(path=None, **kwargs):
            key = (
                str(path),
                tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k != "progress")),
            )
            if key not in loaded:
                loaded[key] = load(path, **kwargs)
            return loaded[key]

        return load_once

    with pytest.MonkeyPatch.context() as patch:
        # every command loads through `arguments.load_model_from_args`
        patch.setattr(cli_arguments, "load_model", wrap(cli_arguments.load_model))
        yield


@pytest.fixture(scope="module")
def two_layers(two_layer_default_model, two_layer_model):
    """The default model cut to its first 2 of 30 layers (`two_layer_model`), for the tests whose
    checks do not depend on the weights (the same output through two spellings or through the
    API, a constraint obeyed, what is printed): `.argv` (`-m DIR`) for the commands, `.model`
    and `.tokenizer` for the API. The tests that check the real model's answers ("Paris") keep
    the default model."""
    import types

    model, tokenizer = two_layer_model
    return types.SimpleNamespace(
        argv=["-m", str(two_layer_default_model)], model=model, tokenizer=tokenizer
    )


@pytest.mark.parametrize("torch_imported", [False, True])
def test_the_program_hides_torch_unless_it_is_imported(monkeypatch, torch_imported):
    # `functional-gen` (console_main) runs `main` with torch hidden from transformers, whose config
    # modules would otherwise import it (seconds of every call); a process that already imported
    # torch keeps it.
    sentinel = object()
    # setitem first, so that undoing restores sys.modules["torch"] as it was, whatever we did
    monkeypatch.setitem(sys.modules, "torch", sentinel)
    if not torch_imported:
        monkeypatch.delitem(sys.modules, "torch")
    seen = {}

    def main():
        seen["torch"] = sys.modules.get("torch", "absent")
        seen["spec"] = importlib.util.find_spec("torch") if seen["torch"] is None else "kept"
        return 0

    monkeypatch.setattr(cli, "main", main)
    assert cli.console_main() == 0
    if torch_imported:
        assert seen == {"torch": sentinel, "spec": "kept"}
    else:
        assert seen == {"torch": None, "spec": None}
        with pytest.raises(ImportError):
            import torch  # noqa: F401


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in [
        "--model",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repetition-penalty",
        "--seed",
        "--greedy",
        "--sample",
        "--stream",
        "--raw",
        "--dtype",
        "--regex",
        "--json-schema",
        "--choice",
        "--grammar",
        "--lark-grammar",
        "--max-depth",
        "--stop",
        "--generation-config",
        "--typical-p",
        "--epsilon-cutoff",
        "--eta-cutoff",
        "--top-n-sigma",
        "--xtc-threshold",
        "--xtc-probability",
        "--mirostat-tau",
        "--mirostat-eta",
        "--presence-penalty",
        "--frequency-penalty",
        "--no-repeat-ngram-size",
        "--dry-multiplier",
        "--dry-base",
        "--dry-allowed-length",
        "--min-new-tokens",
        # llama.cpp's and vLLM's names
        "-m",
        "-n",
        "--n-predict",
        "--max-tokens",
        "--temp",
        "--repeat-penalty",
        "--repeat-last-n",
        "--top-nsigma",
        "--typical",
        "--mirostat-lr",
        "--mirostat-ent",
        "-s",
        "-p",
        "-f",
        "-r",
        "--reverse-prompt",
        "-j",
        "--output",
        "--verbose",
        "--quiet",
    ]:
        assert f" {option}" in out, option
    assert "SmolLM2-135M-Instruct" in out


ALIASES = [
    ("--model", "-m"),
    ("--max-new-tokens", "-n"),
    ("--max-new-tokens", "--n-predict"),
    ("--max-new-tokens", "--max-tokens"),
    ("--temperature", "--temp"),
    ("--repetition-penalty", "--repeat-penalty"),
    ("--penalty-last-n", "--repeat-last-n"),
    ("--top-n-sigma", "--top-nsigma"),
    ("--typical-p", "--typical"),
    ("--mirostat-eta", "--mirostat-lr"),
    ("--mirostat-tau", "--mirostat-ent"),
    ("--seed", "-s"),
    ("--stop", "-r"),
    ("--json-schema", "-j"),
]


@pytest.mark.parametrize("ours, theirs", ALIASES, ids=[a for _, a in ALIASES])
def test_llama_cpp_and_vllm_names_are_aliases(ours, theirs):
    value = "3"
    parse = cli.build_parser().parse_args
    assert vars(parse(["generate", "x", theirs, value])) == vars(
        parse(["generate", "x", ours, value])
    )
    assert vars(parse(["generate", "x", theirs, value])) != vars(parse(["generate", "x"]))


def test_prompt_sources(tmp_path, monkeypatch, capsys):
    parse = cli.build_parser().parse_args
    assert cli.read_prompts(parse(["generate", "-p", "hi there"])) == ["hi there"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "first prompt\n\n  \nsecond, with: punctuation\nthird 🙂\n", encoding="utf-8"
    )
    expected = ["first prompt", "second, with: punctuation", "third 🙂"]
    assert cli.read_prompts(parse(["generate", "-f", str(prompts)])) == expected
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(prompts.read_text(encoding="utf-8")))
    assert cli.read_prompts(parse(["generate", "--file", "-"])) == expected
    for argv, message in [
        (["-f", str(tmp_path / "missing.txt")], "no such prompt file"),
        ([], "give exactly one prompt source"),
    ]:
        with pytest.raises(SystemExit):
            cli.main(["generate", *argv])
        assert message in capsys.readouterr().err
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no prompts in"):
        cli.read_prompts(parse(["generate", "-f", str(tmp_path / "blank.txt")]))


def test_options_become_one_generation_config_dictionary():
    parse = cli.build_parser().parse_args
    assert cli.generation_options(parse(["generate", "x"])) == {}
    assert cli.generation_options(
        parse(["generate", "x", "--temp", "0.7", "-n", "5", "-r", "."])
    ) == {"temperature": 0.7, "do_sample": True, "max_new_tokens": 5, "stop_strings": ["."]}
    # --temperature 0 is greedy decoding, as in llama.cpp, vLLM and OpenAI
    assert cli.generation_options(parse(["generate", "x", "--temperature", "0"])) == {
        "do_sample": False
    }
    assert cli.generation_options(parse(["generate", "x", "--sample"])) == {
        **cli.SAMPLING_DEFAULTS,
        "do_sample": True,
    }
    assert cli.generation_options(parse(["generate", "x", "--mirostat-lr", "0.2"])) == {
        "mirostat_eta": 0.2,
        "mirostat": 2,
        "do_sample": True,
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--top-p", "1.5"], "`top_p` must be in (0.0, 1.0], got 1.5"),
        (["--temperature", "-1"], "`temperature` must be in (0.0, inf), got -1.0"),
        (["--greedy", "--temperature", "0.7"], "cannot be combined"),
        (["--model", "/nonexistent/model"], "no such model file or directory"),
        (["--typical-p", "0"], "`typical_p`"),
        (["--dry-base", "2"], "need --dry-multiplier"),
        (["--repeat-last-n", "8"], "--penalty-last-n needs --repetition-penalty"),
        (["--mirostat", "1"], "mirostat=1 is not implemented"),
        (["-p", "again"], "give exactly one prompt source"),
        (["--stream", "--output", "jsonl"], "--stream prints one prompt's text"),
        (["--verbose", "--quiet"], "not allowed with argument"),
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
    err = capsys.readouterr().err
    # one line, naming the value, without the usage block
    assert "expected a positive integer, or -1 for no limit but the context, got '0'" in err
    assert err.count("\n") == 1 and "usage:" not in err


def test_processors_follow_the_options_in_transformers_order():
    args = cli.build_parser().parse_args(
        ["generate", "x", "--min-p", "0.1", "--temperature", "0.5", "--repetition-penalty", "1.2"]
    )
    names = [type(p).__name__ for p in cli.build_processors(args)]
    assert names == ["RepetitionPenalty", "Temperature", "MinP"]
    sample = cli.build_parser().parse_args(["generate", "x", "--sample"])
    assert [type(p).__name__ for p in cli.build_processors(sample)] == [
        "Temperature",
        "TopK",
        "TopP",
        "MinP",
    ]
    every = cli.build_parser().parse_args(
        [
            "generate",
            "x",
            "--mirostat-tau",
            "4",
            "--xtc-probability",
            "0.3",
            "--top-n-sigma",
            "1",
            "--eta-cutoff",
            "0.001",
            "--epsilon-cutoff",
            "0.001",
            "--typical-p",
            "0.9",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
            "--min-p",
            "0.1",
            "--temperature",
            "0.7",
            "--min-new-tokens",
            "2",
            "--dry-multiplier",
            "0.8",
            "--no-repeat-ngram-size",
            "3",
            "--frequency-penalty",
            "0.2",
            "--presence-penalty",
            "0.1",
            "--repetition-penalty",
            "1.1",
        ]
    )
    built = cli.build_processors(every, eos_token_id=(2, 0), vocab_size=50)
    assert [type(p).__name__ for p in built] == [
        "RepetitionPenalty",
        "PresencePenalty",
        "FrequencyPenalty",
        "NoRepeatNGram",
        "DRY",
        "MinNewTokens",
        "Temperature",
        "TopK",
        "TopP",
        "MinP",
        "TypicalP",
        "EpsilonCutoff",
        "EtaCutoff",
        "TopNSigma",
        "XTC",
        "MirostatV2",
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
def test_stream_and_raw_print_the_same_text_as_without_stream(two_layers, capsys):
    common = [
        "generate",
        "Once upon a time",
        "--raw",
        "--max-new-tokens",
        "12",
        "--greedy",
        *two_layers.argv,
    ]
    cli.main(common)
    plain = capsys.readouterr().out
    cli.main(common + ["--stream"])
    streamed = capsys.readouterr().out
    assert plain == streamed and len(plain.strip()) > 10


@pytest.mark.slow
def test_structured_options_constrain_the_output(two_layers, capsys):
    assert (
        cli.main(
            ["generate", "Pick a colour.", "--choice", "red", "green", "blue", *two_layers.argv]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() in {"red", "green", "blue"}
    assert (
        cli.main(["generate", "A year:", "--raw", "--regex", "(19|20)[0-9]{2}", *two_layers.argv])
        == 0
    )
    out = capsys.readouterr().out.strip()
    assert len(out) == 4 and out[:2] in {"19", "20"} and out.isdigit()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--regex", "["], "invalid regex '['"),
        (["--regex", "a", "--choice", "b"], "give at most one of"),
        (["--json-schema", "{not json"], "--json-schema: not valid JSON"),
        (["--max-depth", "3"], "--max-depth applies to --grammar and --lark-grammar only"),
    ],
)
def test_bad_structured_options_exit_with_a_clear_message(two_layers, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hello", *args, *two_layers.argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_stop_option_and_generation_config_file(default_model, tmp_path, capsys):
    config = tmp_path / "generation_config.json"
    config.write_text('{"max_new_tokens": 6, "repetition_penalty": 1.3}')
    assert (
        cli.main(["generate", "Count: one, two,", "--raw", "--generation-config", str(config)]) == 0
    )
    captured = capsys.readouterr()
    assert "[6 tokens, finish reason: length" in captured.err
    assert (
        cli.main(
            ["generate", "Count: one, two,", "--raw", "--stop", "four", "--max-new-tokens", "20"]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "finish reason: stop_string" in captured.err and "four" not in captured.out


@pytest.mark.slow
def test_aliases_give_the_same_output_as_the_long_names(two_layers, capsys):
    long = [
        "generate",
        "Once upon a time",
        "--raw",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--repetition-penalty",
        "1.3",
        "--penalty-last-n",
        "16",
        *two_layers.argv,
    ]
    short = [
        "generate",
        "-p",
        "Once upon a time",
        "--raw",
        "-n",
        "8",
        "--temp",
        "0.7",
        "-s",
        "3",
        "--repeat-penalty",
        "1.3",
        "--repeat-last-n",
        "16",
        *two_layers.argv,
    ]
    assert cli.main(long) == 0
    expected = capsys.readouterr().out
    assert cli.main(short) == 0
    assert capsys.readouterr().out == expected and expected.strip()


PROMPTS = ["The capital of France is", "Two plus two equals", "My favourite colour is"]


@pytest.mark.slow
def test_a_file_of_prompts_is_one_batch_equal_to_separate_runs_and_jsonl_matches_the_api(
    two_layers, tmp_path, capsys
):
    import json

    import numpy as np

    import functional_gen as fg

    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    assert (
        cli.main(
            ["generate", "-f", str(path), "--raw", "-n", "8", "--output", "jsonl", *two_layers.argv]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == PROMPTS and [r["index"] for r in rows] == [0, 1, 2]

    separate = []
    for prompt in PROMPTS:
        assert cli.main(["generate", prompt, "--raw", "-n", "8", *two_layers.argv]) == 0
        separate.append(capsys.readouterr().out.removesuffix("\n"))
    assert [r["text"] for r in rows] == separate
    # --temperature 0 is greedy: the same text as the model's own (greedy) config
    assert (
        cli.main(
            ["generate", PROMPTS[0], "--raw", "-n", "8", "--temperature", "0", *two_layers.argv]
        )
        == 0
    )
    assert capsys.readouterr().out.removesuffix("\n") == separate[0]

    model, tokenizer = two_layers.model, two_layers.tokenizer
    api = fg.generate(model, tokenizer, PROMPTS, max_new_tokens=8)
    for i, row in enumerate(rows):
        n = api.num_tokens[i]
        assert row["text"] == api.texts[i]
        assert row["finish_reason"] == api.finish_reasons[i]
        assert row["token_ids"] == np.asarray(api.token_ids)[i, :n].tolist()
        np.testing.assert_allclose(row["logprobs"], np.asarray(api.logprobs)[i, :n], rtol=1e-6)


@pytest.mark.slow
def test_quiet_prints_nothing_on_stderr_and_verbose_prints_timings(two_layers, capsys):
    assert cli.main(["generate", PROMPTS[1], "--raw", "-n", "8", "--quiet", *two_layers.argv]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.strip()
    assert (
        cli.main(["generate", PROMPTS[1], "--raw", "-n", "8", "--verbose", *two_layers.argv]) == 0
    )
    err = capsys.readouterr().err
    for name in ("load time", "compile time", "prompt tokens", "eval time", "total time"):
        assert f"functional-gen: {name:>16} = " in err, name
    assert "tokens per second" in err and "compilation cache" in err


@pytest.mark.slow
def test_chat_keeps_one_state_and_prefills_only_the_new_turn(default_model, monkeypatch, capsys):
    import io

    monkeypatch.setattr(
        "sys.stdin", io.StringIO("What is the capital of France?\nAnd of Italy?\n/exit\n")
    )
    assert cli.main(["chat", "-n", "16", "-v"]) == 0
    out, err = capsys.readouterr()
    answers = [line for line in out.splitlines() if line.strip()]
    assert len(answers) == 2 and "Paris" in answers[0]
    turns = [line for line in err.splitlines() if line.startswith("[prefilled")]
    assert len(turns) == 2
    first, second = ([int(w) for w in t.replace(",", " ").split() if w.isdigit()] for t in turns)
    # turn 2 prefills its own tokens only, far fewer than the conversation holds
    assert second[0] < 30 and second[-1] > first[-1] > second[0]


@pytest.mark.slow
def test_beam_search_and_guidance_options(two_layers, capsys):
    import functional_gen as fg

    model, tokenizer = two_layers.model, two_layers.tokenizer
    assert (
        cli.main(
            [
                "generate",
                "The capital of France is",
                "--raw",
                "-n",
                "8",
                "--num-beams",
                "3",
                "--num-return-sequences",
                "2",
                "--length-penalty",
                "1.0",
                *two_layers.argv,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    expected = fg.generate(
        model,
        tokenizer,
        "The capital of France is",
        max_new_tokens=8,
        sampler=fg.samplers.BeamSearch(3),
        num_return_sequences=2,
    )
    assert printed == "".join(
        f"{j + 1}. [score {float(score):.4f}] {text}\n"
        for j, (text, score) in enumerate(zip(expected.texts, expected.sequences_scores))
    )
    assert (
        cli.main(
            [
                "generate",
                "The sea",
                "--raw",
                "-n",
                "6",
                "--guidance-scale",
                "1.5",
                "--negative-prompt",
                "The mountain",
                "--cfg",
                "batched",
                *two_layers.argv,
            ]
        )
        == 0
    )
    guided = capsys.readouterr().out.strip()
    same = fg.generate(
        model,
        tokenizer,
        "The sea",
        max_new_tokens=6,
        guidance_scale=1.5,
        negative_prompt="The mountain",
        cfg="batched",
    )
    assert guided == same.texts[0].strip()
    with pytest.raises(SystemExit):
        cli.main(["generate", "hi", "--negative-prompt", "x"])
    assert "need --guidance-scale" in capsys.readouterr().err


@pytest.mark.slow
def test_top_logprobs_in_jsonl(two_layers, capsys):
    import json

    import numpy as np

    import functional_gen as fg

    model, tokenizer = two_layers.model, two_layers.tokenizer
    assert (
        cli.main(
            [
                "generate",
                "Hello",
                "--raw",
                "-n",
                "4",
                "--output",
                "jsonl",
                "--top-logprobs",
                "3",
                *two_layers.argv,
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out.strip())
    expected = fg.generate(model, tokenizer, "Hello", max_new_tokens=4, top_logprobs=3)
    ids = np.asarray(expected.top_token_ids)[0]
    assert [[a["token_id"] for a in step] for step in row["top_logprobs"]] == ids[
        : len(row["top_logprobs"])
    ].tolist()
    # each alternative carries its text beside its id and logprob, as OpenAI's and vLLM's do
    top = np.asarray(expected.top_logprobs)[0]
    for step, want_ids, want_lps in zip(row["top_logprobs"], ids, top):
        assert [a["token"] for a in step] == [tokenizer.decode([int(i)]) for i in want_ids]
        np.testing.assert_allclose([a["logprob"] for a in step], want_lps, rtol=1e-5)


def test_serve_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--host",
        "--port",
        "--max-slots",
        "--decode-widths",
        "--block-size",
        "--num-blocks",
        "--speculative",
        "--draft-model",
        "--speculative-tokens",
        "--tensor-parallel-size",
        "--data-parallel-size",
        "--api-key",
        "--precompile",
    ):
        assert flag in text
    assert "127.0.0.1" in text


def test_serve_refuses_a_bad_port(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--port", "0"])
    assert exit_.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_serve_refuses_a_decode_width_over_max_slots(capsys):
    """`--decode-widths` wider than `--max-slots` is refused before the model loads, naming both."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--max-slots", "4", "--decode-widths", "1", "6"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--decode-widths 1 6" in err and "--max-slots (4)" in err


def test_serve_refuses_num_blocks_without_block_size(capsys):
    """`--num-blocks` sizes a paged cache: without `--block-size` it is refused before the model
    loads."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--num-blocks", "64"])
    assert exit_.value.code == 2
    assert "--num-blocks 64 needs --block-size" in capsys.readouterr().err


def test_serve_refuses_no_preemption_without_block_size(capsys):
    """`--no-preemption` is about the paged cache's blocks: without `--block-size` it is refused
    before the model loads."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--no-preemption"])
    assert exit_.value.code == 2
    assert "--no-preemption needs --block-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculative", "draft-model"], "--speculative draft-model and --draft-model None"),
        (["--draft-model", "d"], "--speculative None and --draft-model d"),
    ],
)
def test_serve_refuses_speculative_combinations(capsys, argv, message):
    """A draft model without `--speculative draft-model` (or the reverse) is refused before the
    model loads, naming the values. (`--speculative` with `--block-size` is served.)"""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_builds_a_paged_speculative_engine(monkeypatch):
    """`--block-size` with `--speculative prompt-lookup` builds a paged engine that speculates
    and preempts, or with `--no-preemption` reserves worst cases (the model load and the server
    are replaced: a tiny random Llama, no server started)."""
    from functional_gen.cli import serve as cli_serve
    from functional_gen.serving.paged_speculative import SpeculativePagedKV
    from functional_gen.testing import tiny_config

    from .helpers import tiny_tokenizer

    if cli_serve.serving_app is None:
        pytest.skip("the serve extra is not installed")
    import functional_gen as fg

    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
    engines = []
    monkeypatch.setattr(
        cli_serve, "load_model_from_args", lambda *a, **k: (model, tiny_tokenizer(101))
    )
    monkeypatch.setattr(cli_serve.serving_app, "serve", lambda engine, **k: engines.append(engine))
    argv = ["serve", "--block-size", "16", "--speculative", "prompt-lookup", "--max-len", "64"]
    assert cli.main([*argv, "--speculative-tokens", "3", "--quiet"]) == 0
    (engine,) = engines
    assert isinstance(engine.paged, SpeculativePagedKV) and engine.block_size == 16
    assert engine.speculation.proposer.num_tokens == 3
    assert engine.preemption  # the default with --block-size
    assert cli.main([*argv, "--no-preemption", "--quiet"]) == 0
    assert not engines[1].preemption and not engines[1].paged.allocator.on_demand


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--tensor-parallel-size", "2", "--data-parallel-size", "4"],
            "--tensor-parallel-size 2 --data-parallel-size 4 needs 8 devices; this machine has 1",
        ),
        (
            ["--max-slots", "6", "--data-parallel-size", "4"],
            "--max-slots 6 is not divisible by --data-parallel-size 4",
        ),
    ],
)
def test_serve_refuses_a_mesh_that_does_not_fit(capsys, argv, message):
    """Tensor and data parallelism (vLLM's flags) beyond the devices and slots the data-parallel
    replicas cannot share evenly are refused before the model loads, naming the flags (this
    process has one CPU device)."""
    assert len(jax.devices()) == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
