"""`SequenceState`: a resumable generation (token ids, weights, KV cache, processor states, keys).

Every `generate` / `stream` result carries one as `result.state`. It can be continued (the KV
cache is reused: only tokens the cache does not hold are prefilled), appended to, sliced by rows
or tokens, forked, saved and loaded. The design follows outlines' "continuous generation"
proposal (outlines PR #781: a sequence state of token ids, weights, attention masks and KV cache
that can be sliced, added to and continued by another generator).

Rows and slots. Each row holds `length` tokens, of which the first `cached` have their keys and
values in `cache` (rows are written in lockstep, so a row's tokens are spread over slots by their
RoPE positions, with padding slots at position -1 in between). `logits` are the next-token
logits after a row's last token whenever `cached == length`; the next call prefills the tokens
`[cached, length)` of every row, and nothing else.

Reordering rows is ONE `jax.tree.map(lambda x: x[idx], ...)` over every per-row leaf (design
constraint 3): tokens, weights, cache, processor states, stop-string states and keys.

The saved file format (its tensors, header fields, versions and checks) is in
`functional_gen.generation.state_file`; `save` here writes its bytes durably.
"""

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key, PRNGKeyArray, PyTree

from ..models.kv_cache import KVCache, resolve_kv_cache_dtype
from ..processors.base import split_rows
from ..sharding import to_host
from ..tokenization import decode, is_chat, tokenizer_fingerprint
from .buckets import bucket_length
from .durable_write import PARTIAL_SUFFIX as PARTIAL_SUFFIX, write_atomically
from .state_file import (  # the file format's names, also public here where they were first
    FORMAT_NAME as FORMAT_NAME,
    FORMAT_VERSION as FORMAT_VERSION,
    HEADER_FIELDS as HEADER_FIELDS,
    READABLE_VERSIONS as READABLE_VERSIONS,
    ROW_TENSORS as ROW_TENSORS,
    SequenceStateFormatError as SequenceStateFormatError,
    decode_state,
    encode_state,
)


class BatchMismatchError(ValueError):
    """Two states (or a state and per-row data) with different numbers of rows were combined."""


class ModelMismatchError(ValueError):
    """A `SequenceState` was continued with a model whose config differs from the one that made it."""


class TokenizerMismatchError(ModelMismatchError):
    """A `SequenceState` was continued (or loaded, decoded, joined) with a tokenizer other than
    the one that made its token ids: their fingerprints (`tokenizer_fingerprint`: vocabulary,
    special tokens, class) differ. A `ModelMismatchError`, so code catching that catches it."""


class SequenceArrays(eqx.Module):
    """The per-row arrays of a `SequenceState`; every leaf has a leading batch axis.

    **Attributes:**

    - `token_ids`: `Int[Array, "batch max_len"]`, each row's tokens from column 0; columns from
      `length` on are unused (`max_len` is a bucketed capacity).
    - `token_logprobs`: `Float[Array, "batch max_len"]`, the logprob of each generated token
      under the processed distribution it was drawn from; 0 for prompt and appended tokens.
    - `length`: `Int[Array, " batch"]`, tokens per row.
    - `cached`: `Int[Array, " batch"]`, how many of a row's first tokens are in `cache`.
    - `prompt_length`: `Int[Array, " batch"]`, what the last call's processors saw as the prompt.
    - `logits`: `Float[Array, "batch vocab"]`, float32 next-token logits after the last token
      (valid where `cached == length`).
    - `key`: `Key[Array, " batch"]`, per-row PRNG keys; `key_step`: `Int[Array, " batch"]`,
      sampling steps taken so far (the next step uses `fold_in(key, key_step)`).
    - `cache`: the `KVCache`, or `None` before the first prefill.
    - `processor_states`: the per-row processor states of the last call, or `None` when they
      no longer describe the text (after an append or a crop; the processors then start again)
      or their processors are gone (a loaded state). Only a continuation that passes no
      decoding arguments (so the same processors go on) reads them; any other call starts its
      processors anew and leaves them out of the compiled program.
    - `stop_state`: `Int[Array, "batch stops"]` or `None`, the stop-string matchers' states
      (kept, dropped and read like `processor_states`).
    """

    token_ids: Int[Array, "batch max_len"]
    token_logprobs: Float[Array, "batch max_len"]
    length: Int[Array, " batch"]
    cached: Int[Array, " batch"]
    prompt_length: Int[Array, " batch"]
    logits: Float[Array, "batch vocab"]
    key: Key[Array, " batch"]
    key_step: Int[Array, " batch"]
    cache: KVCache | None
    processor_states: tuple[PyTree, ...] | None
    stop_state: Int[Array, "batch stops"] | None


