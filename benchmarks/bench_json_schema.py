"""JSON Schema coverage and correctness on real-world schemas (MaskBench / JSONSchemaBench).

For each schema of the development data (`../shared/data/maskbench-dev.jsonl.gz`, one JSON
object a line: `split`, `file`, `schema`, `tests`), in a worker process with a per-schema time
limit (a pathological schema is killed, counted as a timeout, and the worker restarted):

1. compile it the way `fg.processors.JsonSchema` does, without any cache (schema -> regex ->
   byte DFA -> token automaton for SmolLM2's vocabulary), timing the whole compilation;
2. for every test instance, serialise it twice, compact (`{"a":1,"b":[2,3]}`) and spaced
   (`json.dumps`' default `{"a": 1, "b": [2, 3]}`), tokenize it with the model's tokenizer
   (`tokenizer.encode(text, add_special_tokens=False)`: MaskBench's rule) and check that every
   token, then EOS, is in the mask the device computes at its step (`tests/structured/
   maskbench.py`, for token and pushdown automata alike; before 2026-11-28 a pushdown
   automaton was checked on the text's bytes only). A valid instance must be accepted in both
   forms, an invalid one rejected in both;
3. with `--peers llguidance xgrammar`, the same schemas through those engines' own compilers
   in the same worker (llguidance: `LLMatcher` and its first mask; XGrammar 0.2.9:
   `compile_json_schema(any_whitespace=True, strict_mode=False)`, one thread, no cache; both
   compiled twice) and the compact documents' tokens through their matchers. `--cold` starts a
   fresh worker process for every schema, so "first" compile times are cold (no memo of
   earlier schemas, lazy imports included); "again" is the same schema compiled a second time
   in that process (`cache=False`: the token automaton is rebuilt, in-process memos warm).
   A fresh process still reads the per-tokenizer arrays (token trie, byte matrix) from the
   disk cache when an earlier run wrote them (`structured.vocabulary_tables`, under
   `$FUNCTIONAL_GEN_CACHE`): the output says which; `--no-vocabulary-cache` builds them in
   every process instead (the first schema ever compiled for a tokenizer).

Printed per split: schemas compiled, timeouts, compile p50/p90/p99 (ms, compiled schemas
only), valid instances accepted (compact / spaced) and invalid ones rejected, then the eight
slowest schemas, compiled or refused (a refusal's time counts toward "no schema over 10 s" too),
and the counted causes of compile errors. Every mismatch (a valid instance rejected, an invalid one accepted)
is listed with its file so that it can become a test; `--json PATH` writes every per-schema
record.

Anchors measured on this machine type on a 120-schema sample (24 each of Glaiveai2K,
Github_easy/medium/hard, Kubernetes; research/structured.md §5): llguidance compiled 103,
xgrammar 119, outlines-core 89; compile p50 llguidance 7 ms, xgrammar 17 ms, outlines-core
146 ms.

Recorded on 2026-11-22 (`--limit 24`, seed 0, timeout 30 s, the 2-core machine shared with three
other developers' jobs at a load average of about 10, so compile times are inflated and noisy):

| run | compiled | timeouts | compile p50 / p90 / p99 ms | valid accepted | invalid rejected |
|---|---|---|---|---|---|
| before issue 11 (unknown keywords refused, objects closed) | 54/120 (45%) | 0 | 44 / 595 / 6,153 | 70/77 | 132/132 |
| after (open objects, free-form depth 1) | 85/120 (71%) | 18 | 1,153 / 13,628 / 26,524 | 117/122 | 232/232 |
| after, `--closed-objects` | 86/120 (72%) | 16 | 176 / 3,054 / 13,801 | 102/124 | 235/235 |
| `--pushdown` (free-form values through the pushdown automaton, `dependentRequired`; 2026-11-22) | 78/120 (65%) | 25 | 2,713 / 13,145 / 28,437 | 110/110 | 194/194 |
| before the regex-size limit (load average 3-5) | 80/120 (67%) | 19 | 482 / 7,891 / 28,866 | 111/115 | 213/213 |
| regex-size limit, one-pass markers, `dependencies`, empty enums, anchors in groups (load 2-2.5) | 91/120 (76%) | 3 | 470 / 7,654 / 16,055 | 123/127 | 235/235 |
| same code, 22:12 UTC, as the baseline of the grammar form (load 1-3) | 89/120 (74%) | 5 | 222 / 5,508 / 19,565 | 120/124 | 234/234 |
| grammar form for regexes over 250,000 characters (`json_schema_compile`, 23:02 UTC, load 2-3) | 92/120 (77%) | 5 | 323 / 6,220 / 23,800 | 125/129 | 240/240 |
| main at cb403d5, then the compile speed-ups right after it (load 3-4.7; 2026-11-22) | 91/120 (76%) | 3 | 153 / 4,164 / 12,335 | 123/127 | 235/235 |
| compile speed-ups: `\\x01` prefix for outlines-core, one scipy `trim`, one-gather Moore rounds | 93/120 (78%) | 1 | 77 / 968 / 7,904 | 125/129 | 240/240 |
| faster pushdown token tables, `MAX_GRAMMAR_POSITIONS` 3,000 (00:07 UTC 2026-11-23; 10 still over the limit) | 97/120 (81%) | 1 | 102 / 1,543 / 19,364 | 132/137 | 257/257 |
| all of this session's branches merged (329f68e, other jobs paused, 00:12 UTC 2026-11-23) | 97/120 (81%) | 1 | 86 / 1,302 / 13,943 | 132/137 | 257/257 |
| same tree re-run at the start of the next session (01:20 UTC 2026-11-23, quiet) | 97/120 (81%) | 1 | 64 / 1,157 / 13,474 | 132/137 | 257/257 |
| shared trie walks (tables 3-11x faster, limit 10,000 positions), linear object regexes, shared tails and shared subschemas (from 150 characters) as rules, pattern/format + lengths, decimal bounds (61e473e, 02:40 UTC, quiet) | **110/120 (92%)** | 1 | **88** / 2,252 / 6,031 | 142/151 | 278/278 |
| same, `--free-form-depth 2` | 110/120 (92%) | 1 | 146 / 2,956 / 6,257 | 145/151 | 278/278 |
| same, `--pushdown` (`free_form_depth=None`) | 109/120 (91%) | 1 | 434 / 2,530 / 6,316 | 147/151 | 278/278 |
| then the grammar form nests free-form values freely (468ad38, 03:12 UTC, quiet) | **110/120 (92%)** | 1 | **92** / 2,546 / 6,996 | 143/151 | 278/278 |
| faster pushdown tables (branch pdafast, 04:26 UTC, load 1-2) | 110/120 (92%) | 1 | 98 / 2,319 / 6,320 | 143/151 | 278/278 |
| same, `--pushdown` (right after; `cache=False` now really rebuilds) | 109/120 (91%) | 1 | 415 / 2,157 / 5,944 | 147/151 | 278/278 |
| pdafast at 6761cdf, 04:55 UTC, load 3-4.2 | 110/120 (92%) | 1 | 226 / 2,731 / 7,669 | 143/151 | 278/278 |
| same, `--pushdown` (right after) | 109/120 (91%) | 1 | 412 / 2,802 / 8,000 | 147/151 | 278/278 |
| counted plain strings, annotations fixed, exact oneOf/`not`, format x pattern, recursive rules, faster pushdown tables (main after the recrules merge, 05:33 UTC 2026-11-23, quiet) | **114/120 (95%)** | **0** | **95** / 1,875 / 5,568 | 145/157 | 286/286 |
| same tree, next session's start (07:10 UTC, nothing else running) | 114/120 (95%) | 0 | 94 / 1,867 / 5,632 | 145/157 | 286/286 |
| same, `--free-form-depth 2` (two helpers running: times inflated) | 114/120 | 0 | 154 / 2,036 / 8,922 | 147/157 | 286/286 |
| same, `--free-form-depth 3` (same load) | 114/120 | 0 | 351 / 2,025 / 5,078 | 149/157 | 286/286 |
| same, `--pushdown` (before the faster pushdown tables) | 112/120 | 1 | 285 / 1,893 / 5,885 | 147/155 | 284/284 |
| same, `--property-order any` (loaded) | 114/120 | 0 | 201 / 3,701 / 7,423 | 146/157 | 286/286 |
| `--property-order schema_or_required_first` (8,000-character budget; loaded; o82710 timed out, which the default accepts) | 113/120 | 1 | 172 / 3,221 / 8,984 | 146/155 | 284/284 |
| pushdown tables as one function of all origins per trie node (pdaspeed), `--pushdown`, quiet (08:50 UTC) | 112/120 | 1 | 142 / 1,059 / 4,589 | 147/155 | 284/284 |
| the token walk remembers each (function, byte class) step, distances over edges, `free_form_depth=None` the default with a depth-1 fallback for oversized grammar forms (2274d21, 2026-11-23 11:45 UTC, quiet) | **114/120 (95%)** | **0** | **77** / 1,013 / 4,858 | 149/157 (the 8 left: property order only) | 286/286 |
| same tree, `--all --sample 400` (loaded: times inflated) | 363/400 (91%) | 1 | 140 / 1,858 / 9,124 | 448/465 (14 property order, 2 yamllint also order once `$ref` siblings merge, 1 `patternProperties` gap: o48094) | 666/666 |
| keys no `patternProperties` pattern matches are additional properties, `allOf` object members merged exactly, minimisation re-examines only what changed, grammar forms refused at twice the position limit (a32ec28, 2026-11-23 15:47 UTC, quiet; with c297c9c's nested `allOf` order at 16:15: 75 / 831 / 3,612, same counts) | **114/120 (95%)** | **0** | **82** / 925 / 4,222 | 149/157 (the 8 left: property order only) | 286/286 |
| same session, `--all --sample 300 --seed 7`, before those fixes (load 1) | 265/300 (88%) | 1 | 60 / 1,212 / 7,218 | 312/326 (11 order, o61003 order through `oneOf` of draft-04 `$ref`s that the reorder check misses, o77739 nested `$ref` order) | **525/526** (o61085: `allOf` of closed objects) |
| same sample after them (load 1) | 266/300 (89%; o9517 no longer crashes in `_extract_tail`) | 1 (detekt-1.22.0: 34 s to a size refusal, 14.5 s after a32ec28) | 58 / 809 / 4,849 | 313/327 | 529/529 |
| next session's box (2026-11-23 17:20 UTC, quiet; this box compiles about 1.5x slower than the last one), main at 53bf542 | 114/120 (95%) | 0 | 126-143 / 1,212-1,289 / 4,601-5,239 (two runs) | 149/157 | 286/286 |
| outlines-core's `Index` walks one byte per class (`byte_classes`), one minimisation in `_call_edges` (6d38f3f) | 114/120 | 0 | 100 / 963 / 4,029 | 149/157 | 286/286 |
| pushdown token tables: batched `lookup` writes, presence-table numbering, bitmasks by byte gathers (b5a21c5; then 25160d5, 18:08 UTC) | 114/120 (95%) | 0 | **94** / 928 / 3,586 | 149/157 (the 8: property order) | 286/286 |
| same session, `--all --sample 300 --seed 7`, at 46f34fa / at 25160d5 (grammar forms refused at 1.25x the position limit) | 266/300 / 266/300 | 0 / 0 | 72 / 820 / 4,952 and 64 / 851 / 4,597 | 314/327 (13: property order; +1 from object constants written by us, d538a03) | 529/529 |
| same box, `--property-order schema_or_required_first`, at b5a21c5 | 114/120 | 0 | 124 / 1,065 / 3,857 (Github_medium p99 14,313: o82710) | 152/157 | 286/286 |
| next session (2026-11-23 21:43 UTC, quiet), main at 98a20a8, run back to back with the next two rows | 114/120 (95%) | 0 | 103 / 1,074 / 4,178 (schemas' compile times summed: 48.6 s) | 149/157 | 286/286 |
| open-object keys of plain names with shared tails, numeric constants equal by value (3488de8) | 114/120 | 0 | 86 / 729 / 3,277 (40.6 s; kb_765, o6084 2x slower: now single regexes under 250,000 characters) | 149/157 | 286/286 |
| grammar form first above 100,000 characters, single regex the fallback to 250,000 (3d45ef2; two runs) | 114/120 (95%) | 0 | **75** / 581 / 2,740 and 74 / 600 / 2,352 (32.7 s; per-schema geometric mean ratio 0.70 of 98a20a8) | 149/157 (the 8: property order) | 286/286 |
| same two trees, `--all --sample 300 --seed 7` | 266/300 / 266/300 | 0 / 0 | 70 / 906 / 4,923 (102 s) and **52** / 426 / 4,117 (70.9 s) | 314/327 / 314/327 (13: property order) | 529/529 |
| next session (2026-11-23 23:10 UTC, quiet), main at 5bc372a | 114/120 (95%) | 0 | 75 / 610 / 2,945 | 149/157 | 286/286 |
| same tree, `--property-order any` / `schema_or_required_first`, back to back | 114/120 / 114/120 | 0 / 0 | 146 / 1,561 / 2,940 and 89 / 859 / 3,142 | 150/157 and 152/157 | 286/286 |
| same tree, `--all --sample 1000 --seed 13` | 914/1000 (91%; 2 crashes: o12454 `RecursionError`, JsonSchemaStore config.json `TypeError`) | 0 | 61 / 424 / 3,313 (Github_hard p99 17,649: o61653 27.6 s; 3 schemas over 10 s) | 1166/1190 (20 property order, one of them inside `anyOf` branches: Snowplow sp_163; 3 `format: byte` values that are not base64, 1 free-form value nested deeper than a refused pushdown's depth-1 fallback: o10495) | **1853/1854** (bounded-context.json: `uri-reference` `"://"`) |
| RFC 3986 `uri`/`uri-reference`, `anyOf` beside `oneOf` distributed, draft-4 subschemas with boolean schemas, counted plain strings as shared weighed markers (00:25 UTC 2026-11-24), same sample | **915/1000 (92%)**, no crash | 0 | 59 / 413 / 3,055 (Github_hard p99 4,164; o61653 5.3 s; still over 10 s: o82849 15.4 s, sp_408 12.0 s, sp_12 10.5 s, all long-counter strings) | 1166/1190 | **1854/1854** |
| same code, five splits `--limit 24`, alternating with 5bc372a (base, new, base, new) | 114/120 (95%) | 0 | 81 / 675 / 3,197, 82 / 617 / 2,818, 66 / 616 / 2,932, 89 / 707 / 3,051 (the schemas the runs put slowest timed again in one process, 5 calls each: equal within noise) | 149/157 | 286/286 |
| `lift` with a dense class table and linear searches, int32 CSRs, a worklist for the pushdown distances (8a0709d + next, 2026-11-24 02:15 UTC, quiet), `--all --sample 1000 --seed 13` | 915/1000 (92%) | 0 | 57 / 388 / 2,647 (compile times summed: 228 -> 177 s; **none over 10 s**: o82849 15.4 -> 7.2 s, sp_408 12.0 -> 5.3 s, sp_12 10.5 -> 4.2 s, o9796 8.7 -> 3.3 s; the 80 schemas over 0.5 s: geometric mean ratio 0.81) | 1166/1190 | 1854/1854 |
| same tree, five splits `--limit 24` | 114/120 (95%) | 0 | 70 / 556 / 1,556 | 149/157 | 286/286 |
| more `oneOf` branches proven disjoint, `multipleOf` beside decimal bounds, `not` of listed strings, a single `if` on an unlisted string, `items` in both `allOf` sides, nested `enum`s exact, conditionals ignored before draft 7 (7a6fe23, 03:12 UTC), same sample | **922/1000 (92%)** | 0 | 56 / 378 / 2,481 (summed 168 s) | 1177/1204 (21 property order, 3 `format: byte`, o10495, o39097 before the draft-04 fix) | **1876/1876** |
| llguidance 1.9.1 on the same 1,000 (`LLMatcher.validate_grammar` of `grammar_from_json_schema`, no tokenizer, default options) | 848/1000 (85%); on the 712 of the five splits 644 against our 676 | | | | |
| **the whole file**, `--all --limit 0` (3c72bd1, 2026-11-24 04:18-05:05 UTC, 2,826 s) | 8,778/9,681 (91%); five splits 6,353/6,795 (93.5%): Github_easy 97%, Github_hard 86%, Github_medium 90%, Glaiveai2K 98%, Kubernetes 94% | 13 (then one crash, o28532) | 55 / 414 / 2,804 (12 more over 10 s) | 10,735/11,009 (230 of the 274 rejections: property order) | **17,585/17,585** |
| dialect-aware keywords, `multipleOf` of any step with a compact regex, counted item copies measured and called (13e13e4), `--all --sample 1000 --seed 13` | 923/1000 (92%) | 0 | 71 / 463 / 2,787 (a slower hour: five splits interleaved with 3c72bd1, per-schema ratio 0.95-1.00) | 1180/1206 | 1884/1884 |
| same tree, the 13 timeouts and 12 slowest of the whole file | timeouts 13 -> 6 (o47657, o15291, o48423, o48425, o47656, o48427: outlines-core's DFA of an unanchored pattern or of optional properties); o12622 23.6 -> 1.9 s, o9943 -> 1.2 s, o9842 -> 2.2 s, sp_202 -> 6.5 s, o56012 18.2 -> 1.8 s; 6 refused quickly (grammar positions); still over 10 s: o25423 18.8, ServerResult 14.3, o21108 12.8, o21112 12.5, bamboo-spec 12.4, o9953 12.3, o9888 11.1 s | | | | |
| unanchored alternatives share one `.*`, recursion through an `anyOf` of objects as a rule of the `anyOf`, free-value conflicts refused per rule, 2x the positions limit in place of a single regex, row-hash token walk (35e76d2, 2026-11-24 08:15-08:55 UTC, 2,364 s), **the whole file** | **8,810/9,681 (91%)**; five splits 6,376/6,795 (93.8%); +37 schemas, -5 (o7515, slack-app-manifest, sp_408/409/410: grammar positions) | **1** (o39210) | 59 / 410 / 2,483; over 10 s: o69208 19.2, o21108 13.1, o21112 12.3, o9953 11.8, o21378 11.1, o48425 10.3 | 10,770/11,044 (241 property order with da27c58's order check; the others: `format: byte`, free-form values beyond the depth-1 fallback, o24621 fixed in e0c9883) | **17,674/17,674** |
| same session, five splits `--limit 24` (4e5b954) | 114/120 (95%) | 0 | 84 / 630 / 1,787 | 149/157 (the 8: property order) | 286/286 |
| Moore's refinement started from longest accepted words, single-regex fallback for counted copies, whole-type `anyOf` absorption, "at least one required" as "first present", no re-promotion of banned alternatives, row hashes as a matrix product (00c7b18, 2026-11-24 14:24-15:03 UTC, 2,339 s, quiet), **the whole file** | **8,815/9,681 (91%)**; five splits 6,376/6,795 (93.8%); +5 (o7515, slack-app-manifest, sp_408/409/410) | 3 (o9925, o9853, o9958: single regexes of 2.3-4.5 million written-out characters; refused in 0.4-1.1 s since 17c9168, `SINGLE_REGEX_WEIGHT`) | 57 / 411 / 2,721; over 10 s: slack-app-manifest 12.9 (refused before); bamboo-spec 9.6, o48425 9.4, o21378 8.9 (o69208 19.2 -> 1.0, o21108 13.1 -> 3.3, o21112 12.3 -> 3.0, o9953 11.8 -> 2.8) | 10,779/11,050 (251 property order) | **17,683/17,683** |
| five splits `--limit 24` after 17c9168 (15:30 UTC, quiet) | 114/120 (95%) | 0 | 80 / 631 / 1,738 | 149/157 (the 8: property order) | 286/286 |
| sparse token maps in `lift`, rule automata memoised across attempts, grammar forms that a string automaton alone makes hopeless skipped (ec095fb, 2026-11-24 16:53-17:24 UTC, 1,870 s; the second core partly busy), **the whole file** | **8,816/9,681 (91%)**; five splits as before | 0 | 57 / 391 / 1,939; slowest compiled: o48425 9.3 s (7.4 after e3f2dfe), o24467 7.7, bamboo-spec 7.3, o21378 7.3; slack-app-manifest 12.9 -> under 7 s; slowest refusals (now printed): o48866 12.2 s (10.2 after 9ea3831), o74461 10.3, kb_1161 9.5, o7573 8.9 | 10,781/11,052 (property order) | **17,687/17,687** |
| `key_not_in` and `check_schema` memoised, spliced automata estimated too large refused before their DFA (b89aafb, 2026-11-24 19:43-20:12 UTC, 1,714 s wall, compile times summed 1,667 s; quiet but for a light job on the other core), **the whole file** | **8,816/9,681 (91%)**; five splits as before | 0 | **55** / 382 / 1,769; slowest: refusals o48866 9.0 s, o7573 8.2; compiled o48425 7.9, o1052 7.7, bamboo-spec 7.5; **none over 10 s** (kb_1161 9.5 -> 3.2 s, o74461 10.3 -> 0.15 s); 11 schemas over 5 s | 10,781/11,052 (251 property order) | **17,687/17,687** |
| pushdown walk's successor table per byte class (int32), a plan's rule automata built ahead on threads, one per core (49c5ca4, 2026-11-24 22:16-22:43 UTC, 1,621 s wall, compile times summed 1,574 s; quiet), **the whole file** | **8,816/9,681 (91%)** | 0 | **54** / 377 / 1,608; slowest: refusal o48866 8.0 s, compiled bamboo-spec 6.8, o48425 6.4, refusal o7573 6.3, o1052 6.3, o24467 6.2; **none over 10 s**; 7 schemas over 5 s (11 before), 26 over 3 s (36) | 10,781/11,052 (251 property order) | **17,687/17,687** |
| then a later `allOf` part's properties after an earlier part's `anyOf`/`oneOf` branch members, as llguidance orders them (f7f1155, 23:40-00:08 UTC, 1,676 s wall, compile times summed 1,627 s; noisier), **the whole file** | 8,816/9,681 (91%) | 0 | 56 / 383 / 1,673; slowest: refusal o48866 8.0 s, refusal o7573 6.7, o1052 6.5, o48425 6.5, bamboo-spec 6.3; none over 10 s; 9 over 5 s | **10,785/11,052** (251 property order; o64859 and o60846 now accepted) | 17,687/17,687 |
| a free-form value's call that competes with regular text is read in place there, level by level (`_inline_value_calls`; 55a3af4, 2026-11-25 01:35-02:01 UTC, 1,576 s wall, compile times summed 1,364 s against 1,445 s; quiet), **the whole file** | **8,817/9,681 (91%)** (o48866 compiled, refused before) | 0 | **54** / 371 / 1,567; slowest: o48425 6.4 s, o1052 6.0, o48866 6.0, o7573 6.0 (refused), o21378 5.7, jsonld 5.1; none over 10 s; compiled over 3 s: 12 (22 before; bamboo-spec 6.3 -> under 2, o24467 6.2 -> under 1) | **10,789/11,052** (249 property order by the bench's check; o24467 x2, MCPspec ClientResult and ServerResult now accepted) | 17,687/17,687 |
| `_INLINED_CALLS` attempts dropped, the pushdown token walk in chunks of 1,024 origins with classes found per pass, in-place rules memoised (525689e, 2026-11-25 04:42-05:09 UTC, 1,591 s wall, compile times summed 1,377 s against 1,364 s; quiet), **the whole file** | 8,817/9,681 (91%), the same schemas | 0 | 55 / 383 / 1,546; slowest: o1052 6.3 s (token automaton, unchanged), jsonld 5.0, kong_json_schema 4.9 (refused), slack-app-manifest 4.9, o7573 4.6 (refused); o48425 6.4 -> 2.6 s, o48866 6.0 -> 4.5, o21378 5.7 -> 4.0, o7573 6.0 -> 4.6; compiled over 3 s: 9 (12 before) | 10,789/11,052 (every instance the same verdict) | 17,687/17,687 |
| members beside `allOf`/`anyOf`/`oneOf`/`$ref` in the order of the keywords in the text, as llguidance 1.9 reads them (b444be3, 2026-11-25 16:41-17:08 UTC, 1,606 s wall, compile times summed 1,407 s against 1,400 s for 83263b6 at 15:37 the same day; quiet but for short checks), **the whole file** | 8,817/9,681 (91%), the same schemas | 0 | 56 / 394 / 1,609 (83263b6: 55 / 394 / 1,516); slowest: o1052 6.0 s, slack-app-manifest 5.5, jsonld 5.0, o48866 4.9 | **10,808/11,052** (+19: o60038, o66237, o90957, o69744, o85188, o90951 x2 each, coffeelint, ide.host, webjob-publish-settings x2, ...; no instance lost). Of the 244 left, llguidance 1.9.1 compiles the schema and accepts the document for 3 (the depth-1 fallbacks o9795 x2, sp_193); it refuses the schema for 232 (documents not normalised to its order) | 17,687/17,687 |
| the no-pushdown fallback nests free-form values 2 levels where a single regex's token automaton holds them, else 1 (1757afb; 3bc8a3e, 2026-11-25 17:51-18:19 UTC, 1,659 s wall, compile times summed 1,442 s; quiet), **the whole file** | **8,821/9,681 (91%)** (+4: o55162, o9792, o9793, o9887, refused on grammar positions before); five splits 6,381/6,795 (93.9%) | 0 | 56 / 407 / 1,641; slowest: o1052 5.7 s, jsonld 5.7, kong_json_schema 5.2 (refused), slack-app-manifest 4.9; fallbacks: 63 at depth 2, 2 at depth 1 (o6020, jsonld) | **10,817/11,058** (o9795 x2, sp_193 now accepted; the 6 of the new schemas accepted). Of the 241 left, llguidance 1.9.1 refuses the schema for 232 (8 of them `format: byte` with non-base64 text, which we enforce) and rejects the document too for the other 9: no document that llguidance accepts is rejected | **17,709/17,709** |

2026-11-28 (branch masks: members in any order by default, `format: byte` an annotation, the
tokens checked through the device masks, `--peers`, `--cold`), `--limit 1 --seed 3 --peers
llguidance xgrammar --cold --timeout 90`, on a box at load average 13 (other helpers' test
runs; every time is inflated 10-100x, read none of them as a measurement):

| engine | compiled | valid accepted | invalid rejected | compile p50 / p99 ms (cold) | again p50 / p99 ms |
|---|---|---|---|---|---|
| functional_gen | 5/5 | 7/7 | 15/15 | 7,733 / 16,326 | 1,757 / 7,032 |
| llguidance 1.9.1 | 5/5 | 7/7 | 15/15 | 41 / 50 | 16 / 38 |
| xgrammar 0.2.9 | 5/5 | 7/7 | 14/15 | 7,771 / 12,749 | 7,508 / 11,025 |

2026-12-02 (session 38; the 2-core box shared with one single-core test process, so times are
inflated by up to ~1.5x; counts do not depend on load). Five splits, `--limit 24 --peers
llguidance xgrammar`, warm workers, 00:28-00:45 UTC (3 of our 5 "timeouts" were refusals that
take 3-6 s alone: this run shared the box with profiling jobs):

| engine | compiled | valid accepted | invalid rejected | compile p50 / p99 ms (first) | again p50 ms |
|---|---|---|---|---|---|
| functional_gen (1b8f479) | 111/120 | 149/151 (o61004 x2: property order) | 279/279 | 565 / 5,478 | 424 |
| llguidance 1.9.1 | 100/120 | 140/141 | 275/275 | 2.6 / 19.5 | 2.3 |
| xgrammar 0.2.9 | 115/120 | 145/155 | 284/290 | 830 / 10,913 | 818 |

After the grammar-form attempt for objects whose members one regex kept in order
(`compiling._any_order_grammar`, 1301a69): o61004 valid 2/2, compile 11.7 -> 2.4 s.
`--all --sample 300 --seed 7` at d94a870 (01:30-01:45 UTC): 268/300, p50 / p99 341 / 6,807 ms,
valid 321/329, invalid 533/533. The 8 valid rejected keep an order: o54575 (7 required
members, over `ANY_ORDER_MAX`), o33696 (14 members), o78043 (26 members and an open object's
additional-key regex of 4,786 characters, copied at every member set), o54613, dart-test; and
o10020's spaced form (exact `oneOf` over objects reads compact text only; MaskBench serialises
compact, which passes). Cold, `--limit 6 --seed 1 --peers llguidance xgrammar --cold` at d94a870
(01:55-02:09 UTC):

| engine | compiled | valid accepted | invalid rejected | cold p50 / p99 ms | again p50 ms |
|---|---|---|---|---|---|
| functional_gen | 27/30 | 36/36 | 62/62 | 944 / 8,824 | 359 |
| llguidance 1.9.1 | 26/30 | 35/35 | 60/60 | 5.8 / 12.9 | 2.1 |
| xgrammar 0.2.9 | 28/30 | 36/36 | 53/62 (9 invalid accepted) | 850 / 14,640 | 838 |

Cold p50: 163x llguidance's (target 3x), 1.11x XGrammar's. Both engines that build masks before
generation (ours for the device tables, XGrammar for its adaptive token cache) pay ~1 s; llguidance
computes each step's mask lazily on the host, which the device loop cannot (no host work per
token, DESIGN constraint 6).

2026-12-02 (session 39): objects still read in one order are, in the grammar-form attempt, rules
whose automata are built from their members (`order_automata`, 65ed666 + 00d6443), and exact
`oneOf` over objects reads spaced text (`spaced_json_dfa`, 7ee783b). `--all --sample 300 --seed 7`,
the same 300 schemas, before (2ff85e7, 06:43 UTC, the box shared with a test process) and after
(00d6443, 07:12 UTC, quieter: schemas whose automaton did not change took 0.55x their earlier
time, so compare counts, and times only within a run):

| run | compiled | timeouts | p50 / p90 / p99 ms | valid compact | valid spaced | invalid rejected |
|---|---|---|---|---|---|---|
| before (2ff85e7) | 267/300 | 1 (eslintrc) | 298 / 1,549 / 5,646 | 319/327 | 316/327 | 529/529 |
| after (00d6443) | 268/300 | 0 | 179 / 1,187 / 3,255 | 323/329 | 323/329 | 533/533 |

Fixed: o54575 (six required members and an optional one: 2/2 valid, both spacings), dart-test
(2/2 spaced), o10020 (spaced). 27 schemas got a different automaton (an object now read in any
order); their compile time, median 1.37x raw, about 2.5x once the load difference is taken out
(o9517 1.1 -> 2.0 s, o54575 0.03 -> 0.8 s, o4177 1.1 -> 1.7 s). Still one order, so their valid
documents in another are refused: o78043 (15 required members: 32,768 sets), o33696 (9 required of
14 in an open object: about 170,000 states), o54613 (7 required and two strings of maxLength
1,000 whose counters alone take 24,000 positions).

Cold compiles after the small-graph searches without scipy and the per-tokenizer disk cache
(branch coldcompile, 2026-11-28 23:32-23:48 UTC, same five schemas and flags, the box at load
average 5-7: read the ratios, not the milliseconds), each run against llguidance in the same
workers:

| run | ours cold p50 / p99 ms | again p50 ms | llguidance cold p50 ms | cold p50 ratio |
|---|---|---|---|---|
| main (1dcd76f) | 4,311 / 6,243 | 1,596 | 17.3 | 249x |
| coldcompile, tokenizer arrays read from disk | 1,133 / 1,544 | 685 | 7.3 | 155x |
| coldcompile, `--no-vocabulary-cache` (first schema ever) | 1,384 / 2,521 | 794 | 11.3 | 122x |
| main again, right after | 1,660 / 2,953 | 966 | 8.5 | 195x |
| coldcompile again, right after | 1,451 / 2,028 | 791 | 11.0 | 132x |

Per schema in the last pair, cold minus again (the part a fresh process adds): 713 / 1,206 /
1,930 / 273 / 736 ms on main, 78 / 498 / 128 / 660 / 69 ms after (the `again` compile still
has the regex DFAs memoised); cold times per schema: geometric mean ratio 0.65 of main. What is
left is the schema's own work (regex DFAs through outlines-core, the pushdown token tables):
the 3x-of-llguidance target needs lazily built tables, not caches.

The same five with `--property-order schema`, run beside it (not cold, no peers): 4/5 (o28953
timed out at 90 s), valid 5/5, invalid 7/7, p50 8,987 ms.

The same tree on 400 schemas drawn from the whole file (`--all --sample 400`, seed 0, quiet,
05:35 UTC): **361/400 (90%)**, 1 timeout, p50 / p90 / p99 56 / 1,003 / 5,168 ms, valid 440/462,
invalid 659/659 (at the start of that session, ca08732: 346/400, 86%). Every valid instance
rejected there that was looked at lists a large object's properties in another order than the
schema (`property_order="any"` covers small objects only) or nests a free-form value deeper than
`free_form_depth=1`. The refusals left: overlapping `oneOf` (8: `{}` or two listed names match
both branches), plain strings over the counter limit (6: maxLength 8,192 to 262,144; a counter
register on the device would be needed), `patternProperties` matching a listed name (3), `if`
(4), `not` of other shapes (4), `contains`, `uniqueItems`, `$ref` expansions over the node limit
where recursion goes through `anyOf` of objects (2).

Median per-schema ratio `--pushdown` / default over the 109 schemas both compiled: 2.85 in the
04:26 pair, 3.01 in a pair at 04:43 (load 2-4: p50 119 / 502 ms), 1.73 in the 04:55 pair (the
default's run caught the heavier load): `free_form_depth=None` is still 2-3x the compile time
of depth 1, so depth 1 stays the default (`json_schema.DEFAULT_FREE_FORM_DEPTH`).

In the last four runs every valid instance rejected beyond the free-form depth is one whose
properties come in another order than the schema's `properties` (o6084, o69474: 2 each): the
documented departure from JSON Schema (llguidance's too). The timeout is o82710: a string with
`maxLength: 5000` among 15 optional properties of an open object (a 12,043-character regex whose
DFA has 105,420 states, 5.8 s in outlines-core alone, then the token tables); a counter that
large would be a grammar-form rule of its own, not planned yet (`_plan_rules` sizes markers by
regex characters, and a plain length-bounded string is not a marker).

Every split of the file, 6 schemas each (`--all --limit 6`, 126 schemas, same tree, 02:40 UTC):
98/126 (78%), 2 timeouts (o82710 above; Snowplow sp_12), p50 / p90 / p99 39 / 601 / 6,787 ms,
valid 107/112, invalid 121/121. The BFCL, JME splits compile 6/6; Handwritten and Synthesized
0/6 each: `not` (7 schemas, mostly Synthesized's `{"not": ...}` wrappers of the JSON Schema test
suite), `if`, `contains`, `dependentSchemas`, and `oneOf` combined with another `oneOf`.
After `uri-template` and listed values judged by `jsonschema` (`_listed_values`; 43c27bc, 03:46
UTC, quiet): 106/126 (84%), 1 timeout, p50 / p90 / p99 25 / 480 / 14,529 ms, valid 112/117,
invalid 138/138; Synthesized 6/6, MCPspec 6/6, Handwritten still 0/6.

On the 91 schemas both of the last two runs compiled: p50 / p90 / p99 153 / 4,164 / 12,335 ms
before, 75 / 948 / 5,813 after (median per-schema ratio 0.62); every automaton is the same up to
state and class renaming (`tests/structured/test_byte_dfa.py` compares the minimal DFAs with and
without the prefix; an in-process A/B against main compared the token tables of the 72 schemas
under 1.5 s, canonically renumbered: all equal; `benchmarks/compare_compile.py /work/main --records
MAIN.json --max-ms 30000`, interleaved in one process on all 91 schemas main compiled, load 3-4:
p50 / p90 / p99 193 / 5,950 / 11,868 ms main, 103 / 902 / 6,139 ms after, median per-schema ratio
0.70, 0 of 91 automata different beyond renaming). Most of
the gain is outlines-core's regex -> DFA step: it also determinised the unanchored search that
its `Index` never uses, up to 100 times the anchored DFA (see `byte_dfa.regex_byte_dfa`).
Where the time goes after (cProfile over the 68 schemas under 1 s, 8.4 s in all): outlines-core's
`Index` build 2.7 s (own time of `regex_byte_dfa`), reading its dictionaries into arrays 0.8 s
(`get_transitions`, `numpy.fromiter`), the trie walk of `byte_dfa._token_functions` 1.2 s, the one
real `trim` 1.0 s, `automaton.unique_columns` 0.7 s, Moore's refinement 0.5 s. Before (same
schemas, main): 17.0 s, of which the `Index` build 7.5 s, `trim` (three per schema) 2.9 s,
`_token_functions` 1.4 s, `_refine` 1.3 s.

The regex-size-limit run's 29 refusals: 16 regexes over `MAX_REGEX` (a million characters; refused in
well under a second instead of timing out: these need the schema -> grammar compilation), 4
overlapping `oneOf`, 3 timeouts (o82710: a pattern whose DFA has 219,515 states; o81133 and
o32921: 0.4-0.8 million-character regexes), 3 `pattern` + length bounds, and one each of `not`,
`format` + `maxLength`, a non-integer `minimum`. Its 4 valid instances rejected nest a
free-form value deeper than `free_form_depth=1` (o13687 is accepted at depth 3).

The grammar form (`json_schema_grammar`: large or shared subschemas become pushdown rules)
compiled two of the 16 former "regex too large" refusals and timeouts within 30 s (Github_hard
o32921: 21 s, 1,081 positions; o41296: 24 s, 1,947 positions), every test instance right. Of
the others, 11 are refused at once because their rules' automata have over
`MAX_GRAMMAR_POSITIONS` (then 2,000) states in all (2,050 to 16,200): the pushdown token
tables walked the vocabulary from every position at 20-80 ms each (o21316, 8,218 positions:
664 s of a 688 s compile in `_token_tables`, 10 s in the rules' DFAs; since the walk shares
work, 1-3.5 ms per position, o21316's tables 13-18 s, and the limit is 3,000); 2 have one object rule whose
regex (370,000 characters, about 80 properties) outlines-core cannot turn into an NFA; 3
(kb_737, kb_209, kb_765) time out. Faster token tables are what the rest needs.
On the 21 schemas alone, back to back (`--files` the 16 too-large and 5 timed-out ones, then
the same with `--single-regex`): 3 compiled against 2 (o32921 16 s, new; o41296 20 s as a
grammar against 13 s as its single regex of 0.25 to 1 million characters; kb_522 21 s / 20 s).

(the closed run rejects valid instances that carry properties beyond `properties`, as intended;
its compile times show that the open objects' free-form values cost most of the time.)

The `--pushdown` run accepts every valid instance (free-form values nest as deep as the stack)
but compiles fewer schemas in time: building the pushdown token tables walks the vocabulary
trie from every position of the schema's DFA with a Python step per (configuration, byte) pair,
about 10x slower per position than `byte_dfa.lift`; hence `free_form_depth=None` is opt-in.

Of the 35 refusals after: 18 timeouts (mostly Github_hard and Kubernetes), 4 overlapping
`oneOf`, 3 `dependencies`, 2 `pattern` + length that cannot be intersected, 2 anchors inside a
pattern, and single others. The 5 valid instances rejected: 4 nest a free-form value deeper
than `free_form_depth`, 1 was a bug (fixed since: untyped `properties` made the value an
object). Where the time goes: outlines-core's regex -> byte DFA step on the whole regex (each
open object repeats a free-form value; the sentinel-terminated regex is determinised without
regex-automata's early match cut-off, 2 s for a depth-2 free-form value against 0.05 s for
depth 1).

2026-12-03 (session 44): main at b550547 (objects read in any order by the member-set register,
`json_schema.register_objects`, where no automaton of the member sets fits), `--all --sample 300
--seed 7 --timeout 60 --peers llguidance xgrammar`, the same 300 schemas as session 39's table
above, the box shared with two developers' tests (load 2-5: read times as orders). "every instance
right" (a column added then): compiled, and every test instance of the schema accepted or
rejected as it should be, compact form; a compiler that ignores what it cannot enforce compiles
more schemas and gets some of their instances wrong:

| engine | compiled | every instance right | valid accepted | invalid rejected | compile p50 / p99 ms (first) | again p50 / p99 ms |
|---|---|---|---|---|---|---|
| functional_gen | 267/300 | 266/300 | 323/325 | 531/531 | 270 / 10,796 | 182 / 3,589 |
| llguidance 1.9.1 | 239/300 | 239/300 | 311/311 | 527/527 | 1.9 / 47.3 | 1.3 / 36.7 |
| xgrammar 0.2.9 | 295/300 | 269/300 | 332/358 | 580/607 | 281 / 13,612 | 292 / 14,642 |

The 2 valid instances rejected are o54613's (7 required members beside two strings of maxLength
1,000: compiled in the schema's order, free-form values nested 2 levels; its valid documents use
another order). Of our 33 refusals, XGrammar gets every test instance right in 21: 7 plain strings
over the counter limit (maxLength 8,192 / 32,767 / 65,535: a counter register on the device is
what they need; 121 schemas of the whole file have such bounds), 4 grammar forms over
`MAX_GRAMMAR_POSITIONS` (12,567-47,856 positions; raising the limit to 13,000 made o21378's form
grow to 18,079 positions instead: the forms tried before it are chosen under the limit), 3
overlapping `oneOf` (XGrammar reads `oneOf` as `anyOf`), 3 `if` combinations, 2 `patternProperties`
in `allOf`, 1 `uniqueItems` (never enforced by XGrammar; the test instances do not repeat items),
1 `$ref` expansion over the node limit. The other 12: 4 timeouts, 3 `uniqueItems`, 2 `oneOf`, 1
`maxLength`, 1 `propertyNames`, 1 too-large grammar form, where XGrammar is wrong on some instance
too.

Run: `python benchmarks/bench_json_schema.py --limit 24` (the five splits, 24 each), `--all`
for every split of the file, `--limit 0` for every schema of the chosen splits, `--all --sample
400` for 400 schemas drawn from the whole file (its TOTAL row estimates the whole file's coverage:
`--limit` weighs every split alike, the file does not). Timings come
from a shared 2-core machine: read them as orders of magnitude.
"""

