"""`functional-gen generate`: one batch of prompts, printed as text or jsonl, or one prompt
streamed.

Everything that can be checked without the model is checked first (`check_before_loading`);
loading, compiling and generating then run in a worker thread (`run_in_thread`) so that Ctrl-C
stops the run at once, even inside the compiled generation loop, with one line and exit status
130.
"""

import argparse
import sys
import time

from .. import enable_compilation_cache, generate, progress, stream
from .arguments import (
    UNTIL_CONTEXT_ENDS,
    check_before_loading,
    generate_call_arguments,
    guidance_arguments,
    load_model_from_args,
    max_new_tokens_until_context_ends,
    prompt_token_count,
    read_prompts,
)
from .interrupt import run_in_thread
from .output import print_result, print_timings


def run_generate(args: argparse.Namespace) -> int:
    """Run `functional-gen generate` with parsed options.

    **Returns:** the exit status, 0.

    **Raises:** `ValueError` (and the project's subclasses) or `FileNotFoundError` for bad
    options, prompts, files or models, before the model loads where the model is not needed;
    `KeyboardInterrupt` on Ctrl-C.
    """
    prompts = read_prompts(args)
    check_before_loading(args)
    if args.stream and (len(prompts) > 1 or args.output != "text"):
        raise ValueError(
            "--stream prints one prompt's text; it cannot be used with several prompts, -f or "
            "--output jsonl"
        )
    if args.top_logprobs is not None and args.output != "jsonl":
        raise ValueError(
            f"--top-logprobs {args.top_logprobs} prints the alternatives in the jsonl output: add "
            "--output jsonl"
        )
    progress.set_quiet(args.quiet)
    enable_compilation_cache()
    return run_in_thread(_load_and_generate, args, prompts)


def _load_and_generate(args: argparse.Namespace, prompts: list[str]) -> int:
    start = time.perf_counter()
    model, tokenizer = load_model_from_args(args)
    loaded = time.perf_counter()
    call = generate_call_arguments(args, model, tokenizer)
    call.update(guidance_arguments(args, tokenizer))
    if not args.raw and getattr(tokenizer, "chat_template", None):
        for i, prompt in enumerate(prompts):
            if not prompt.strip():
                which = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                raise ValueError(
                    f"{which} {prompt!r} is blank: the chat template would send an empty user "
                    "message (use --raw to send whitespace as text)"
                )
        inputs = [[{"role": "user", "content": p}] for p in prompts]
    else:
        inputs = list(prompts)
    if args.max_new_tokens == UNTIL_CONTEXT_ENDS:
        call.pop("generation_config", None)
        call["max_new_tokens"] = max_new_tokens_until_context_ends(
            model, [prompt_token_count(tokenizer, x) for x in inputs]
        )
    shape = f"{len(inputs)} prompt(s)"
    if "max_new_tokens" in call:
        shape += f", {call['max_new_tokens']} new tokens"
    with progress.compile_notices(f"generate for {shape}") as compiled:
        if args.stream:
            for piece in stream(model, tokenizer, inputs[0], **call):
                compiled.end_line()
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            result = None
        else:
            result = generate(model, tokenizer, inputs, **call)
    done = time.perf_counter()
    if result is not None:
        print_result(args, prompts, result, tokenizer)
        sys.stdout.flush()  # the answer before the summary on stderr, also when both are one file
    if args.verbose:
        print_timings(compiled, prompts, inputs, tokenizer, result, start, loaded, done)
    elif not args.quiet and result is not None:
        for i, (n, reason) in enumerate(zip(result.num_tokens, result.finish_reasons)):
            row = f"{i}: " if len(prompts) > 1 else ""
            print(f"[{row}{n} tokens, finish reason: {reason}]", file=sys.stderr)
        print(f"[{done - start:.1f} s]", file=sys.stderr)
    return 0
