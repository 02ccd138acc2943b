"""The command line as a new user meets it (issue 43, item 8): Ctrl-C, errors as one line, checks
before the model loads, `-n -1`, empty prompts, `--top-logprobs`, several prompts, `--version`.

The Ctrl-C tests run `python -m functional_gen.cli` as a user would, on the default model cut to
2 layers (`two_layer_default_model`: real tokenizer and chat template, fast to compile), and send
SIGINT at points read from the program's output. Its stderr is a pseudo-terminal there, so that
the program prints its "compiling ..." notice as it does for a user.
"""

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import functional_gen as fg
from functional_gen import cli, program_start

ROOT = Path(__file__).resolve().parents[1]


def _run_main(argv, capsys) -> tuple[int, str, str]:
    """`cli.main(argv)` in this process: `(exit status, stdout, stderr)`."""
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _one_error_line(err: str) -> str:
    """The single line of stderr (asserting there is exactly one and no traceback)."""
    assert "Traceback" not in err and "usage:" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_version_prints_the_package_version(capsys):
    status, out, _ = _run_main(["--version"], capsys)
    assert status == 0 and out == f"functional-gen {fg.__version__}\n"


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5"])
def test_a_bad_max_new_tokens_is_one_line_naming_the_value(value, capsys):
    status, _, err = _run_main(["generate", "hello", "-n", value], capsys)
    line = _one_error_line(err)
    assert status == 2
    assert line.startswith("functional-gen generate: error: argument -n/--max-new-tokens")
    assert f"got '{value}'" in line


def test_minus_one_max_new_tokens_is_the_rest_of_the_context(capsys):
    args = cli.build_parser().parse_args(["generate", "hello", "-n", "-1"])
    assert args.max_new_tokens == cli.UNTIL_CONTEXT_ENDS == -1
    # no fixed length goes into the generation config: it is computed once the prompt is known
    assert "max_new_tokens" not in cli.generation_options(args)
    model = SimpleNamespace(max_position_embeddings=100)
    assert cli.max_new_tokens_until_context_ends(model, [10, 30, 7]) == 70
    with pytest.raises(ValueError, match="fills the model's context"):
        cli.max_new_tokens_until_context_ends(model, [100])
    with pytest.raises(ValueError, match="known context length"):
        cli.max_new_tokens_until_context_ends(SimpleNamespace(max_position_embeddings=None), [1])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", ""], "the prompt is empty"),
        (["generate", "hi", ""], "prompt 2 is empty"),
        (["generate", "-p", ""], "the prompt is empty"),
        (["generate", "hi", "--top-logprobs", "3"], "add --output jsonl"),
        (["generate", "a", "b", "--stream"], "cannot be used with several prompts"),
        (["generate"], "give exactly one prompt source"),
    ],
)
def test_prompt_and_output_mistakes_are_named_before_loading(argv, message, capsys):
    # --model names no file: the mistake is reported first, so the model is never loaded
    status, _, err = _run_main([*argv, "--model", "/nonexistent/model"], capsys)
    assert status == 2 and message in _one_error_line(err)


@pytest.mark.parametrize(
    "option, named",
    [
        (["--regex", "([a-z]+"], "([a-z]+"),
        (["--json-schema", '{"type": "object",'], "--json-schema: not valid JSON"),
        (["--json-schema", "/nonexistent/schema.json"], "/nonexistent/schema.json"),
        (["--grammar", 'root ::= "a" item'], "item"),
        (["--grammar", 'root ::= "a" ('], "not a valid GBNF grammar"),
        (["--grammar", "/nonexistent/c.gbnf"], "/nonexistent/c.gbnf"),
        (["--lark-grammar", "/nonexistent/g.lark"], "/nonexistent/g.lark"),
    ],
)
def test_constraint_options_are_checked_before_the_model_loads(option, named, capsys):
    status, _, err = _run_main(["generate", "hello", *option, "-m", "/nonexistent/model"], capsys)
    line = _one_error_line(err)
    assert status == 2 and named in line and "/nonexistent/model" not in line