import argparse
import collections
import contextlib
import gzip
import json
import multiprocessing
import os
import random
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen first
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

FIVE_SPLITS = ("Glaiveai2K", "Github_easy", "Github_medium", "Github_hard", "Kubernetes")
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"


# ----------------------------------------------------------------------------- worker side

_WORKER = {}


def _worker_setup(options: dict) -> None:
    from transformers import AutoTokenizer

    from functional_gen.loading.default_model import (
        converted_default_dir,
        ensure_default_checkpoint,
    )
    from functional_gen.structured import vocabulary_from_tokenizer

    ensure_default_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(str(converted_default_dir()))
    _WORKER["tokenizer"] = tokenizer
    _WORKER["vocabulary"] = vocabulary_from_tokenizer(tokenizer)
    _WORKER["options"] = options
    # Once per process, not per schema: `import jsonschema` takes seconds where the optional
    # `rfc3987-syntax` is installed (it builds lark grammars on import; jupyter pulls it in).
    from functional_gen.structured.json_schema import check_schema

    check_schema({"type": "string"})


def _compile(schema):
    """The automaton `JsonSchema` runs for `schema`, compiled without caches
    (`json_schema_compile`: the token automaton of the schema's regex, or the grammar form, a
    pushdown automaton, when that regex would be too large); with `--pushdown`, as
    `JsonSchema(free_form_depth=None)` does: free-form values through the pushdown automaton;
    with `--single-regex`, the token automaton only (the shape before the grammar form)."""
    from functional_gen.structured.json_schema import json_schema_automaton, json_schema_compile

    options = dict(_WORKER["options"])
    if options.pop("single_regex", False):
        return json_schema_automaton(schema, _WORKER["vocabulary"], cache=False, **options)
    if options.pop("pushdown", False):
        options["free_form_depth"] = None
    return json_schema_compile(schema, _WORKER["vocabulary"], cache=False, **options)


