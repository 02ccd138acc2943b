"""How `functional-gen generate` prints its results: `text` (the generated text, one line per
sequence; numbered with scores for several sequences per prompt) or `jsonl` (one JSON object
per sequence, with token ids, logprobs and, with `--top-logprobs K`, the alternatives as text
beside their ids, as OpenAI's and vLLM's APIs give them), and `--verbose`'s timing summary.
"""

import argparse
import json
import sys

import numpy as np

from ..tokenization import encode_prompt


def top_logprobs_rows(tokenizer, top_token_ids, top_logprobs) -> list[list[dict]]:
    """The alternatives of one sequence, step by step, most likely first: `[{"token": text,
    "token_id": id, "logprob": natural-log probability}, ...]` per generated token (OpenAI's
    `top_logprobs` entries with the id beside, as vLLM gives it).

    **Arguments:** `tokenizer`: decodes each id alone (`tokenizer.decode([id])`, so a token that
    holds part of a UTF-8 character reads as U+FFFD); `top_token_ids`, `top_logprobs`: nested
    lists `[steps][K]` of ints and floats.
    """
    return [
        [
            {"token": tokenizer.decode([int(i)]), "token_id": int(i), "logprob": float(lp)}
            for i, lp in zip(ids, lps)
        ]
        for ids, lps in zip(top_token_ids, top_logprobs)
    ]


def print_result(args: argparse.Namespace, prompts: list[str], result, tokenizer) -> None:
    """Print `result` (a `GenerationResult` of `prompts`) on stdout as `--output` asks."""
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
            row["top_logprobs"] = top_logprobs_rows(
                tokenizer,
                np.asarray(result.top_token_ids)[r, :n].tolist(),
                np.asarray(result.top_logprobs)[r, :n].tolist(),
            )
        print(json.dumps(row, ensure_ascii=False))


def print_timings(compiled, prompts, inputs, tokenizer, result, start, loaded, done) -> None:
    """llama.cpp's `llama_perf_context_print` summary, in milliseconds. Prefill and the decode
    loop run as ONE compiled program, so prompt evaluation is not timed apart from generation."""
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