def test_project_errors_are_one_line_and_exit_status_2(tmp_path, capsys):
    not_json = tmp_path / "not-json"
    not_json.mkdir()
    (not_json / "config.json").write_text('{"model_type": "llama",')
    (not_json / "model.safetensors").write_bytes(b"")
    unsupported = tmp_path / "bert"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"model_type": "bert"}))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00")
    for model, named in [
        ("/nonexistent/model", "/nonexistent/model"),  # FileNotFoundError
        # not JSON: one line whatever names it (naming the file is the loader's, issue 43 item 4)
        (str(not_json), ""),
        (str(unsupported), "bert"),  # UnsupportedConfigError
        (str(truncated), ""),  # a truncated GGUF: likewise
    ]:
        status, _, err = _run_main(["generate", "hello", "-m", model], capsys)
        line = _one_error_line(err)
        assert status == 2 and line.startswith("functional-gen: error: ") and named in line


def test_a_blank_prompt_is_refused_when_the_chat_template_applies(two_layer_default_model, capsys):
    status, _, err = _run_main(["generate", "  ", "-m", str(two_layer_default_model)], capsys)
    assert status == 2 and "blank" in _one_error_line(err)


def test_two_prompts_are_one_batch(two_layer_default_model, capsys):
    argv = ["generate", "The sea", "Once upon a time", "--raw", "-n", "4", "--output", "jsonl"]
    status, out, _ = _run_main([*argv, "-m", str(two_layer_default_model)], capsys)
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    model, tokenizer = fg.load_model(two_layer_default_model)
    expected = fg.generate(model, tokenizer, ["The sea", "Once upon a time"], max_new_tokens=4)
    assert [r["index"] for r in rows] == [0, 1]
    assert [r["prompt"] for r in rows] == ["The sea", "Once upon a time"]
    assert [r["text"] for r in rows] == expected.texts
    assert [r["token_ids"] for r in rows] == [
        np.asarray(expected.token_ids)[i, :n].tolist() for i, n in enumerate(expected.num_tokens)
    ]


# ---- Ctrl-C, in a process of its own ----------------------------------------------------------