def _token_ids(text: str) -> list[int]:
    """The text's own tokenization (MaskBench's rule: the tokens the tokenizer makes)."""
    return _WORKER["tokenizer"].encode(text, add_special_tokens=False)


def _accepts(automaton, text: str) -> bool:
    """Whether every token of `text`'s own tokenization, then EOS, is in the mask the device
    computes at its step (`allowed`: the bitmask row and the tokens checked exactly, no token
    budget), for a `TokenAutomaton` or a `PushdownAutomaton` alike (`tests/structured/
    maskbench.py`)."""
    from tests.structured.maskbench import tokens_pass

    return tokens_pass(automaton, _token_ids(text), _WORKER["vocabulary"].eos_token_id[0])


def _peer_setup(peers) -> None:
    """The peers' tokenizers, once per worker (llguidance's from the same tokenizer; XGrammar's
    `TokenizerInfo`, its compiler with one thread and no cache)."""
    tokenizer = _WORKER["tokenizer"]
    if "llguidance" in peers:
        import llguidance.hf

        _WORKER["llguidance"] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    if "xgrammar" in peers:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        _WORKER["xgrammar"] = (info, xgrammar)


def _peer_compile(peer: str, schema):
    """A matcher factory for `schema` by `peer`'s own compiler (llguidance: the grammar
    checked and a matcher made, its first mask computed; XGrammar: `compile_json_schema`
    with any whitespace and JSON Schema's open objects, `strict_mode=False`)."""
    text = json.dumps(schema)
    if peer == "llguidance":
        import llguidance
        import llguidance.numpy

        grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
        matcher = llguidance.LLMatcher(_WORKER["llguidance"], grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        bitmask = llguidance.numpy.allocate_token_bitmask(1, _WORKER["llguidance"].vocab_size)
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, 0)
        return lambda: llguidance.LLMatcher(_WORKER["llguidance"], grammar)
    info, xgrammar = _WORKER["xgrammar"]
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compiled = compiler.compile_json_schema(text, any_whitespace=True, strict_mode=False)
    return lambda: xgrammar.GrammarMatcher(compiled)


