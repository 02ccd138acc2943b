"""`functional-gen chat`: an interactive conversation on standard input, one `SequenceState`.

Each answer is streamed from a worker thread (`Producer`): Ctrl-C during an answer stops that
answer only, as in llama.cpp's conversation mode (the conversation goes on from before the
interrupted turn); Ctrl-C while waiting for a message, or the end of the input, leaves.
"""

import argparse
import sys

from .. import enable_compilation_cache, progress, stream
from .arguments import (
    UNTIL_CONTEXT_ENDS,
    check_before_loading,
    generate_call_arguments,
    guidance_arguments,
    load_model_from_args,
    max_new_tokens_until_context_ends,
    prompt_token_count,
)
from .interrupt import Producer, run_in_thread


def run_chat(args: argparse.Namespace) -> int:
    """Run `functional-gen chat` with parsed options until the input ends or `/exit`.

    **Returns:** the exit status, 0.

    **Raises:** `ValueError` (and the project's subclasses) for bad options or a model without a
    chat template; `KeyboardInterrupt` on Ctrl-C outside an answer.
    """
    if args.num_return_sequences not in (None, 1):
        raise ValueError("chat answers with one sequence (no --num-return-sequences)")
    check_before_loading(args)
    progress.set_quiet(args.quiet)
    enable_compilation_cache()
    model, tokenizer, call = run_in_thread(_load, args)
    interactive = sys.stdin.isatty()
    state = None
    answer: Producer | None = None
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
        if args.max_new_tokens == UNTIL_CONTEXT_ENDS:
            call.pop("generation_config", None)  # a max_length of the model's config
            so_far = 0 if state is None else len(state.row_token_ids()[0])
            call["max_new_tokens"] = max_new_tokens_until_context_ends(
                model, [so_far + prompt_token_count(tokenizer, message)]
            )
        if answer is not None:
            answer.wait()  # an interrupted answer's last step
        pieces = stream(model, tokenizer, prompt, **call)
        answer = Producer(pieces)
        try:
            for item in answer:
                piece = item if isinstance(item, str) else item[1]
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            answer.stop()
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        answer = None
        sys.stdout.write("\n")
        sys.stdout.flush()
        result = pieces.result
        state = result.state
        if args.verbose:
            print(
                f"[prefilled {result.prefill_tokens[0]} tokens, generated {result.num_tokens[0]}, "
                f"finish reason: {result.finish_reasons[0]}, conversation "
                f"{len(state.row_token_ids()[0])} tokens]",
                file=sys.stderr,
            )
    if answer is not None:
        answer.wait()  # an interrupted answer's last step, before the interpreter shuts down
    return 0


def _load(args: argparse.Namespace):
    """The model, tokenizer and `stream` keyword arguments of a chat."""
    model, tokenizer = load_model_from_args(args)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template; use generate")
    call = generate_call_arguments(args, model, tokenizer)
    call.update(guidance_arguments(args, tokenizer))
    return model, tokenizer, call
