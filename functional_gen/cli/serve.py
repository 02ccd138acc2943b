"""`functional-gen serve`: load the model, build the `Engine`, run the OpenAI-compatible server.

The HTTP stack (FastAPI, uvicorn, prometheus-client) is the `serve` extra: it is imported here,
at the top, only when installed, so that `generate` and `chat` work without it and `serve`
says what to install.
"""

import argparse

import jax

from .. import enable_compilation_cache, progress
from ..loading import DEFAULT_MODEL_NAME
from ..serving import Engine
from ..serving.mesh import check_engine_mesh
from ..sharding import make_mesh
from ..speculative import DraftModel, PromptLookup
from .arguments import load_model_from_args

try:
    from ..serving import app as serving_app
except ImportError as error:  # the serve extra is not installed
    serving_app = None
    _MISSING = error


def run_serve(args: argparse.Namespace) -> int:
    """Run `functional-gen serve` (until SIGTERM / Ctrl-C). **Returns:** 0 when the server
    stops by itself. On SIGTERM or SIGINT the server drains (running streams finish within the
    drain time, new requests are refused), and then uvicorn (>= 0.29) raises the signal it
    caught again, so the process ends BY that signal (a shell sees 143 / 130, Python -15 / -2,
    as its supervisor expects of a signalled process), not by returning.

    **Raises:** `ValueError` for bad settings (e.g. `--max-len` beyond the model's context) and
    when the serve extra is missing; `OSError` for a model path that cannot be read.
    """
    if serving_app is None:
        raise ValueError(
            f"functional-gen serve needs the serve extra ({_MISSING}); install it with "
            'pip install "functional_gen[serve]"'
        )
    widths = args.decode_widths
    if widths is not None and any(w > args.max_slots for w in widths):
        raise ValueError(
            f"--decode-widths {' '.join(map(str, widths))}: each at most --max-slots "
            f"({args.max_slots})"
        )
    if args.num_blocks is not None and args.block_size is None:
        raise ValueError(f"--num-blocks {args.num_blocks} needs --block-size (a paged KV cache)")
    if args.no_preemption and args.block_size is None:
        raise ValueError("--no-preemption needs --block-size (a paged KV cache)")
    if (args.speculative == "draft-model") != (args.draft_model is not None):
        raise ValueError(
            f"--speculative {args.speculative} and --draft-model {args.draft_model}: a draft "
            "model goes with --speculative draft-model, and only with it"
        )
    mesh = serve_mesh(args)
    progress.set_quiet(args.quiet)
    enable_compilation_cache()
    model, tokenizer = load_model_from_args(args, mesh=mesh)
    _check_mesh(args, mesh, model)
    speculative = None
    k = {} if args.speculative_tokens is None else {"num_tokens": args.speculative_tokens}
    if args.speculative == "prompt-lookup":
        speculative = PromptLookup(**k)
    elif args.speculative == "draft-model":
        draft, _ = load_model_from_args(args, args.draft_model)  # the engine places it
        speculative = DraftModel(draft, **k)
        _check_mesh(args, mesh, model, speculative)
    engine = Engine(
        model,
        tokenizer,
        max_slots=args.max_slots,
        max_len=args.max_len,
        top_logprobs=5,
        decode_widths=widths,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        preemption=None if args.block_size is None else not args.no_preemption,
        speculative=speculative,
        mesh=mesh,
    )
    if args.precompile:
        engine.precompile(progress=not args.quiet)
    name = args.served_model_name or args.model or DEFAULT_MODEL_NAME
    limits = serving_app.Limits(max_n=args.max_n, max_tokens=args.max_tokens)
    progress.notice(f"serving {name} on http://{args.host}:{args.port}/v1")
    serving_app.serve(
        engine,
        model_name=name,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        limits=limits,
        log_level="warning" if args.quiet else "info",
    )
    return 0


def _check_mesh(args: argparse.Namespace, mesh, model, speculative=None) -> None:
    """`serving.mesh.check_engine_mesh` (heads the model axis does not divide, of the model or
    the draft model) with `--tensor-parallel-size` named, on a mesh; nothing on one device."""
    if mesh is None:
        return
    try:
        check_engine_mesh(mesh, model, args.max_slots, speculative)
    except ValueError as error:
        raise ValueError(f"--tensor-parallel-size {args.tensor_parallel_size}: {error}") from None


def serve_mesh(args: argparse.Namespace):
    """The `("data", "model")` mesh of `--data-parallel-size` x `--tensor-parallel-size` over the
    first devices (vLLM's flags), or `None` for one device. Checked before the model loads.

    **Raises:** `ValueError` naming the flags: more devices asked for than there are,
    `--max-slots` not divisible by `--data-parallel-size`."""
    tp, dp = args.tensor_parallel_size, args.data_parallel_size
    if tp * dp == 1:
        return None
    flags = f"--tensor-parallel-size {tp} --data-parallel-size {dp}"
    if args.max_slots % dp:
        raise ValueError(
            f"--max-slots {args.max_slots} is not divisible by --data-parallel-size {dp}: each "
            "data-parallel replica decodes the same number of slots"
        )
    devices = jax.devices()
    if tp * dp > len(devices):
        raise ValueError(
            f"{flags} needs {tp * dp} devices; this machine has {len(devices)} "
            f"({jax.default_backend()})"
        )
    return make_mesh(dp, tp, devices=devices[: tp * dp])