def _peer_accepts(peer: str, make, text: str) -> bool:
    """Whether `peer`'s matcher takes every token of `text`'s tokenization, then EOS."""
    matcher, eos = make(), _WORKER["vocabulary"].eos_token_id[0]
    for t in [*_token_ids(text), eos]:
        ok = matcher.consume_token(t) if peer == "llguidance" else matcher.accept_token(t)
        if not ok:
            return False
    return matcher.is_stopped() if peer == "llguidance" else matcher.is_terminated()


def _run_peers(record: dict) -> dict:
    """Each peer's compile times (first and second) and verdicts on the test documents."""
    out = {}
    for peer in _WORKER.get("peers", ()):
        entry = {}
        try:
            start = time.perf_counter()
            make = _peer_compile(peer, record["schema"])
            entry["compile_ms"] = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            _peer_compile(peer, record["schema"])
            entry["warm_ms"] = (time.perf_counter() - start) * 1000
            entry["tests"] = [
                {
                    "valid": bool(t["valid"]),
                    "accepted": _peer_accepts(
                        peer, make, json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
                    ),
                }
                for t in record["tests"]
            ]
        except Exception as e:  # a refusal (or a crash) of the peer's compiler
            entry = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
        out[peer] = entry
    return out


_ORDER_BRANCHES = 8
"""`anyOf`/`oneOf` branches the order check prefers in turn (`_in_schema_order`'s `prefer`)."""


