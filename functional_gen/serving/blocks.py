"""`BlockAllocator`: the host side of the serving engine's paged KV cache (pure Python and numpy).

Source: vLLM (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", SOSP '23): the keys and values of every request live in fixed-size
blocks of `block_size` tokens in one pool per layer; a per-request *block table* maps the
request's logical block `j` (its positions `[j * block_size, (j + 1) * block_size)`) to a
physical block of the pool, so memory follows the tokens in use instead of `max_len` per slot.
The allocator follows vLLM's block manager (`vllm/core/block_manager.py`, and the v1
`KVCacheManager` / `BlockPool` with *automatic prefix caching*, `docs/design/prefix_caching.md`):

- a free list of physical blocks and a reference count per block;
- per slot a row of the block table (`int32[max_slots, max_blocks_per_slot]`, `-1` = none),
  grown by `extend` as the request's tokens grow, released by `free` when it ends;
- **prefix caching**: a FULL block of a prompt is keyed by the hash of (the key of the block
  before it, the block's tokens): vLLM's hash chain, so a key names the block's tokens AND
  everything before them. A later prompt whose leading full blocks have registered keys takes
  those physical blocks by reference (reference count + 1) and prefills only from the first
  uncached position; each such block is a `prefix_cache_hits` hit. A block whose count drops to
  0 keeps its key and contents ("cached", not free) until it is needed: when the free list is
  empty, the least recently freed cached block is evicted (its key forgotten) and reused, as
  vLLM's evictor does.

**Two ways to admit** (`BlockAllocator(on_demand=...)`):

- *worst case* (`on_demand=False`): `admit` reserves a request's worst case up front, the
  blocks of `max_tokens` (prompt plus `max_new_tokens` positions) not shared from the cache.
  Physical blocks are still taken only as the request grows (`extend`, so `blocks_in_use`
  follows the tokens written), and a reservation not used (a request that stops early) returns
  to the pool with `free`. `extend` never fails.
- *on demand* (`on_demand=True`, vLLM's v1 scheduler, `vllm/v1/core/sched/scheduler.py`;
  Kwon et al. 2023 §4.5): `admit` reserves nothing beyond the blocks the request takes at once;
  it admits when the prompt's blocks plus one dispatch of growth (`lookahead` positions) fit,
  beside a watermark that keeps one dispatch of growth for every request already holding blocks
  (`headroom`: so an admission never forces a preemption at the next dispatch). `extend` takes
  blocks as the request grows and returns `False` (taking nothing) when the pool has too few:
  the engine then preempts the most recently admitted request
  (`serving.preemption.Preemptor.make_room`: `register_tokens` keeps its full blocks in the
  prefix cache, `free` returns them) and queues it again, to be prefilled over its prompt and
  the tokens it had generated.

Either way an admission that does not fit returns `None`: the request waits in the queue;
nothing is dropped and no slot's blocks are ever overwritten or taken from it.
"""

import collections
import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np