class Program:
    """`python -m functional_gen.cli ARGS` with stdout (and stdin) on pipes and stderr on a
    pseudo-terminal, both read in the background."""

    def __init__(self, *args: str, stdin: bool = False, python_options: tuple[str, ...] = ()):
        master, slave = pty.openpty()
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, *python_options, "-m", "functional_gen.cli", *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            cwd=ROOT,
        )
        os.close(slave)
        self.out = b""
        self.err = b""
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout.fileno(), "out")),
            threading.Thread(target=self._read, args=(master, "err")),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, fd: int, name: str) -> None:
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:  # the pseudo-terminal closes with EIO
                data = b""
            if not data:
                return
            setattr(self, name, getattr(self, name) + data)

    def wait_for(self, condition, timeout: float = 240.0) -> None:
        """Wait until `condition(self)` holds (fails the test after `timeout` seconds or when
        the program ended first)."""
        end = time.monotonic() + timeout
        while not condition(self):
            assert self.process.poll() is None, (self.process.returncode, self.out, self.err)
            assert time.monotonic() < end, (self.out, self.err)
            time.sleep(0.05)

    def interrupt_and_wait(self, within: float) -> float:
        """Send SIGINT; return how many seconds the program took to end (at most `within`)."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=within)
        for reader in self._readers:
            reader.join(timeout=5)
        return time.monotonic() - start

    def stderr_lines(self) -> list[str]:
        return [line for line in self.err.decode().replace("\r", "").splitlines() if line]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def program():
    started = []

    def start(*args, **kwargs) -> Program:
        started.append(Program(*args, **kwargs))
        return started[-1]

    yield start
    for p in started:
        p.kill()


def _assert_interrupted(p: Program) -> None:
    assert p.process.returncode == cli.INTERRUPTED
    err = p.err.decode()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert p.stderr_lines()[-1] == "functional-gen: interrupted", err


def test_ctrl_c_while_the_program_starts(program):
    """Ctrl-C while `import jax` runs, before `cli.main` can catch anything: one line, 130.

    `-X importtime` prints a line on stderr as each module finishes importing; the handler is
    installed when `functional_gen.program_start`'s line appears, and JAX, transformers and the
    rest of the package are still to come (seconds)."""
    p = program(
        "generate", "hello", "-m", "/nonexistent/model", python_options=("-X", "importtime")
    )
    p.wait_for(lambda p: b"functional_gen.program_start" in p.err, timeout=60)
    early = b"functional_gen.generation" not in p.err  # the package's import still runs
    p.interrupt_and_wait(within=10)
    _assert_interrupted(p)
    assert early, "the package was imported before the signal could be sent: nothing was tested"


def test_only_the_program_takes_ctrl_c_at_import():
    """`functional_gen.program_start` recognises the program, and only the program."""
    python = sys.executable
    assert program_start.is_program([python, "-m", "functional_gen.cli", "generate"], "-m")
    assert program_start.is_program(
        [python, "/venv/bin/functional-gen", "chat"], "/venv/bin/functional-gen"
    )
    assert not program_start.is_program([python, "-m", "pytest", "-m", "functional_gen.cli"], "-m")
    assert not program_start.is_program([python, "script.py"], "script.py")
    assert not program_start.is_program([python, "-c", "import functional_gen"], "-c")


def test_ctrl_c_while_compiling_and_while_a_non_streamed_generate_runs(
    two_layer_default_model, program
):
    # long enough that the compiled loop runs for a minute: the whole context (-n -1), no EOS
    # before 8,000 tokens (the compile takes about 10 s, 4,000 tokens took 60 s here)
    long = ["generate", "The sea", "--raw", "-n", "-1", "--min-new-tokens", "8000"]
    model = ["-m", str(two_layer_default_model)]
    p = program(*long, *model)
    p.wait_for(lambda p: b"compiling" in p.err)
    assert p.interrupt_and_wait(within=10) < 3
    _assert_interrupted(p)
    assert p.out == b""
    # interrupted after the compile: inside the compiled while_loop, which cannot stop itself
    p = program(*long, *model, "--seed", "1")
    p.wait_for(lambda p: b"compiling" in p.err)
    time.sleep(20)
    assert p.process.poll() is None and p.out == b""  # still generating
    assert p.interrupt_and_wait(within=10) < 3
    _assert_interrupted(p)


def test_ctrl_c_while_streaming(two_layer_default_model, program):
    p = program(
        "generate",
        "The sea",
        "--raw",
        "--stream",
        "-n",
        "2000",
        "--min-new-tokens",
        "2000",
        "-m",
        str(two_layer_default_model),
    )
    p.wait_for(lambda p: len(p.out) > 0)
    assert p.interrupt_and_wait(within=10) < 3
    _assert_interrupted(p)


def test_ctrl_c_in_chat_stops_the_answer_and_a_second_one_leaves(two_layer_default_model, program):
    p = program(
        "chat",
        "-n",
        "2000",
        "--min-new-tokens",
        "2000",
        "-m",
        str(two_layer_default_model),
        stdin=True,
    )
    p.process.stdin.write(b"Tell me a story.\n")
    p.process.stdin.flush()
    p.wait_for(lambda p: len(p.out) > 0)
    p.process.send_signal(signal.SIGINT)
    # the answer stops with a new line, and the chat goes on: the next message is answered
    time.sleep(1.5)
    first = len(p.out)
    time.sleep(1)
    assert len(p.out) == first and p.out.endswith(b"\n")  # nothing more of the stopped answer
    assert "Traceback" not in p.err.decode()
    p.process.stdin.write(b"Hello!\n")
    p.process.stdin.flush()
    p.wait_for(lambda p: len(p.out) > first)
    p.process.send_signal(signal.SIGINT)  # stops the second answer
    time.sleep(1.5)
    assert p.process.poll() is None and p.out.endswith(b"\n")  # still chatting
    assert p.interrupt_and_wait(within=10) < 3  # the second Ctrl-C (at the prompt) leaves
    _assert_interrupted(p)