def _members_first(node: dict, applicator: str) -> bool:
    """Whether `node`'s own members come before those of its `applicator` (`$ref`, `allOf`,
    ...): its `properties` or `additionalProperties` come first in the text (the rule of
    `JsonSchema`, from llguidance 1.9)."""
    keys = list(node)
    members = [keys.index(k) for k in ("properties", "additionalProperties") if k in node]
    return bool(members) and min(members) < keys.index(applicator)


def _in_schema_order(data, schema, prefer: int | str | None = None):
    """`data` with every object's members in the order of its schema's `properties` (those of
    `allOf` / `anyOf` / `oneOf` branches after, in order, or before where the applicator comes
    first in the text, `_members_first`; with `prefer=k` the `k`-th branch
    of each `anyOf`/`oneOf` first, its member schemas winning: the document may follow any one
    branch, and a first branch's free-form member would leave a nested object unordered; with
    `prefer="valid"`, for each object the branches it validates against first (`jsonschema`),
    so that two items of one array may follow different branches; `$ref` resolved with
    `referencing`),
    then the `required` names without a schema there (as `JsonSchema` lists them), unlisted
    members after the listed ones in their own order, recursively through property
    values, `additionalProperties` and `items`. For the report only: a valid instance that a
    compiled schema rejects and accepts in this order was rejected for its property order
    (`JsonSchema` writes listed properties in the schema's order, as llguidance does).
    MaskBench normalised its instances to llguidance's order (`maskbench/creation/reorder.py`
    in guidance-ai/jsonschemabench) except where llguidance could not compile the schema."""
    import referencing
    import referencing.jsonschema

    if not isinstance(schema, dict):
        return data
    specification = referencing.jsonschema.specification_with(
        schema.get("$schema", ""), default=referencing.jsonschema.DRAFT202012
    )
    registry = referencing.Registry().with_resource("", specification.create_resource(schema))
    resolver = registry.resolver()

    root_validator = None

    def satisfies(value, branch) -> bool:
        # the branch evaluated inside the root (`evolve` keeps its resolver), so that its
        # `$ref: "#/definitions/..."` resolves against the root, not against the branch alone
        import jsonschema

        nonlocal root_validator
        try:
            if root_validator is None:
                cls = jsonschema.validators.validator_for(schema)
                root_validator = cls(schema, registry=registry)
            return root_validator.evolve(schema=branch).is_valid(value)
        except Exception:
            return False

    def resolve(node, depth=0):
        # a `$ref` beside other keywords is merged with them, as `JsonSchema` reads it
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and depth < 16:
            try:
                target = resolver.lookup(node["$ref"]).contents
            except Exception:
                return {}
            rest = {k: v for k, v in node.items() if k != "$ref"}
            if isinstance(target, dict) and rest:
                inner = resolve(target, depth + 1)
                own, theirs = rest.get("properties") or {}, inner.get("properties") or {}
                first = _members_first(node, "$ref")  # the siblings' members first
                listed_first = {**own, **theirs} if first else {**theirs, **own}
                target = {**inner, **rest, "properties": listed_first}
            node = target
            depth += 1
        return node if isinstance(node, dict) else {}

    def listed(node, names, values, value, depth=0):
        node = resolve(node)
        if depth > 8:
            return

        def own():
            for name, sub in (node.get("properties") or {}).items():
                if name not in values:
                    names.append(name)
                    values[name] = sub

        # the node's own members before or after its applicators' by the keywords' order in
        # the text, as `JsonSchema` (and llguidance) list them
        applicators = [k for k in ("allOf", "anyOf", "oneOf") if k in node]
        if not applicators or _members_first(node, min(applicators, key=list(node).index)):
            own()
        for keyword in sorted(applicators, key=list(node).index):
            branches = list(node.get(keyword) or [])
            if keyword != "allOf" and prefer == "valid":
                branches.sort(key=lambda b: not satisfies(value, b))  # stable: valid first
            elif keyword != "allOf" and isinstance(prefer, int) and prefer < len(branches):
                branches.insert(0, branches.pop(prefer))
            for branch in branches:
                listed(branch, names, values, value, depth + 1)
        own()
        for name in node.get("required") or []:  # required without a schema: after them
            if isinstance(name, str) and name not in values and name not in names:
                names.append(name)

    def order(value, node, depth=0):
        node = resolve(node)
        if depth > 64:
            return value
        if isinstance(value, dict):
            names, values = [], {}
            listed(node, names, values, value)
            rank = {name: i for i, name in enumerate(names)}
            keys = sorted(value, key=lambda k: (rank.get(k, len(names)), list(value).index(k)))
            extra = node.get("additionalProperties")
            patterns = node.get("patternProperties") or {}

            def member_schema(k):
                if k in values:
                    return values[k]
                for pattern, sub in patterns.items():
                    with contextlib.suppress(re.error):
                        if re.search(pattern, k):
                            return sub
                return extra if isinstance(extra, dict) else {}

            return {k: order(value[k], member_schema(k), depth + 1) for k in keys}
        if isinstance(value, list):
            items = node.get("items")
            if not isinstance(items, dict):  # or the items of the first branch that has them
                branches = [
                    resolve(b) for k in ("allOf", "anyOf", "oneOf") for b in node.get(k) or []
                ]
                items = next((b["items"] for b in branches if isinstance(b.get("items"), dict)), {})
            return [order(v, items if isinstance(items, dict) else {}, depth + 1) for v in value]
        return value

    return order(data, schema)