def block_key(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: SHA-256 of the key of the block before it (`None`
    for a prompt's first block) and the block's token ids (vLLM's hash chain: equal keys mean
    equal tokens in this block and in every block before it).

    **Arguments:** `parent`: the previous block's key or `None`; `tokens`: the block's
    `block_size` token ids.

    **Returns:** a 32-byte digest."""
    digest = hashlib.sha256(parent or b"root")
    digest.update(np.asarray(tokens, np.int64).tobytes())
    return digest.digest()


@dataclasses.dataclass(frozen=True)
class Admission:
    """What `BlockAllocator.admit` granted a request.

    **Attributes:** `slot`; `cached_tokens`: the leading prompt positions whose keys and values
    are already in shared blocks (a multiple of `block_size`; the prefill starts there);
    `keys`: the prefix-cache keys of the prompt's full blocks (registered by `register` once the
    prefill wrote them)."""

    slot: int
    cached_tokens: int
    keys: tuple[bytes, ...]


class BlockAllocator:
    """Blocks of a paged KV cache: free list, reference counts, per-slot block tables and the
    prefix cache (see the module docstring for the design and its source, vLLM).

    **Arguments:** `num_blocks`: physical blocks in the pool; `block_size`: tokens per block;
    `max_slots`: rows of the block table; `max_blocks_per_slot`: its columns (the most blocks one
    request may hold: `ceil(max_len / block_size)`); `prefix_caching`: share and keep full
    prompt blocks (default `True`); `on_demand`: admit on the prompt's blocks and take the rest
    as the request grows (`extend` may then fail: the caller preempts), instead of reserving
    every admitted request's worst case (default `False`; see the module docstring).

    **Attributes:** `block_tables: int32[max_slots, max_blocks_per_slot]` (`-1` = no block),
    `ref_counts: int32[num_blocks]`, `prefix_cache_hits` (blocks taken from the cache, total),
    `prefix_cache_queries` (full prompt blocks looked up, total).

    **Raises:** `ValueError` for a non-positive argument.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_slots: int,
        max_blocks_per_slot: int,
        *,
        prefix_caching: bool = True,
        on_demand: bool = False,
    ):
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("max_slots", max_slots),
            ("max_blocks_per_slot", max_blocks_per_slot),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_slots = max_slots
        self.max_blocks_per_slot = max_blocks_per_slot
        self.prefix_caching = prefix_caching
        self.on_demand = on_demand
        self.block_tables = np.full((max_slots, max_blocks_per_slot), -1, np.int32)
        self.ref_counts = np.zeros((num_blocks,), np.int32)
        self._free: collections.deque[int] = collections.deque(range(num_blocks))
        # refcount-0 blocks that keep a prefix key, least recently freed first
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._key_of: dict[int, bytes] = {}  # block -> its registered prefix key
        self._block_of: dict[bytes, int] = {}  # prefix key -> block
        self._held = np.zeros((max_slots,), np.int32)  # blocks in each slot's table
        self._reserved = np.zeros((max_slots,), np.int32)  # blocks promised, not yet taken
        self._cap = np.zeros((max_slots,), np.int32)  # most blocks each slot may hold
        # positions each slot's blocks were last extended to cover (`extend`): its length never
        # passes it (a dispatch writes at most what its `extend` asked for)
        self._reach = np.zeros((max_slots,), np.int64)
        self._live = np.zeros((max_slots,), bool)
        self.prefix_cache_hits = 0
        self.prefix_cache_queries = 0

    # ---- state ----------------------------------------------------------------------------

    @property
    def blocks_in_use(self) -> int:
        """Physical blocks referenced by at least one live slot."""
        return int(np.count_nonzero(self.ref_counts))

    @property
    def cached_blocks(self) -> int:
        """Blocks no slot references that still hold a registered prompt prefix (evictable)."""
        return len(self._cached)

    @property
    def available(self) -> int:
        """Blocks a new admission may still promise: free plus cached, minus what live slots
        have reserved and not yet taken (nothing is reserved `on_demand`)."""
        return len(self._free) + len(self._cached) - int(self._reserved.sum())

    def headroom(self, lookahead: int) -> int:
        """`on_demand`: the blocks that the live slots may take in their next dispatch of
        `lookahead` positions, at most: per slot `min(ceil((reach + lookahead) / block_size),
        cap) - held`, `reach` the positions its blocks were last extended to cover (its length
        is at most that) and `cap` its `max_tokens`' blocks. `admit` keeps them free (vLLM's
        watermark, sized by the next dispatch), so an admission never forces a preemption at
        the next dispatch. 0 when not `on_demand` (every slot's growth is reserved)."""
        if not self.on_demand:
            return 0
        bs = self.block_size
        want = np.minimum(-(-(self._reach + max(lookahead, 0)) // bs), self._cap)
        room = np.maximum(want - self._held, 0)
        return int(np.sum(np.where(self._live, room, 0)))

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` positions: `ceil(num_tokens / block_size)`."""
        return -(-num_tokens // self.block_size)

    # ---- requests -------------------------------------------------------------------------

    def admit(
        self, slot: int, token_ids: Sequence[int], max_tokens: int, *, lookahead: int = 0
    ) -> Admission | None:
        """Admit a request into `slot`: share the prompt's cached leading blocks, take blocks for
        the rest of the prompt, and reserve the blocks of up to `max_tokens` positions (worst
        case), or (`on_demand`) only check that the blocks of the prompt plus `lookahead`
        positions fit beside `headroom(lookahead)`, the next dispatch of every live slot.

        At most `(len(token_ids) - 1) // block_size` blocks come from the cache: the prompt's
        last token is always prefilled (its logits start the decoding), as in vLLM.

        **Arguments:** `slot`: a slot in `[0, max_slots)` that holds no request;
        `token_ids`: the prompt; `max_tokens`: the most positions the request writes (prompt
        plus `max_new_tokens`), at most `max_blocks_per_slot * block_size`; `lookahead`
        (`on_demand` only): the positions one dispatch writes per slot (`num_steps x
        tokens_per_step`).

        **Returns:** an `Admission`, or `None` when the pool cannot promise the blocks now (the
        request waits; nothing changed).

        **Raises:** `ValueError` for a slot out of range or busy, an empty prompt, or
        `max_tokens` shorter than the prompt or beyond a slot's table.
        """
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} is outside [0, {self.max_slots})")
        if self._live[slot]:
            raise ValueError(f"slot {slot} already holds a request")
        n = len(token_ids)
        if n < 1:
            raise ValueError("the prompt is empty")
        if not n <= max_tokens <= self.max_blocks_per_slot * self.block_size:
            raise ValueError(
                f"`max_tokens`={max_tokens} must be in [{n} (the prompt), "
                f"{self.max_blocks_per_slot * self.block_size} (a slot's blocks)]"
            )
        bs = self.block_size
        keys: list[bytes] = []
        for j in range(n // bs):
            keys.append(block_key(keys[-1] if keys else None, token_ids[j * bs : (j + 1) * bs]))
        hits: list[int] = []
        if self.prefix_caching:
            for key in keys[: (n - 1) // bs]:
                block = self._block_of.get(key)
                if block is None:
                    break
                hits.append(block)
        cap = self.blocks_needed(max_tokens)
        revived = int(sum(self.ref_counts[b] == 0 for b in hits))  # cached blocks taken back
        if self.on_demand:
            need = self.blocks_needed(min(n + max(lookahead, 0), max_tokens)) - len(hits)
            spare = self.available - revived - self.headroom(lookahead)
        else:
            need, spare = cap - len(hits), self.available - revived
        if need > spare:
            return None
        self.prefix_cache_queries += min(len(keys), (n - 1) // bs) if self.prefix_caching else 0
        self.prefix_cache_hits += len(hits)
        for j, block in enumerate(hits):
            if self.ref_counts[block] == 0:
                del self._cached[block]
            self.ref_counts[block] += 1
            self.block_tables[slot, j] = block
        self._held[slot] = len(hits)
        self._reserved[slot] = 0 if self.on_demand else need
        self._cap[slot] = cap
        self._live[slot] = True
        taken = self.extend(slot, n)
        assert taken, "the prompt's blocks were counted in `need`"
        return Admission(slot, len(hits) * bs, tuple(keys))

    def extend(self, slot: int, num_tokens: int) -> bool:
        """Give `slot` blocks for its first `num_tokens` positions, at most the blocks of its
        `max_tokens` (positions past them are not given blocks: a decode step writing there
        drops its keys, which no later token reads). Worst case: taken from its reservation,
        never refused. `on_demand`: taken from the free and cached blocks, all or none.

        **Returns:** `True` when the slot now holds them; `False` (`on_demand` only; nothing
        taken) when the pool has fewer free and cached blocks than are missing.

        **Raises:** `ValueError` for a slot that holds no request."""
        if not self._live[slot]:
            raise ValueError(f"slot {slot} holds no request")
        want = min(self.blocks_needed(num_tokens), int(self._cap[slot]))
        short = want - int(self._held[slot])
        if self.on_demand and short > self.available:
            return False
        self._reach[slot] = max(int(self._reach[slot]), num_tokens)
        if short <= 0:
            return True
        for _ in range(short):
            block = self._take()
            self.ref_counts[block] = 1
            self.block_tables[slot, self._held[slot]] = block
            self._held[slot] += 1
            if not self.on_demand:
                self._reserved[slot] -= 1
        return True

    def register(self, admission: Admission) -> None:
        """Record the prompt's full blocks of `admission` in the prefix cache (call it once the
        prefill that writes them has been issued): later prompts starting with the same blocks
        share them. A key already registered (another block holds the same prefix) is kept."""
        if not self.prefix_caching:
            return
        for j, key in enumerate(admission.keys):
            block = int(self.block_tables[admission.slot, j])
            if key not in self._block_of and block not in self._key_of:
                self._block_of[key] = block
                self._key_of[block] = key

    def register_tokens(self, slot: int, token_ids: Sequence[int]) -> None:
        """Record the full blocks of `slot` that hold `token_ids` (its first `len(token_ids)`
        positions, all written) in the prefix cache, generated tokens included (vLLM caches
        every full block): called before a preempted request's `free`, so that its readmission
        over the same tokens takes them back instead of recomputing them, and before a finished
        or cancelled one's (`PagedKV.release`), so that a conversation's next turn, whose prompt
        repeats this request's prompt and answer, takes them too. Keys as
        `register`'s (`block_key` chain); a key or block already registered is kept."""
        if not self.prefix_caching or not self._live[slot]:
            return
        bs, parent = self.block_size, None
        for j in range(min(len(token_ids) // bs, int(self._held[slot]))):
            parent = block_key(parent, token_ids[j * bs : (j + 1) * bs])
            block = int(self.block_tables[slot, j])
            if parent not in self._block_of and block not in self._key_of:
                self._block_of[parent] = block
                self._key_of[block] = parent

    def free(self, slot: int) -> None:
        """Release `slot`'s blocks and reservation (the request ended, was cancelled or
        preempted). A block whose count drops to 0 goes to the free list, or, when it holds a
        registered prefix, to the cached blocks (most recently used last), last block first, as
        vLLM's `KVCacheManager.free` does: the tail of a chain is evicted before its head, so
        that what stays cached is still a prefix a later request can take. Freeing an empty
        slot does nothing."""
        if not self._live[slot]:
            return
        for block in self.block_tables[slot, : self._held[slot]].tolist()[::-1]:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if block in self._key_of:
                    self._cached[block] = None
                else:
                    self._free.append(block)
        self.block_tables[slot] = -1
        self._held[slot] = 0
        self._reserved[slot] = 0
        self._cap[slot] = 0
        self._reach[slot] = 0
        self._live[slot] = False

    def _take(self) -> int:
        """A block for a new owner: from the free list, else the least recently freed cached
        block, evicted (its prefix key forgotten)."""
        if self._free:
            return self._free.popleft()
        block, _ = self._cached.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        return block

    def check(self) -> None:
        """Assert the invariants (for tests): every block is referenced, free or cached, exactly
        one of them; each count equals the table entries naming the block; a block in two live
        tables holds a registered prefix; no slot holds more than its `max_tokens` need; worst
        case: each slot's blocks plus reservation are its `max_tokens`, and the reservations fit
        in what is free or cached; on demand: nothing is reserved.

        **Raises:** `AssertionError` naming the broken invariant."""
        counts = np.zeros_like(self.ref_counts)
        owners: dict[int, int] = {}
        for slot in range(self.max_slots):
            row = self.block_tables[slot]
            held = int(self._held[slot])
            assert np.all(row[held:] == -1), f"slot {slot}: entries past its {held} blocks"
            assert np.all(row[:held] >= 0), f"slot {slot}: a hole in its table"
            assert len(set(row[:held].tolist())) == held, f"slot {slot}: a block twice"
            assert self._live[slot] or held == 0, f"slot {slot}: idle but holds blocks"
            assert held <= self._cap[slot] or not self._live[slot], f"slot {slot}: over its cap"
            if self._live[slot] and not self.on_demand:
                assert held + self._reserved[slot] == self._cap[slot], f"slot {slot}: reservation"
            assert not self.on_demand or self._reserved[slot] == 0, "reserved on demand"
            for block in row[:held].tolist():
                counts[block] += 1
                if block in owners:
                    assert block in self._key_of, f"block {block} shared without a prefix key"
                owners[block] = slot
        assert np.array_equal(counts, self.ref_counts), "reference counts != table entries"
        free, cached = set(self._free), set(self._cached)
        assert len(free) == len(self._free), "a block twice in the free list"
        assert not free & cached, "a block both free and cached"
        referenced = set(np.flatnonzero(self.ref_counts).tolist())
        assert not referenced & (free | cached), "a referenced block is free or cached"
        assert len(referenced | free | cached) == self.num_blocks, "a block is lost"
        assert all(self._key_of.get(b) is not None for b in cached), "a cached block has no key"
        assert {self._block_of[k] for k in self._block_of} == set(self._key_of), "key maps differ"
        assert int(self._reserved.sum()) <= len(free) + len(cached), "over-committed"
