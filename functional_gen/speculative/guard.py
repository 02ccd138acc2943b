"""`ProposalGuard`: the rows' constraints walked over a step's guesses, before verification.

A constraint (`functional_gen.structured`: `Regex`, `JsonSchema`, `Choice`, `Grammar`, ...)
forbids tokens; the target's processors mask them at verification, so a guess the constraint
forbids is always rejected, and verifying it (and every guess after it) is wasted work. The
guard runs only the step's constraint processors (`AbstractConstraint`) from each row's
current processor states over the guesses, position by position (a `lax.scan`, on the device,
as the verification does), and

- `admissible` truncates every row's guesses at the first one its constraint forbids (a prompt
  lookup's guesses, or anything a proposer returns);
- `mask` / `push` let a draft model mask its own distribution at every guess, so that it only
  ever guesses admissible tokens; its `q` is then the MASKED, renormalised draft distribution,
  the one the guesses are really drawn from, so rejection sampling stays exact
  (`functional_gen.speculative.acceptance`: any `q` is lossless when the guesses follow it).

Constraints advance lagged (on the last token of the context, at the next position), so the
guard's carry is the constraint states plus the rows' tokens with the guesses written after
them: position `j` sees the row's text and guesses `0 .. j - 1`, exactly as the target's
processing of position `j` does.

Source: llguidance's and XGrammar's "mask the draft tokens" for speculative decoding (on the
host there; here the automaton tables on the device).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key, PyTree

from ..processors.base import Context, process_all, vmap_rows
from ..structured.processor import AbstractConstraint


class GuardState(eqx.Module):
    """The guard's carry along the guesses: the constraint processors' `states` (one entry per
    constraint, batch leading), the rows' `token_ids` (`Int[Array, "batch max_len"]`) with the
    guesses so far written after the text, and `length` (`Int[Array, " batch"]`: the position
    of the next guess)."""

    states: tuple[PyTree, ...]
    token_ids: Int[Array, "batch max_len"]
    length: Int[Array, " batch"]


class ProposalGuard(eqx.Module):
    """The constraint processors of a step, with what their contexts need besides the tokens.

    Build it with `ProposalGuard.of` (which returns `None` when the step has no constraint).

    **Attributes:** `processors` (the `AbstractConstraint`s, in the step's order),
    `prompt_length`, `max_new_tokens` (`Int[Array, " batch"]`, as the step's contexts hold
    them: `max_new_tokens` counts from the prompt), `key` (`Key[Array, " batch"]`, unused by
    constraints, present because a `Context` holds one), `vocab_size` (static: the width of the
    logits the constraints mask).
    """

    processors: tuple[AbstractConstraint, ...]
    prompt_length: Int[Array, " batch"]
    max_new_tokens: Int[Array, " batch"]
    key: Key[Array, " batch"]
    vocab_size: int = eqx.field(static=True)

    @staticmethod
    def of(
        processors,
        processor_states,
        token_ids,
        length,
        prompt_length,
        max_new_tokens,
        key,
        vocab_size: int,
    ) -> "tuple[ProposalGuard, GuardState] | tuple[None, None]":
        """The guard of a step and its carry at the rows' current position.

        **Arguments:** `processors` (the step's processors), `processor_states` (their states,
        one entry per processor, batch leading), the rows' `token_ids` (`Int[Array, "batch
        max_len"]`), `length`, `prompt_length`, `max_new_tokens` (`Int[Array, " batch"]`,
        counted from the prompt), `key` (one per row), `vocab_size` (the logits' width).

        **Returns:** `(guard, carry)`, or `(None, None)` when no processor is a constraint.
        """
        which = [i for i, p in enumerate(processors) if isinstance(p, AbstractConstraint)]
        if not which:
            return None, None
        guard = ProposalGuard(
            processors=tuple(processors[i] for i in which),
            prompt_length=prompt_length,
            max_new_tokens=max_new_tokens,
            key=key,
            vocab_size=vocab_size,
        )
        states = tuple(processor_states[i] for i in which)
        return guard, GuardState(states, token_ids, length)

    def mask(
        self, carry: GuardState, logits: Float[Array, "batch vocab"]
    ) -> tuple[GuardState, Float[Array, "batch vocab"]]:
        """The constraints at the carry's position: their new states, and `logits` with every
        forbidden token at `-inf` (other logits unchanged)."""
        contexts = Context(
            token_ids=carry.token_ids,
            length=carry.length,
            prompt_length=self.prompt_length,
            max_new_tokens=self.max_new_tokens,
            key=self.key,
        )
        states, masked = vmap_rows(process_all, self.processors, logits.shape[0])(
            carry.states, logits, contexts
        )
        return GuardState(states, carry.token_ids, carry.length), masked

    def push(self, carry: GuardState, tokens: Int[Array, " batch"]) -> GuardState:
        """The carry one guess further: `tokens` written at each row's position."""
        rows = jnp.arange(tokens.shape[0])
        token_ids = carry.token_ids.at[rows, carry.length].set(tokens, mode="drop")
        return GuardState(carry.states, token_ids, carry.length + 1)

    def admissible(
        self,
        carry: GuardState,
        guesses: Int[Array, "batch k"],
        num_guesses: Int[Array, " batch"],
    ) -> Int[Array, " batch"]:
        """How many leading guesses of every row its constraint allows (at most `num_guesses`):
        the guesses are cut at the first forbidden one.

        **Arguments:** `carry` (from `of`: the rows' current position), `guesses` (`-1`: no
        guess), `num_guesses` (the row's guesses that count).

        **Returns:** `Int[Array, " batch"]`, in `[0, num_guesses]`.
        """
        batch, k = guesses.shape
        zeros = jnp.zeros((batch, self.vocab_size), jnp.float32)
        rows = jnp.arange(batch)

        def walk(carry, guess):
            carry, masked = self.mask(carry, zeros)
            allowed = (guess >= 0) & (masked[rows, jnp.maximum(guess, 0)] > -jnp.inf)
            return self.push(carry, guess), allowed

        _, allowed = jax.lax.scan(walk, carry, guesses.T)  # [k, batch]
        allowed = allowed.T & (jnp.arange(k)[None, :] < num_guesses[:, None])
        return jnp.sum(jnp.cumprod(allowed.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