def _take(tree, idx):
    return jax.tree.map(lambda x: x[idx], tree)


class SequenceState:
    """A resumable batch of sequences. Build one by generating (`result.state`) or with
    `SequenceState.from_token_ids`; never mutated (every operation returns a new state).

    **Operations:**

    - continue: `fg.generate(model, tokenizer, state, max_new_tokens=N, ...)` (also `fg.stream`):
      every row goes on from its last token; only tokens the cache lacks are prefilled.
    - append: `state + "text"`, `state + [token ids]`, `state + [{"role": ..., "content": ...}]`
      (a chat turn, rendered with the chat template's continuation), `state + ["text a", "text
      b"]` (one text per row), `state_a + state_b` (same batch; tokens concatenated, weights
      added, the second part's cache recomputed).
    - slice: `state[i]`, `state[i:j]`, `state[[0, 2]]` (rows); `state[:, :n]` (the first `n`
      tokens of every row; the cache is cropped, so a continuation regenerates from there).
    - fork: `state.repeat(n)` (every row `n` times, prompt-major; copy `j > 0` of a row gets the
      key `fold_in(key, j)`, so forks draw different samples).
    - save / load: `state.save(path)`, `SequenceState.load(path)`. Saved: the tokens, weights,
      KV cache, next-token logits and per-row keys, so a loaded state continues token for token
      like the original continued with the same arguments (and runs the same compiled program).
      Not saved: the tokenizer, the settings of the last call (processors, sampler, EOS ids, stop
      strings) and the states of its processors and stop-string matchers, which only mean
      something with those processor objects (see `save`).
    - read: `state.texts()` / `list(state)` (full text per row), `state.token_ids`,
      `state.lengths`, `state.weights`, `len(state)`.

    **Attributes:** `arrays` (`SequenceArrays`), `model_fingerprint` (the model's
    `config_fingerprint`, or `None` before any model call), `tokenizer` (or `None`),
    `tokenizer_fingerprint` (see below), `settings` (the `Settings` of the call that produced
    it, used when a continuation passes no processors and no sampler; not saved).

    **Tokenizer check.** A state records the fingerprint of the tokenizer that made its token
    ids (`functional_gen.tokenization.tokenizer_fingerprint`: vocabulary, special tokens,
    class; computed lazily and cached per tokenizer object) and saves it. Continuing it with
    `fg.generate` / `fg.stream`, loading it with `load(path, tokenizer)`, decoding it with
    `texts(tokenizer)` or joining another state to it with another tokenizer raises
    `TokenizerMismatchError`, before anything is compiled. Not checked: states without a known
    fingerprint (built from token ids without a tokenizer, loaded from a version-1 file, or
    made with a tokenizer object that has no `get_vocab`).
    """

    def __init__(
        self,
        arrays: SequenceArrays,
        *,
        model_fingerprint: str | None,
        tokenizer: Any = None,
        settings: Any = None,
        tokenizer_fingerprint: str | None = None,
    ):
        self.arrays = arrays
        self.model_fingerprint = model_fingerprint
        self.tokenizer = tokenizer
        self.settings = settings
        self._tokenizer_fingerprint = tokenizer_fingerprint

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The fingerprint of the tokenizer that made this state's token ids: the one recorded
        (a loaded file's), else that of `self.tokenizer`, else `None` (unknown: not checked)."""
        if self._tokenizer_fingerprint is None and self.tokenizer is not None:
            self._tokenizer_fingerprint = tokenizer_fingerprint(self.tokenizer)
        return self._tokenizer_fingerprint

    def check_tokenizer(self, tokenizer: Any, *, where: str = "this SequenceState") -> None:
        """Refuse a `tokenizer` other than the one that made this state (see the class
        docstring); `None`, the state's own tokenizer object, or an unknown fingerprint on
        either side pass.

        **Raises:** `TokenizerMismatchError` naming both fingerprints and the tokenizers'
        classes and sizes.
        """
        if tokenizer is None or tokenizer is self.tokenizer:
            return
        _refuse_other_tokenizer(self.tokenizer_fingerprint, self.tokenizer, tokenizer, where)

    def continued_with(self, tokenizer: Any) -> "SequenceState":
        """This state, checked against the `tokenizer` of a call that continues it
        (`check_tokenizer`), keeping that tokenizer when the state has none.

        **Raises:** `TokenizerMismatchError` (see `check_tokenizer`).
        """
        self.check_tokenizer(tokenizer)
        if tokenizer is not None and self.tokenizer is None:
            return self._replace(tokenizer=tokenizer)
        return self

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_token_ids(
        cls,
        token_ids: Sequence[Sequence[int]],
        *,
        vocab_size: int,
        key: PRNGKeyArray | None = None,
        tokenizer: Any = None,
    ) -> "SequenceState":
        """A state of prompts that nothing has run yet (no cache: the next call prefills all).

        **Arguments:** `token_ids`: one non-empty list of ids per row; `vocab_size`: the width
        of the (not yet computed) logits; `key`: row `i` gets `fold_in(key, i)` (default
        `jax.random.key(0)`); `tokenizer`: kept for `+ "text"` and `texts()`.

        **Raises:** `ValueError` for no rows, an empty row, or ids outside `[0, vocab_size)`.
        """
        rows = [list(map(int, ids)) for ids in token_ids]
        if not rows:
            raise ValueError("no prompts given")
        for i, ids in enumerate(rows):
            if not ids:
                raise ValueError(f"prompt {i} has no tokens")
        _check_ids(rows, vocab_size)
        batch, longest = len(rows), max(map(len, rows))
        ids = np.zeros((batch, bucket_length(longest)), np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
        if key is None:
            key = jax.random.key(0)
        arrays = SequenceArrays(
            token_ids=jnp.asarray(ids),
            token_logprobs=jnp.zeros(ids.shape, jnp.float32),
            length=lengths,
            cached=jnp.zeros((batch,), jnp.int32),
            prompt_length=lengths,
            logits=jnp.zeros((batch, vocab_size), jnp.float32),
            key=jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch)),
            key_step=jnp.zeros((batch,), jnp.int32),
            cache=None,
            processor_states=None,
            stop_state=None,
        )
        return cls(arrays, model_fingerprint=None, tokenizer=tokenizer)

    def _replace(self, arrays: SequenceArrays | None = None, **kwargs) -> "SequenceState":
        fields = dict(
            model_fingerprint=self.model_fingerprint,
            tokenizer=self.tokenizer,
            settings=self.settings,
            tokenizer_fingerprint=self._tokenizer_fingerprint,
        )
        fields.update(kwargs)
        return SequenceState(self.arrays if arrays is None else arrays, **fields)

    # --- reading --------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """Rows."""
        return int(self.arrays.length.shape[0])

    def __len__(self) -> int:
        return self.batch_size

    @property
    def lengths(self) -> Int[Array, " batch"]:
        """`Int[Array, " batch"]`: tokens per row (prompt and everything after it)."""
        return self.arrays.length

    @property
    def token_ids(self) -> Int[Array, "batch max_len"]:
        """`Int[Array, "batch max_len"]`: each row's tokens from column 0; only the first
        `lengths[row]` columns are valid."""
        return self.arrays.token_ids

    @property
    def weights(self) -> Float[Array, " batch"]:
        """`Float[Array, " batch"]`: per row, the summed logprobs (natural log) of its generated
        tokens, under the processed distributions they were drawn from (outlines' "weights")."""
        return self.arrays.token_logprobs.sum(axis=1)

    @property
    def cache(self) -> KVCache | None:
        """The `KVCache` (or `None` before the first prefill)."""
        return self.arrays.cache

    @property
    def processor_states(self) -> tuple | None:
        """The last call's per-row processor states (or `None`)."""
        return self.arrays.processor_states

    @property
    def key(self) -> Key[Array, " batch"]:
        """Per-row PRNG keys, `Key[Array, " batch"]`."""
        return self.arrays.key

    def row_token_ids(self) -> list[list[int]]:
        """Every row's valid token ids, as Python lists (one device-to-host transfer)."""
        ids, lengths = to_host((self.arrays.token_ids, self.arrays.length))
        return [row[: int(n)].tolist() for row, n in zip(ids, lengths)]

    def texts(self, tokenizer: Any = None) -> list[str]:
        """The full text of every row (prompt included; special tokens skipped).

        **Raises:** `ValueError` without a tokenizer (given here, or kept from `generate`);
        `TokenizerMismatchError` for a tokenizer other than the one that made the state.
        """
        tokenizer = self._tokenizer(tokenizer)
        return [decode(tokenizer, ids) for ids in self.row_token_ids()]

    def __iter__(self):
        return iter(self.texts())

    def __repr__(self) -> str:
        lengths = np.asarray(to_host(self.arrays.length)).tolist()
        cached = np.asarray(to_host(self.arrays.cached)).tolist()
        return f"SequenceState(batch={self.batch_size}, lengths={lengths}, cached={cached})"

    def _tokenizer(self, tokenizer=None):
        self.check_tokenizer(tokenizer)
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError(
                "this SequenceState has no tokenizer (a loaded state, or one built from token "
                "ids): pass one, e.g. state.texts(tokenizer), or append token ids instead of text"
            )
        return tokenizer

    # --- rows -----------------------------------------------------------------------------

    def take_rows(self, idx: Sequence[int] | np.ndarray) -> "SequenceState":
        """The rows `idx` (in that order, repeats allowed): one gather over every per-row leaf,
        the per-row values of the kept processors included.

        **Raises:** `IndexError` for an index outside `[-batch, batch)`.
        """
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        n = self.batch_size
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise IndexError(f"row index {int(bad[0])} out of range for a state of {n} rows")
        if idx.size == 0:
            raise IndexError("selecting no rows: a SequenceState needs at least one row")
        idx = np.where(idx < 0, idx + n, idx)
        settings = self.settings
        if settings is not None:
            settings = _take_settings(settings, n, idx)
        return self._replace(_take(self.arrays, jnp.asarray(idx)), settings=settings)

    def repeat(self, n: int) -> "SequenceState":
        """Every row `n` times, prompt-major (`[r0, r0, r1, r1]` for `n = 2`), sharing the
        prefill; copy `j > 0` of a row gets the key `fold_in(key, j)`.

        **Raises:** `ValueError` unless `n` is a positive integer.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"repeat needs a positive integer, got {n!r}")
        out = self.take_rows(np.repeat(np.arange(self.batch_size), n))
        copy = jnp.tile(jnp.arange(n), self.batch_size)
        keys = jax.vmap(lambda k, j: jnp.where(j > 0, _fold(k, j), k))(out.arrays.key, copy)
        return out._replace(eqx.tree_at(lambda a: a.key, out.arrays, keys))

    def with_kv_cache_dtype(self, dtype: Any) -> "SequenceState":
        """The same state with its cache's keys and values converted to `dtype` (`"float32"`,
        `"bfloat16"`, a jnp dtype, or `"auto"`: bfloat16 on a GPU, float32 elsewhere), so that
        a continuation may run in that dtype (`fg.generate` refuses to continue a cache of one
        dtype in another without this explicit step). float32 -> bfloat16 rounds every key and
        value (the continuation then differs from an uninterrupted float32 run); bfloat16 ->
        float32 is exact. Nothing else changes (processor states, e.g. classifier-free
        guidance's own cache, keep theirs).

        **Returns:** `self` when there is no cache or it already has `dtype`.

        **Raises:** `ValueError` for an unsupported `dtype`.
        """
        name = resolve_kv_cache_dtype(dtype)
        cache = self.arrays.cache
        if cache is None or not cache.k or cache.k[0].dtype.name == name:
            return self
        cache = dataclasses.replace(
            cache,
            k=tuple(x.astype(name) for x in cache.k),
            v=tuple(x.astype(name) for x in cache.v),
        )
        return self._replace(eqx.tree_at(lambda a: a.cache, self.arrays, cache))

    def crop(self, n: int) -> "SequenceState":
        """Keep the first `n` tokens of every row (rows already shorter are unchanged); the
        cache forgets the rest, so a continuation regenerates from there (the last kept token is
        run again to get its next-token logits). Processor states are dropped. A model with
        sliding-window layers keeps only the newest `sliding_window + RING_RESERVE` positions of
        those layers (`KVCache`): a crop that goes back further than they reach (more than
        `RING_RESERVE + 1` tokens before the end) forgets the whole row's cache, and the
        continuation prefills the kept tokens again.

        **Raises:** `ValueError` unless `n >= 1`.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"a crop must keep at least one token per row, got {n!r}")
        a = self.arrays
        length = jnp.minimum(a.length, n)
        cut = a.length > n
        cached = jnp.where(cut, jnp.minimum(a.cached, length - 1), jnp.minimum(a.cached, length))
        cols = jnp.arange(a.token_ids.shape[1])[None, :]
        token_logprobs = jnp.where(cols < length[:, None], a.token_logprobs, 0.0)
        cache = a.cache
        if cache is not None and cache.positions.ndim != 2:
            raise ValueError(
                "cropping a state of batched classifier-free guidance is not supported (its "
                "unconditional branch has other positions); crop before guiding"
            )
        if cache is not None:
            # A ring (sliding-window layer) holds only the newest positions of a row: a crop
            # further back than it reaches prefills the row again from its first token.
            cache = cache.forget(cached)
            cached = jnp.where(cache.holds_window(cached), cached, 0)
            cache = cache.forget(cached)
        arrays = SequenceArrays(
            token_ids=a.token_ids,
            token_logprobs=token_logprobs,
            length=length,
            cached=cached,
            prompt_length=jnp.minimum(a.prompt_length, length),
            logits=a.logits,
            key=a.key,
            key_step=a.key_step,
            cache=cache,
            processor_states=None,
            stop_state=None,
        )
        return self._replace(arrays)

    def __getitem__(self, index) -> "SequenceState":
        """`state[i]`, `state[i:j]`, `state[[0, 2]]` select rows; `state[rows, :n]` also keeps
        the first `n` tokens of every row (see `crop`).

        **Raises:** `IndexError` for rows out of range; `TypeError` for an unsupported index
        (token slices other than `:n`, steps).
        """
        tokens = None
        if isinstance(index, tuple):
            if len(index) != 2:
                raise TypeError(f"a SequenceState takes [rows] or [rows, :n], got {index!r}")
            index, tokens = index
        n = self.batch_size
        if isinstance(index, slice):
            rows = np.arange(n)[index]
        elif isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            if not -n <= index < n:
                raise IndexError(f"row index {index} out of range for a state of {n} rows")
            rows = np.asarray([index])
        else:
            rows = np.asarray(index)
            if rows.dtype == bool:
                if rows.shape != (n,):
                    raise IndexError(f"a boolean row mask needs {n} entries, got {rows.shape}")
                rows = np.flatnonzero(rows)
            elif not np.issubdtype(rows.dtype, np.integer):
                raise TypeError(f"rows must be indexed by ints, slices or int lists, got {index!r}")
        out = self if (isinstance(index, slice) and index == slice(None)) else self.take_rows(rows)
        if tokens is not None:
            if (
                not isinstance(tokens, slice)
                or tokens.start not in (None, 0)
                or tokens.step not in (None, 1)
            ):
                raise TypeError(f"tokens can only be cropped as [:, :n], got {tokens!r}")
            if tokens.stop is None:
                return out
            if tokens.stop < 0:
                raise TypeError("crop with a non-negative count, [:, :n]")
            out = out.crop(tokens.stop)
        return out

    # --- appending ------------------------------------------------------------------------

    def __add__(self, other) -> "SequenceState":
        """Append to every row (see the class docstring); returns a new state whose next call
        prefills only the appended tokens.

        **Raises:** `BatchMismatchError` for a state or per-row list of another batch size;
        `TokenizerMismatchError` for a state made by another tokenizer; `ValueError` for text
        without a tokenizer or ids outside the vocabulary; `TypeError` for anything else.
        """
        n = self.batch_size
        if isinstance(other, SequenceState):
            if other.batch_size != n:
                raise BatchMismatchError(
                    f"cannot add a SequenceState of {other.batch_size} rows to one of {n} rows"
                )
            theirs = other.tokenizer_fingerprint
            if theirs is not None and self.tokenizer_fingerprint not in (None, theirs):
                raise TokenizerMismatchError(
                    "cannot add a SequenceState made by another tokenizer (fingerprint "
                    f"{theirs}) to one made by {self.tokenizer_fingerprint}"
                )
            ids, lengths, lps = to_host(
                (other.arrays.token_ids, other.arrays.length, other.arrays.token_logprobs)
            )
            rows = [r[: int(k)].tolist() for r, k in zip(ids, lengths)]
            weights = [lp[: int(k)] for lp, k in zip(lps, lengths)]
            return self._append(rows, weights)
        if isinstance(other, str):
            ids = _encode(self._tokenizer(), other)
            return self._append([ids] * n)
        if is_chat(other):
            return self._append(self._chat_turn(list(other)))
        if isinstance(other, (list, tuple, np.ndarray)):
            items = list(other)
            if items and all(isinstance(t, (int, np.integer)) for t in items):
                return self._append([list(map(int, items))] * n)
            if len(items) != n:
                raise BatchMismatchError(
                    f"per-row additions need one entry per row: got {len(items)} for {n} rows"
                )
            rows = []
            for item in items:
                if isinstance(item, str):
                    rows.append(_encode(self._tokenizer(), item))
                elif all(isinstance(t, (int, np.integer)) for t in item):
                    rows.append(list(map(int, item)))
                else:
                    raise TypeError(f"cannot append {item!r} to a row")
            return self._append(rows)
        raise TypeError(
            "a SequenceState can be added a str, a list of token ids, chat messages, one str or "
            f"id list per row, or another SequenceState; got {type(other).__name__}"
        )

    def _append(self, rows: list[list[int]], weights=None) -> "SequenceState":
        a = self.arrays
        vocab = a.logits.shape[-1]
        _check_ids(rows, vocab)
        ids, lps, lengths = to_host((a.token_ids, a.token_logprobs, a.length))
        new_lengths = [int(k) + len(r) for k, r in zip(lengths, rows)]
        cap = max(ids.shape[1], bucket_length(max(new_lengths)))
        new_ids = np.zeros((len(rows), cap), np.int32)
        new_lps = np.zeros((len(rows), cap), np.float32)
        new_ids[:, : ids.shape[1]] = ids
        new_lps[:, : ids.shape[1]] = lps
        for i, (k, r) in enumerate(zip(lengths, rows)):
            k = int(k)
            new_ids[i, k : k + len(r)] = r
            new_lps[i, k:] = 0.0
            if weights is not None:
                new_lps[i, k : k + len(r)] = weights[i]
        arrays = eqx.tree_at(
            lambda x: (x.token_ids, x.token_logprobs, x.length, x.processor_states, x.stop_state),
            a,
            (
                jnp.asarray(new_ids),
                jnp.asarray(new_lps),
                jnp.asarray(new_lengths, jnp.int32),
                None,
                None,
            ),
            is_leaf=lambda x: x is None,
        )
        return self._replace(arrays)

    def _chat_turn(self, messages: list[dict]) -> list[list[int]]:
        """Per row: the tokens that continue a chat with `messages` (the chat template's text
        after an assistant turn, then the new messages and the generation prompt)."""
        tokenizer = self._tokenizer()
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; append text instead")
        sentinel = "\ue000\ue001\ue002"
        before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": sentinel}]
        text = tokenizer.apply_chat_template(
            before + messages, tokenize=False, add_generation_prompt=True
        )
        tail = text[text.index(sentinel) + len(sentinel) :]
        rows = []
        for ids in self.row_token_ids():
            last = tokenizer.decode(ids[-1:], skip_special_tokens=False) if ids else ""
            rest = tail[len(last) :] if last and tail.startswith(last) else tail
            rows.append(_encode(tokenizer, rest))
        return rows

    # --- saving ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to a safetensors file: the tokens, logprobs, lengths, next-token
        logits, per-row keys and key steps, the KV cache (as float32), and a JSON header (format
        name and version, the model and tokenizer fingerprints, the key implementation, the
        cache's layers and dtype). `load` gives the cache its recorded dtype back (a bfloat16
        cache round-trips exactly through float32), and a continuation of the loaded state
        runs in that dtype (see `GenerationOptions.kv_cache_dtype`).

        The write is atomic and durable: the bytes go to a temporary file beside `path`
        (`.{name}.{pid}.{random}.fg-partial`), which is `fsync`ed, renamed over `path`
        (`os.replace`), and then the directory is `fsync`ed, so after a crash or a power cut
        `path` holds the old state or the new one, never a part. An interrupted save (an
        exception, Ctrl-C) removes its temporary file; one left by a killed process (its pid no
        longer running) is removed by the next save into that directory.

        Not saved, because they only mean something with Python objects that are not arrays:
        the call's settings (`self.settings`: processors, which may hold a model or an
        automaton, sampler, EOS and pad ids, stop strings), the processors' states
        (`processor_states`, e.g. `MirostatV2`'s running `mu`, a constraint's automaton state,
        classifier-free guidance's unconditional cache) and the stop-string matchers'
        progress (`stop_state`); and the tokenizer. A loaded state therefore continues like the
        original state continued with explicit arguments (`processors=`, `sampler=`,
        `eos_token_id=`, ...): the processors start anew over the whole text, with identical
        tokens for the same arguments and keys and without recompiling. Continued with no
        decoding arguments it uses the model's generation config, NOT the previous call's
        settings (pass them again, as with transformers' `past_key_values`).

        **Arguments:** `path`: the file to write (overwritten).

        **Raises:** `OSError` (e.g. `FileNotFoundError` for a missing directory) when the file
        cannot be written; `path` is then unchanged.
        """
        a = self.arrays
        tensors = {
            "token_ids": a.token_ids,
            "token_logprobs": a.token_logprobs,
            "length": a.length,
            "cached": a.cached,
            "prompt_length": a.prompt_length,
            "logits": a.logits,
            "key": jax.random.key_data(a.key),
            "key_step": a.key_step,
        }
        header = {
            "version": 2,
            "model_fingerprint": self.model_fingerprint,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "key_impl": str(jax.random.key_impl(a.key)),
            "num_layers": 0 if a.cache is None else len(a.cache.k),
            "cache_dtype": None if a.cache is None else str(a.cache.k[0].dtype),
        }
        if a.cache is not None and a.cache.ring_layers:  # format 3; without rings still 2
            header["version"] = 3
            header["ring_layers"] = list(a.cache.ring_layers)
            header["sliding_window"] = a.cache.sliding_window
        if a.cache is not None:
            tensors["cache.positions"] = a.cache.positions
            tensors["cache.length"] = a.cache.length
            if a.cache.ring_positions is not None:
                tensors["cache.ring_positions"] = a.cache.ring_positions
            for i, (k, v) in enumerate(zip(a.cache.k, a.cache.v)):
                tensors[f"cache.k.{i}"] = k.astype(jnp.float32)
                tensors[f"cache.v.{i}"] = v.astype(jnp.float32)
        host = {name: np.ascontiguousarray(to_host(x)) for name, x in tensors.items()}
        write_atomically(os.fspath(path), encode_state(host, header))

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer: Any = None) -> "SequenceState":
        """Read a state written by `save` (then continue it with `fg.generate`). The state has
        no settings and `processor_states` / `stop_state` are `None` (see `save`); pass the
        decoding arguments to the continuation. `tokenizer` is kept for `+ "text"` and `texts()`,
        and checked against the saved tokenizer fingerprint.

        Reads format versions 1, 2 and 3 (`READABLE_VERSIONS`). A version-1 file records no
        tokenizer fingerprint: its state is continued with any tokenizer unchecked (it adopts
        the fingerprint of the first tokenizer it is given).

        **Raises:** `FileNotFoundError`; `SequenceStateFormatError` for a file that is not a
        saved `SequenceState`, has another format version, lacks a header field or a tensor
        (naming each missing one), or holds tensors of inconsistent shapes;
        `TokenizerMismatchError` when `tokenizer` is not the tokenizer that made the state.
        """
        path = os.fspath(path)
        header, arrays = decode_state(path)
        if tokenizer is not None:
            where = f"the SequenceState in {path!r}"
            _refuse_other_tokenizer(header.get("tokenizer_fingerprint"), None, tokenizer, where)
        cache = None
        if header["num_layers"]:
            dtype = jnp.dtype(header["cache_dtype"])
            layers = range(header["num_layers"])
            cache = KVCache(
                k=tuple(jnp.asarray(arrays[f"cache.k.{i}"], dtype) for i in layers),
                v=tuple(jnp.asarray(arrays[f"cache.v.{i}"], dtype) for i in layers),
                positions=jnp.asarray(arrays["cache.positions"]),
                length=jnp.asarray(arrays["cache.length"]),
            )
            if header.get("ring_layers"):  # format 3: sliding-window layers in rings
                cache = dataclasses.replace(
                    cache,
                    ring_positions=jnp.asarray(arrays["cache.ring_positions"]),
                    ring_layers=tuple(header["ring_layers"]),
                    sliding_window=int(header["sliding_window"]),
                )
        impl = header["key_impl"]
        impl = impl[impl.index("[") + 1 : impl.rindex("]")] if "[" in impl else impl
        seq = SequenceArrays(
            token_ids=jnp.asarray(arrays["token_ids"]),
            token_logprobs=jnp.asarray(arrays["token_logprobs"]),
            length=jnp.asarray(arrays["length"]),
            cached=jnp.asarray(arrays["cached"]),
            prompt_length=jnp.asarray(arrays["prompt_length"]),
            logits=jnp.asarray(arrays["logits"]),
            key=jax.random.wrap_key_data(jnp.asarray(arrays["key"]), impl=impl),
            key_step=jnp.asarray(arrays["key_step"]),
            cache=cache,
            processor_states=None,
            stop_state=None,
        )
        return cls(
            seq,
            model_fingerprint=header["model_fingerprint"],
            tokenizer=tokenizer,
            tokenizer_fingerprint=header.get("tokenizer_fingerprint"),
        )


def _refuse_other_tokenizer(ours: str | None, own: Any, tokenizer: Any, where: str) -> None:
    """Raise `TokenizerMismatchError` when `tokenizer`'s fingerprint is known and differs from
    `ours` (the fingerprint of the tokenizer `own`, when that object is at hand)."""
    if ours is None:
        return
    theirs = tokenizer_fingerprint(tokenizer)
    if theirs is None or theirs == ours:
        return
    made_by = f" ({type(own).__name__} of {_size(own)} tokens)" if own is not None else ""
    raise TokenizerMismatchError(
        f"{where} was made by another tokenizer: its fingerprint is {ours}{made_by}, the "
        f"given `tokenizer` ({type(tokenizer).__name__} of {_size(tokenizer)} tokens) has "
        f"{theirs}; token ids only mean the same text with the tokenizer that made them (pass "
        "that one, or start again from the text)"
    )


def _size(tokenizer) -> str:
    try:
        return str(len(tokenizer))
    except TypeError:
        return "?"


def _fold(key, j):
    return jax.random.fold_in(key, j)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _check_ids(rows: Sequence[Sequence[int]], vocab_size: int) -> None:
    bad = [t for ids in rows for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token ids out of range [0, {vocab_size}): {bad[:8]}")


def _take_settings(settings, batch: int, idx: np.ndarray):
    """The settings with every per-row processor value gathered like the rows."""
    step = settings.step
    rows, shared = split_rows(step.processors, batch)
    rows = jax.tree.map(lambda x: x[jnp.asarray(idx)], rows)
    processors = eqx.combine(rows, shared)
    return settings.with_step(eqx.tree_at(lambda s: s.processors, step, processors))
