"""`PushdownAutomaton`: a context-free grammar run on the device with a bounded stack.

Modules: `automaton` (the tables and constants), `building` (`build_pushdown`), `token_walk`
(the token walk of step 3 below) and `token_tables` (its bitmask rows and candidates), `budget`
(the token budget and stack room, step 3 on the device), `constraint` (`PushdownConstraint`,
the device side), `register_walk` (a member-set register per stack frame for objects read in any
order, `json_schema.register_objects`: the device walk and its processor) and `register_budget`
(the token budget of those frames: the members still missing counted).

The bounded-depth DFA of `functional_gen.structured.grammar` unrolls recursion, and its states
double with every level of JSON nesting. Here the grammar keeps its recursion: it becomes a
*recursive transition network*, one minimal automaton per recursive rule, whose "call" edges
push a return position on a stack. Each row's state is `(position, stack, stack_pointer)`:
int32 scalars and an `int32[stack_depth]` array, so the depth costs memory, not states.

**Compilation (host, numpy).**

1. The rules that break every cycle of the rule graph are cut (`grammar_rules.cut_rules`: `value` for
   JSON); every other reference is inlined. The start rule and each cut rule become minimal
   automata over byte classes and call symbols (`grammar_rules.RuleBuilder`). Their states, numbered in
   one space, are the *positions* (position 0 is dead).
2. Each (position, byte) gets ONE action: read the byte in the current rule (`next > 0`),
   possibly after calls into rules that start with it (the return positions to push, at most
   `pushes` of them, in `push`); or return (`next == POP`) when the rule may end here and cannot
   read the byte, so the byte is retried at the position popped from the stack; or reject. A
   grammar in which one byte could be read in two ways (the byte itself and a call, two calls,
   a rule that matches the empty string, left recursion) is refused with `NotDeterministic`
   (`Grammar` then falls back to the bounded-depth DFA), except that with `forks=True` a byte
   read in two ways becomes a *fork* (see "Forks" below). Returning only when the rule cannot
   continue is the longest-match rule of lexers; so that it never hides a text, a rule that may
   end before a byte and also read that byte itself, where one of its return positions reads it
   too, is refused as well (a one-byte lookahead cannot tell; with `forks=True`, a fork whose
   ways are "read it here" and "return and read it below"). A call whose return position
   can only end the rule is a tail call and pushes nothing. (JSON Schemas use a byte DFA with
   call edges to a JSON value rule as the bottom frame instead of a start rule: `top`.)
3. Token masks. A token either reads its bytes inside the rules it enters (whatever is below on
   the stack), or returns from the current rule and then depends on the return positions on the
   stack. We walk every token from every position along the vocabulary's byte trie (as
   `byte_dfa.lift` does). Positions from which no token returns are walked once; the others once
   per *slot*, the return position on top of the stack (slot 0: the stack is empty), since the
   first return goes there (the once-walk of a position stops at its first return, and a
   position's slots share one walk's tables). A further return below branches over every
   return position its rule has in the grammar (a superset of what the stack can hold). A
   token accepted on every branch is *context-independent*: it goes into a packed bitmask per
   (position, slot, free stack slots it needs), so a nearly full stack drops the tokens that
   would overflow it. A token accepted on some branches only is a *candidate*: the padded list
   `candidates[position, slot]` (at most `K` of them; 3-10 for the test grammars) is checked on
   the device. Tokens rejected on every branch are never allowed. (Cf. XGrammar's
   context-independent and context-dependent tokens, Dong et al. 2024, arXiv 2411.15100.)
   The walks share their work: all origins of a pass walk the trie together, each trie node
   holding the state of every origin after its bytes (one function per node, shared by the
   nodes with the same parent function and byte class, as `byte_dfa.lift` does), so the cost
   is per distinct function, not per (trie node, state).

**On the device, per step and row** (`PushdownConstraint.process`):

1. advance on the previous token: its bytes one by one (`token_bytes`, a `while_loop` over its
   length), each byte popping while the position says `POP`, then reading or pushing;
2. mask: the bitmask row `masks[mask_row[position, slot, min(room, levels - 1)]]` unpacked over
   the vocabulary (`slot` from the top of the stack, `room` the free stack slots), plus the `K`
   candidates walked from the row's real stack (vectorised, a
   fixed-length loop over their bytes); a token that would push beyond `stack_depth` is not
   allowed; the end-of-generation ids are allowed when the position and every return position
   on the stack may end;
3. the budget and the stack, as the DFA processors keep the budget: with `r` tokens left (this
   one included), a token is allowed only if the configuration after it can end within `r - 1`
   tokens *and within the stack*. The bound is `need = token_distance[position, room] +
   sum_j token_distance[stack[j], stack_depth - j]`, the fewest tokens that finish each frame
   with the free stack slots it runs with (`pushdown.budget`: a shortest path over the token
   moves the walk of step 3 saw, per room; `UNREACHABLE` where nothing fits). The first token
   of the top frame's shortest completion (`best_token`) always exists and lowers `need` by one,
   so a row that keeps `need <= r` always has a token left, never runs out of stack, and ends
   inside the language; at `r = 1` only tokens that complete the text (or EOS) remain. Bitmask
   tokens are in a room's row only from their *level* on (their peak and the free slots that
   finishing the text after them needs, `building._min_rooms`). The bitmask row is used whole
   while the stack's `need` plus `token_cost[position, slot]` (the largest `need` a bitmask
   token leaves above the stack) fits in `r - 1`; closer to the end only the one-byte tokens,
   the candidates and the best tokens, walked exactly with their `need`, are allowed.
4. every other logit becomes `-inf`; a row left with nothing ends with `"constraint"`.

**Forks** (`parallel`): a grammar in which a byte can be read in several ways (`build_pushdown(
forks=True)`, what `Grammar` does by default) keeps the tables above for every token that cannot
reach such a byte, and runs with `num_stacks` configurations per row
(`ParallelPushdownConstraint`), which walks over all its stacks only the tokens that may
reach a fork from the positions a row is at (`fork_reach`); a grammar without forks gets
exactly the tables and processor above.
"""

from .automaton import BOTTOM as BOTTOM
from .automaton import DEAD as DEAD
from .automaton import DEFAULT_NUM_STACKS as DEFAULT_NUM_STACKS
from .automaton import DEFAULT_STACK_DEPTH as DEFAULT_STACK_DEPTH
from .automaton import FORK as FORK
from .automaton import MAX_LEVELS as MAX_LEVELS
from .automaton import POP as POP
from .automaton import UNREACHABLE as UNREACHABLE
from .automaton import NotDeterministic as NotDeterministic
from .automaton import PushdownAutomaton as PushdownAutomaton
from .automaton import TooManyCandidates as TooManyCandidates
from .building import build_pushdown as build_pushdown
from .constraint import PushdownConstraint as PushdownConstraint
from .constraint import state_stack as state_stack
from .parallel import ParallelPushdownConstraint as ParallelPushdownConstraint
from .parallel import state_configurations as state_configurations