def _cause(error: BaseException) -> str:
    """A short, countable cause of a compile error."""
    from functional_gen.structured.json_schema import UnsupportedSchemaError

    if isinstance(error, UnsupportedSchemaError):
        reason = re.sub(r"\d+", "N", error.reason)
        reason = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", reason)
        return f"{error.keyword}: {reason[:70]}"
    message = str(error).splitlines()[0] if str(error) else ""
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", message)
    message = re.sub(r"\d+", "N", message)
    return f"{type(error).__name__}: {message[:70]}"


_FALLBACK = "no pushdown automaton"
"""The start of `json_schema_compile`'s warning when it falls back to free-form values nested
2 or 1 level(s) (`_FALLBACK_DEPTHS`: the grammar form too large, or a value call that
competes); the warning names the depth."""


def _run_one(record: dict) -> dict:
    out = {"split": record["split"], "file": record["file"]}
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            automaton = _compile(record["schema"])
        if caught:  # e.g. the depth-1 fallback of free-form values, `strict=False` drops
            out["warnings"] = [str(w.message)[:300] for w in caught]
    except Exception as e:
        out["error"] = _cause(e)
        out["message"] = str(e)[:300]
        out["refuse_ms"] = (time.perf_counter() - start) * 1000
        if not isinstance(e, ValueError):
            out["traceback"] = traceback.format_exc(limit=4)[-800:]
        return out
    out["compile_ms"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()  # again in this process: its memos warm, no automaton cache
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _compile(record["schema"])
    out["warm_ms"] = (time.perf_counter() - start) * 1000
    if hasattr(automaton, "stack_depth"):
        out["kind"] = "pushdown"
        out["states"] = automaton.num_positions
    else:
        out["states"] = automaton.num_states
        out["classes"] = automaton.num_classes
    tests = []
    for i, test in enumerate(record["tests"]):
        data = test["data"]
        compact = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        spaced = json.dumps(data, ensure_ascii=False)
        result = {
            "index": i,
            "valid": bool(test["valid"]),
            "compact": _accepts(automaton, compact),
            "spaced": _accepts(automaton, spaced),
        }
        if result["valid"] and not (result["compact"] and result["spaced"]):
            result["schema_order"] = False
            for prefer in (None, "valid", *range(_ORDER_BRANCHES)):
                ordered = json.dumps(
                    _in_schema_order(data, record["schema"], prefer),
                    separators=(",", ":"),
                    ensure_ascii=False,
                )
                if ordered != compact and _accepts(automaton, ordered):
                    result["schema_order"] = True
                    break
        tests.append(result)
    out["tests"] = tests
    return out


def _worker_loop(connection, options: dict) -> None:
    peers = options.pop("peers", ())
    _worker_setup(options)
    _WORKER["peers"] = peers
    _peer_setup(peers)
    connection.send("ready")
    while True:
        record = connection.recv()
        if record is None:
            return
        connection.send(_run_peers(record))  # first: kept when ours times out
        connection.send(_run_one(record))


class Worker:
    """A worker process that compiles schemas one at a time; killed and restarted on timeout."""

    def __init__(self, options: dict):
        self.options = options
        self.context = multiprocessing.get_context("spawn")
        self.process = None
        self.start()

    def start(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_worker_loop, args=(child, self.options), daemon=True
        )
        self.process.start()
        if not self.connection.poll(300) or self.connection.recv() != "ready":
            raise RuntimeError("the benchmark worker did not start")

    def run(self, record: dict, timeout: float) -> dict | None:
        """The result (the peers' under `"peers"`), or only the peers' (`{"peers": ...}`, the
        peers and then ours each given `timeout` seconds) when the schema took longer."""
        self.connection.send(record)
        peers = {}
        try:
            if self.connection.poll(timeout):
                peers = self.connection.recv()
                if self.connection.poll(timeout):
                    return {**self.connection.recv(), "peers": peers}
        except EOFError:
            pass
        self.process.kill()
        self.process.join()
        self.start()
        return {"peers": peers}

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.connection.send(None)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


# ----------------------------------------------------------------------------- driver


def _vocabulary_cache_state() -> str:
    """Whether the workers read the per-tokenizer arrays from disk (a line for the output)."""
    from functional_gen.structured.vocabulary_tables import (
        vocabulary_cache_dir,
        vocabulary_cache_enabled,
    )

    if not vocabulary_cache_enabled():
        return "per-tokenizer arrays: built in every worker (disk cache off)"
    directory = vocabulary_cache_dir()
    files = sorted(directory.glob("*.npz")) if directory.is_dir() else []
    state = f"{len(files)} file(s) there now" if files else "empty: the first worker writes it"
    return f"per-tokenizer arrays: disk cache {directory} ({state})"


def load_records(path: Path, splits, limit: int, seed: int, sample: int = 0) -> list[dict]:
    """The chosen splits' records; with `limit > 0`, a seeded random sample of `limit` each;
    with `sample > 0`, a seeded random sample of `sample` records of the chosen splits together
    (each split in proportion to its size, as the whole file weighs it)."""
    by_split = collections.defaultdict(list)
    with gzip.open(path, "rt") as f:
        for line in f:
            record = json.loads(line)
            if splits is None or record["split"] in splits:
                by_split[record["split"]].append(record)
    if sample > 0:
        pool = [r for split in sorted(by_split) for r in by_split[split]]
        chosen = random.Random(f"{seed}-sample").sample(pool, min(sample, len(pool)))
        return sorted(chosen, key=lambda r: r["split"])
    chosen = []
    order = splits if splits is not None else sorted(by_split)
    for split in order:
        records = by_split.get(split, [])
        if limit > 0 and len(records) > limit:
            records = random.Random(f"{seed}-{split}").sample(records, limit)
        chosen += records
    return chosen


def _percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(results: list[dict], splits) -> str:
    rows = []
    header = (
        "split",
        "schemas",
        "compiled",
        "timeouts",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "valid ok compact",
        "valid ok spaced",
        "invalid rejected",
    )
    groups = collections.defaultdict(list)
    for r in results:
        groups[r["split"]].append(r)
    names = [s for s in splits if s in groups] + ["TOTAL"]
    groups["TOTAL"] = results
    for name in names:
        rs = groups[name]
        compiled = [r for r in rs if "compile_ms" in r]
        times = [r["compile_ms"] for r in compiled]
        tests = [t for r in compiled for t in r["tests"]]
        valid = [t for t in tests if t["valid"]]
        invalid = [t for t in tests if not t["valid"]]
        rows.append(
            (
                name,
                str(len(rs)),
                f"{len(compiled)} ({100 * len(compiled) / max(len(rs), 1):.0f}%)",
                str(sum(1 for r in rs if r.get("timeout"))),
                f"{_percentile(times, 0.5):.0f}",
                f"{_percentile(times, 0.9):.0f}",
                f"{_percentile(times, 0.99):.0f}",
                f"{sum(t['compact'] for t in valid)}/{len(valid)}",
                f"{sum(t['spaced'] for t in valid)}/{len(valid)}",
                f"{sum(not t['compact'] and not t['spaced'] for t in invalid)}/{len(invalid)}",
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    # The target "no schema over 10 s" counts refusals too: the slowest of either kind.
    took = [(r.get("compile_ms", r.get("refuse_ms")), r) for r in results]
    slowest = sorted(((ms, r) for ms, r in took if ms is not None), key=lambda x: -x[0])[:8]
    if slowest:
        lines += [
            "",
            "slowest (compiled or refused): "
            + ", ".join(
                f"{r['file'].split('---')[-1]} {ms / 1000:.1f} s"
                + ("" if "compile_ms" in r else " (refused)")
                for ms, r in slowest
            ),
        ]
    by_depth = collections.defaultdict(list)  # the fallback's depth -> schemas
    for r in results:
        for w in r.get("warnings", ()):
            if _FALLBACK in w and (depth := re.search(r"nest at most (\d+) level", w)):
                by_depth[int(depth.group(1))].append(r["file"].split("---")[-1])
    for depth, files in sorted(by_depth.items()):
        lines += [
            "",
            f"compiled with free-form values nested {depth} level(s) only (a '{_FALLBACK}' "
            f"warning): {len(files)} schemas, "
            + ", ".join(files[:12])
            + (", ..." if len(files) > 12 else ""),
        ]
    lines += ["", *_compare(results)]
    causes = collections.Counter(r["error"] for r in results if "error" in r)
    if causes:
        lines += ["", "| compile-error cause | schemas |", "|---|---|"]
        lines += [f"| {cause} | {n} |" for cause, n in causes.most_common()]
    mismatches = [
        (r["file"], t)
        for r in results
        if "tests" in r
        for t in r["tests"]
        if (t["valid"] and not (t["compact"] and t["spaced"]))
        or (not t["valid"] and (t["compact"] or t["spaced"]))
    ]
    if mismatches:
        lines += ["", f"mismatches ({len(mismatches)}):"]
        lines += [
            f"  {f} test {t['index']}: valid={t['valid']} compact={t['compact']} spaced={t['spaced']}"
            + (" (accepted in the schema's property order)" if t.get("schema_order") else "")
            for f, t in mismatches[:60]
        ]
        ordered = sum(1 for _, t in mismatches if t.get("schema_order"))
        lines += [
            f"valid instances rejected only for their property order: {ordered} of "
            f"{sum(1 for _, t in mismatches if t['valid'])} rejected"
        ]
    return "\n".join(lines)


def _compare(results: list[dict]) -> list[str]:
    """Ours against the peers on the same schemas: compiled, valid documents accepted and
    invalid ones rejected (their own tokenization then EOS, compact form), compile time p50 /
    p99 first in the worker (cold with `--cold`: a fresh process per schema) and again (warm)."""
    engines = {"functional_gen": list(results)}
    for peer in sorted({p for r in results for p in r.get("peers", {})}):
        engines[peer] = [r.get("peers", {}).get(peer, {"error": "timeout"}) for r in results]
    lines = [
        "| engine | compiled | every instance right | valid accepted | invalid rejected | "
        "compile p50 / p99 ms (first) | again p50 / p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entries in engines.items():
        done = [e for e in entries if "compile_ms" in e]
        tests = [t for e in done for t in e.get("tests", [])]
        key = "compact" if name == "functional_gen" else "accepted"
        valid = [t[key] for t in tests if t["valid"]]
        invalid = [not t[key] for t in tests if not t["valid"]]
        # compiled, and every test instance of the schema accepted or rejected as it should be
        # (a compiler that ignores a keyword it cannot enforce compiles more schemas and gets
        # some of their instances wrong: this column counts what it honours on the data)
        right = sum(all(t[key] == t["valid"] for t in e.get("tests", [])) for e in done)
        first = [e["compile_ms"] for e in done]
        warm = [e["warm_ms"] for e in done if "warm_ms" in e]
        lines.append(
            f"| {name} | {len(done)}/{len(entries)} | {right}/{len(entries)} | "
            f"{sum(valid)}/{len(valid)} | "
            f"{sum(invalid)}/{len(invalid)} | {_percentile(first, 0.5):.1f} / "
            f"{_percentile(first, 0.99):.1f} | {_percentile(warm, 0.5):.1f} / "
            f"{_percentile(warm, 0.99):.1f} |"
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--splits", nargs="+", default=list(FIVE_SPLITS), help="splits to run (default: the five)"
    )
    parser.add_argument("--all", action="store_true", help="every split of the file")
    parser.add_argument(
        "--limit", type=int, default=24, help="schemas per split, a seeded sample (0: all)"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        help="a seeded random sample of N schemas of the chosen splits together (with --all: "
        "the whole file, each split weighted by its size), instead of --limit per split",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per schema")
    parser.add_argument("--json", type=Path, help="write every per-schema record here")
    parser.add_argument("--lenient", action="store_true", help="compile with strict=False")
    parser.add_argument(
        "--closed-objects", action="store_true", help="compile with closed_objects=True"
    )
    parser.add_argument(
        "--pushdown",
        action="store_true",
        help="free-form values through the pushdown automaton (free_form_depth=None: the "
        "default since 2026-11-23; kept for older commands)",
    )
    parser.add_argument(
        "--free-form-depth",
        type=int,
        help="JsonSchema(free_form_depth=N): free-form values nested at most N levels (default: "
        "the library's)",
    )
    parser.add_argument(
        "--property-order",
        choices=("schema", "schema_or_required_first", "any"),
        help="JsonSchema(property_order=...): listed properties in the schema's order or, for "
        "small objects, in any order (default: the library's)",
    )
    parser.add_argument(
        "--single-regex",
        action="store_true",
        help="one regex per schema, never the grammar form (json_schema_automaton)",
    )
    parser.add_argument(
        "--files", nargs="+", help="only the schemas whose file name ends with one of these"
    )
    parser.add_argument("--verbose", action="store_true", help="one line per schema")
    parser.add_argument(
        "--peers",
        nargs="*",
        default=[],
        choices=("llguidance", "xgrammar"),
        help="also compile each schema with these engines' own compilers in the same worker "
        "(xgrammar: `pip install --no-deps xgrammar apache-tvm-ffi`, the `bench` extra)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="a fresh worker process for every schema (cold compile times: no memo of earlier "
        "schemas, lazy imports included)",
    )
    parser.add_argument(
        "--no-vocabulary-cache",
        action="store_true",
        help="build the per-tokenizer arrays (token trie, byte matrix) in every worker instead of "
        "reading them from the disk cache (FUNCTIONAL_GEN_VOCABULARY_CACHE=0): cold as the first "
        "schema ever compiled for the tokenizer",
    )
    args = parser.parse_args(argv)
    if args.no_vocabulary_cache:
        os.environ["FUNCTIONAL_GEN_VOCABULARY_CACHE"] = "0"  # inherited by the workers
    print(_vocabulary_cache_state(), file=sys.stderr)
    splits = None if args.all else args.splits
    records = load_records(args.data, splits, args.limit, args.seed, args.sample)
    if args.files:
        records = [r for r in records if r["file"].endswith(tuple(args.files))]
    if splits is None:
        splits = sorted({r["split"] for r in records})
    options = {"strict": False} if args.lenient else {}
    if args.closed_objects:
        options["closed_objects"] = True
    if args.pushdown:
        options["pushdown"] = True
    if args.free_form_depth is not None:
        options["free_form_depth"] = args.free_form_depth
    if args.property_order is not None:
        options["property_order"] = args.property_order
    if args.single_regex:
        options["single_regex"] = True
    print(
        f"{len(records)} schemas from {args.data.name}; timeout {args.timeout:.0f} s; options {options}",
        file=sys.stderr,
    )
    if args.peers:
        options["peers"] = tuple(args.peers)
    worker = Worker(options)
    results = []
    started = time.perf_counter()
    try:
        for i, record in enumerate(records):
            if args.cold and i:
                worker.close()
                worker = Worker(options)
            result = worker.run(record, args.timeout)
            if "file" not in result:
                result = {
                    "split": record["split"],
                    "file": record["file"],
                    "timeout": True,
                    "error": f"timeout over {args.timeout:.0f} s",
                    "peers": result["peers"],
                }
            results.append(result)
            if args.verbose:
                status = (
                    f"{result['compile_ms']:.0f} ms" if "compile_ms" in result else result["error"]
                )
                print(
                    f"[{i + 1}/{len(records)}] {record['split']} {record['file']}: {status}",
                    file=sys.stderr,
                )
    finally:
        worker.close()
    print(
        f"total wall time {time.perf_counter() - started:.0f} s (shared 2-core machine)",
        file=sys.stderr,
    )
    print(summarize(results, splits))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
