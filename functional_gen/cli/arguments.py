"""From parsed options to what `functional_gen.generate` / `stream` take: ONE generation-config
dictionary laid over the model's own generation config (or `--generation-config FILE`) key by key,
through the same processor table as a `GenerationConfig` (`settings_from_generation_config`),
the prompts, and the checks that run before the model is loaded.
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax

from .. import load_model, progress
from ..generation_config import load_generation_config, settings_from_generation_config
from ..structured import (
    GrammarError,
    constraint_from_options,
    gbnf_to_lark,
    parse_grammar,
    regex_byte_dfa,
)
from ..tokenization import encode_prompt
from .parser import PENALTY_OPTIONS, SAMPLING_DEFAULTS, SAMPLING_KEYS, SAMPLING_OPTIONS

UNTIL_CONTEXT_ENDS = -1
"""`-n -1`: generate until the end of generation or of the model's context (llama.cpp's)."""


def load_model_from_args(args: argparse.Namespace, path=None, *, mesh=None):
    """`fg.load_model` of `path` (default `args.model`) with the command's `--dtype`,
    `--kv-cache-dtype` and `--quantization`, reporting progress on stderr, its weights placed on
    `mesh` when given (`serve --tensor-parallel-size`). Returns
    `(model, tokenizer)`; raises what `fg.load_model` raises (missing files, unknown
    architecture)."""
    return load_model(
        args.model if path is None else path,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
        progress=progress.notice,
        mesh=mesh,
    )


def sampling_requested(args: argparse.Namespace) -> bool:
    """Whether the options ask for sampling (`--sample`, or a sampling option other than
    `--temperature 0`)."""
    given = {k for k in SAMPLING_KEYS if getattr(args, k) is not None}
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
    if args.sample and not SAMPLING_KEYS & options.keys():
        options.update(SAMPLING_DEFAULTS)
    if sampling_requested(args):
        options["do_sample"] = True
    elif args.greedy or greedy_temperature:
        options["do_sample"] = False
    if args.max_new_tokens is not None and args.max_new_tokens != UNTIL_CONTEXT_ENDS:
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
        for key in SAMPLING_KEYS:
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
    settings = settings_from_generation_config(
        generation_options(args),
        eos_token_id=tuple(eos_token_id),
        vocab_size=vocab_size,
        tokenizer=tokenizer,
    )
    return list(settings.processors)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts: the positional PROMPTs (several are one batch), `-p PROMPT`, or the lines of
    `-f FILE` (`-`: standard input; blank lines skipped).

    **Raises:** `ValueError` unless exactly one source is given, for an empty prompt (refused
    here, before the chat template could wrap it into a non-empty text) or a file with no
    prompt; `FileNotFoundError` for a missing file.
    """
    given = [
        name
        for name, value in (
            ("PROMPT", args.prompt or None),
            ("-p PROMPT", args.prompt_option),
            ("-f FILE", args.file),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise ValueError(
            f"give exactly one prompt source: PROMPT, -p PROMPT or -f FILE (got {len(given)}: "
            f"{', '.join(given) or 'none'})"
        )
    if args.file is None:
        prompts = list(args.prompt) if args.prompt else [args.prompt_option]
        for i, prompt in enumerate(prompts):
            if not prompt:
                which = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                raise ValueError(f"{which} is empty: give the text to continue or answer")
        return prompts
    if args.file == "-":
        text = sys.stdin.read()
    else:
        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"no such prompt file: {path}")
        text = path.read_text(encoding="utf-8")
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"no prompts in {args.file!r} (one prompt per line)")
    return prompts


def check_before_loading(args: argparse.Namespace) -> None:
    """Check what can be checked without the model, so that a mistake is reported in a second,
    not after the model has loaded: the decoding values (through the processor table, with a
    stand-in vocabulary), `--generation-config FILE`, and the constraint's own syntax (the regex,
    the JSON of `--json-schema`, the grammar text or file). The constraint is built against the
    tokenizer later (`generate_call_arguments`), which checks the rest (schema keywords, ...).

    **Raises:** `ValueError` (or the project's subclasses: `ConstraintError`, `GrammarError`)
    naming the option and the value; `FileNotFoundError` for a missing generation config.
    """
    options = generation_options(args)
    options.pop("dry_sequence_breakers", None)  # text breakers need the tokenizer: later
    settings_from_generation_config(options, eos_token_id=(0,), vocab_size=1)
    if args.generation_config is not None:
        load_generation_config(args.generation_config)
    given = [
        name
        for name, value in (
            ("--regex", args.regex),
            ("--json-schema", args.json_schema),
            ("--choice", args.choice),
            ("--grammar", args.grammar),
            ("--lark-grammar", args.lark_grammar),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(
            f"give at most one of --regex, --json-schema, --choice, --grammar, --lark-grammar; "
            f"got {', '.join(given)}"
        )
    if args.regex is not None:
        regex_byte_dfa(args.regex)  # its error names the regex
    if args.json_schema is not None:
        _check_json(args.json_schema)
    if args.grammar is not None:
        text = args.grammar
        if "::=" not in text:
            path = Path(os.path.expanduser(text))
            if not path.is_file():
                raise ValueError(
                    f"--grammar: {text!r} is neither GBNF text (rules `name ::= ...`) nor an "
                    "existing file"
                )
            text = path.read_text(encoding="utf-8")
        try:
            parse_grammar(gbnf_to_lark(text))
        except GrammarError as e:
            raise GrammarError(f"--grammar: {e}") from e
    if args.lark_grammar is not None:
        path = Path(os.path.expanduser(args.lark_grammar))
        if not path.is_file():
            raise ValueError(f"--lark-grammar: {args.lark_grammar!r} is not an existing file")
        parse_grammar(path.read_text(encoding="utf-8"))


def _check_json(value: str) -> None:
    """`--json-schema`'s JSON syntax: JSON text, or a file of JSON (the messages of
    `constraint_from_options`, which reads it again with the tokenizer)."""
    text = value.strip()
    if text.startswith(("{", "[")) or text in ("true", "false"):
        where = "--json-schema: not valid JSON"
    else:
        path = Path(os.path.expanduser(value))
        if not path.is_file():
            raise ValueError(f"--json-schema: {value!r} is neither JSON text nor an existing file")
        text = path.read_text(encoding="utf-8")
        where = f"--json-schema: the file {path} is not valid JSON"
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} ({e}); pass JSON text or a file path") from None


def max_new_tokens_until_context_ends(model, prompt_token_counts: Sequence[int]) -> int:
    """`-n -1`: the tokens left in the model's context after the longest prompt.

    **Raises:** `ValueError` when the model's context length is unknown or the prompt already
    fills it."""
    limit = model.max_position_embeddings
    if limit is None:
        raise ValueError(
            "-n -1 needs a model with a known context length (max_position_embeddings)"
        )
    left = limit - max(prompt_token_counts)
    if left < 1:
        raise ValueError(
            f"-n -1: the prompt ({max(prompt_token_counts)} tokens) fills the model's context "
            f"(max_position_embeddings={limit})"
        )
    return left


def prompt_token_count(tokenizer, prompt) -> int:
    """How many tokens a prompt (text or chat messages) takes, chat template included."""
    return len(encode_prompt(tokenizer, prompt))


def _constraint(args: argparse.Namespace, tokenizer, model):
    """The structured-generation processor of --regex/--json-schema/--choice/--grammar/--lark-grammar,
    or None."""
    if all(
        v is None
        for v in (args.regex, args.json_schema, args.choice, args.grammar, args.lark_grammar)
    ):
        return None
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
