"""The catalogue of planted bugs: one `Mutant` per real failure mode (DESIGN.md, "Bugs the suite
must catch"), applied in memory with `mutants.mutation.load_patched` (files on disk untouched).

Every patch must match its module's text exactly once: when the sampler changes under a
patch, `load_patched` raises `PatchError` and `tests/test_mutants.py` fails, so the catalogue
cannot silently drift out of sync with the code it mutates.

Conventions:
- `target` is the patched package: `rs_verify.triton_sampler` (the production sampler, under
  the Triton interpreter on CPU) or `reference` (the NumPy reference: fast, so the
  distribution campaigns run on it).
- `build` is a Python expression evaluated with `pkg` bound to the patched package and
  `own_streams` (declares `streams = "own"`: a sampler with its own random number generator,
  for which SPEC section 10 skips the certification against the reference). Triton mutants
  are built with `block_v=32`: generated vocabularies above 32 tokens still take multi-block
  reductions and partial tail tiles, and an interpreted call costs about 1.45x less than with
  the tests' 16 (measured on 30 ci batches). None is built `.unvalidated()`: the property
  `unvalidated_in_bounds` calls `unvalidated()` on the mutant itself (which returns the
  patched class), while the validated sampler keeps `rejects_bad_input` meaningful.
- `killers` are the properties expected to kill the mutant (documentation; the meta-test checks
  a few mutants against one of them only; `python -m mutants --escalate N` re-runs them for a
  survivor as a diagnostic). The kill matrix written by
  `python -m mutants` (benchmarks/results/mutants/) is the measured truth.
- Each patch's new text carries a `# MUTANT` comment, so a traceback or `inspect.getsource`
  on a mutant kernel shows what was planted.

`EQUIVALENT` lists mutants that no property can kill on this suite's contract (an equivalent
mutant), with the reason; they are excluded from `MUTANTS` and from the kill score, and kept
so that the reason stays checked (`python -m mutants --catalogue mutants.catalogue:EQUIVALENT`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .mutation import load_patched

TRITON = "rs_verify.triton_sampler"
REFERENCE = "rs_verify.reference"
TRITON_BUILD = "pkg.TritonSampler(block_v=32)"
MURMUR3_BUILD = 'pkg.TritonSampler(block_v=32, streams="murmur3")'  # SPEC 3b's resampling noise
MURMUR3_STEP_BUILD = 'pkg.TritonSampler(block_v=32, streams="murmur3", block_seed="step")'  # SPEC 3b's block seed
FP64_BUILD = 'pkg.TritonSampler(block_v=32, streams="murmur3-fp64")'  # SPEC 3b's float64 noise
EXPLICIT_BUILD = 'pkg.TritonSampler(block_v=32, streams="explicit")'  # SPEC 3c: the batch's noise
TREE_BUILD = 'pkg.ReferenceSampler(streams="explicit")'  # SPEC 4c: tree batches need the explicit family
EXPLICIT_ICDF_BUILD = 'pkg.TritonSampler(block_v=32, streams="explicit", resample="inverse_cdf")'
PER_NODE_BUILD = 'pkg.TritonSampler(block_v=32, streams="explicit", tree_uniforms="per_node")'  # SPEC 4c's coin


@dataclass(frozen=True)
class Mutant:
    """One planted bug.

    - `name`: a short identifier (`python -m mutants --only NAME`).
    - `models`: the real-world bug it models, one line, naming the failure mode.
    - `target`: the package patched ("rs_verify.triton_sampler" or "rs_verify.reference").
    - `patches`: `{"module.py": [(old, new), ...]}`, each `old` present exactly once.
    - `build`: expression building the sampler from the patched package `pkg`.
    - `killers`: properties expected to kill it (documentation and the meta-test's subset).
    - `note`: anything a reader needs (e.g. how an emulation maps to the real bug).
    """

    name: str
    models: str
    target: str
    patches: dict
    build: str = TRITON_BUILD
    killers: tuple = ()
    note: str = ""

    def load(self):
        """The patched package (a fresh in-memory copy; raises PatchError if a patch does not apply)."""
        return load_patched(self.target, self.patches)

    def sampler(self, pkg=None):
        """The mutant sampler, built from `pkg` (default: a freshly patched package)."""
        pkg = self.load() if pkg is None else pkg
        return eval(self.build, {"pkg": pkg, "own_streams": own_streams})  # noqa: S307 - catalogue code


def own_streams(sampler):
    """Declare `streams = "own"` (SPEC section 10): certification is skipped, the tests of fit remain."""
    sampler.streams = "own"
    return sampler


def _k(*pairs):
    """kernels.py patches."""
    return {"kernels.py": list(pairs)}


# -- recurring anchors in rs_verify/triton_sampler/kernels.py (the streams' helpers: streams.py) ----
RESAMPLE_SEED = "key = philox_resample_seed(seed, pos)"  # streams.resample_key
ACCEPT_U = "u = philox_acceptance(seed, j_pos)"
STATE_SEED = "seed = tl.load(seeds_ptr + s)"
GREEDY = "greedy = temp == 0.0"
FINAL_CLAMP = "    tok = tl.where((tok >= 0) & (tok < Vp), tok, 0)\n"
ROW_STATS_TARGET = "m, sum_exp, arg = _row_stats(target_ptr + j * V, live, Vp, t_div, BLOCK_R, BLOCK_V)"
ROW_STATS_DRAFT = "dm, ds, _ = _row_stats(draft_ptr + (s * K + i) * Vd, verifies, Vp, t_div, BLOCK_R, BLOCK_V)"
VERIFY_ZQ = ("* Vd + d_safe, mask=smask, other=NEG_INF)\n"
             "                zq = tl.div_rn(zq.to(tl.float32), t_div)")
RESAMPLE_ZQ = ("mask=tl.where(use_q, mask, False), other=NEG_INF)\n"
               "            zq = tl.div_rn(zq.to(tl.float32), t_div)")
STATS_ALLOC = """    t_max = torch.empty(n, dtype=torch.float32, device=device)
    t_logsum = torch.empty(n, dtype=torch.float32, device=device)
    t_arg = torch.empty(n, dtype=torch.int32, device=device)
"""
# Rows a mutant leaves without statistics would read uninitialised memory (torch.empty):
# a nondeterministic mutant that Hypothesis would report as flaky. Zero-filled instead.
STATS_ZEROED = (STATS_ALLOC, STATS_ALLOC.replace("torch.empty", "torch.zeros").replace(
    "device=device)\n", "device=device)  # MUTANT: zero-filled so the mutant is deterministic\n", 1))


MUTANTS: list[Mutant] = [
    # -- random streams (SPEC section 3) -----------------------------------------------------
    Mutant(
        "shared_draft_resample_noise",
        "Shared noise stream between draft and resample: the resample noise is keyed at pos + 2**30, "
        "the drafter's salted stream, so the resample reuses the noise that picked the draft.",
        TRITON,
        {"streams.py": [(RESAMPLE_SEED, "key = philox_resample_seed(seed, pos + 1073741824)  # MUTANT: drafter salt")]},
        killers=("certified_equivalence",),
        note="Biases the output only against drafts drawn with that stream (distribution_model_drafts on CUDA); "
             "under the interpreter the certification sees the stream itself differ.",
    ),
    Mutant(
        "resample_noise_reuses_acceptance_uniform",
        "Acceptance uniform reused as the resample noise: token x's noise is rand(seed, pos + x), so token 0's "
        "noise is the acceptance uniform u itself and token x's is the uniform of position pos + x.",
        TRITON,
        {"streams.py": [("gum = philox_gumbel(key, idx)", "gum = philox_gumbel(key, pos + idx)  # MUTANT"),
                        (RESAMPLE_SEED, "key = seed  # MUTANT: the acceptance stream")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "sign_extended_resample_seed",
        "Resample seed g = randint(seed, pos) held as int32 and reloaded: tl.rand sign-extends it (SPEC 3: "
        "Triton widens it without sign extension), so every g < 0 draws other noise.",
        TRITON,
        {"streams.py": [(RESAMPLE_SEED, "key = philox_resample_seed(seed, pos).to(tl.int32, bitcast=True)  # MUTANT")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "rng_keyed_by_batch_row",
        "RNG keyed by the batch row instead of the token position: streams change when the batch is "
        "permuted, split or merged.",
        TRITON,
        _k((ACCEPT_U, "u = philox_acceptance(seed, j_vec)  # MUTANT: row, not pos"),
           ("g = resample_key(seed, pos_t, STREAM)", "g = resample_key(seed, jt, STREAM)  # MUTANT: row, not pos")),
        killers=("batch_invariance", "certified_equivalence"),
    ),
    Mutant(
        "acceptance_uniform_keyed_by_batch_row",
        "Acceptance uniform keyed by the batch row instead of the token position (the resample noise is right): "
        "accept/reject decisions change when the batch is permuted, split or chunked.",
        TRITON,
        _k((ACCEPT_U, "u = philox_acceptance(seed, j_vec)  # MUTANT: row, not pos")),
        killers=("certified_equivalence", "batch_invariance"),
    ),
    Mutant(
        "seeds_indexed_by_batch_row",
        "Seeds of the wrong state: idx_mapping ignored for the seed (seeds[r] instead of seeds[idx_mapping[r]]).",
        TRITON,
        _k((STATE_SEED, "seed = tl.load(seeds_ptr + r)  # MUTANT: idx_mapping ignored")),
        killers=("certified_equivalence", "batch_invariance"),
    ),
    Mutant(
        "per_request_seeds_ignored",
        "Per-request seeds ignored: every request draws from the first state's seed.",
        TRITON,
        _k((STATE_SEED, "seed = tl.load(seeds_ptr)  # MUTANT: one seed for all")),
        killers=("certified_equivalence",),
    ),
    Mutant(
        "acceptance_uniform_not_clamped",
        "u not clamped to TINY: u = rand(seed, pos) may be exactly 0, and log 0 = -inf accepts any draft "
        "with p(d) > 0 (SPEC 3: u = max(rand, TINY)).",
        TRITON,
        _k((ACCEPT_U, "u = tl.uint_to_uniform_float(tl.randint4x(seed, j_pos)[0])  # MUTANT: no TINY")),
        killers=("stream_edges",),
        note="Differs only where the Philox word is 0 or -1 (2 in 2**32 draws): random batches never reach it.",
    ),
    Mutant(
        "gumbel_log_one_minus_v",
        "log1p replaced by log(1 - v) in the Gumbel noise: for v < 2**-25, 1 - v rounds to 1 in float32 and "
        "G = -log(-log(1 - v)) becomes +inf, so a token of negligible probability wins the resample.",
        TRITON,
        {"streams.py": [("log1m_v = tl.where(w1 == 1.0, -v, tl.log(w1) * (-v) / tl.where(w1 == 1.0, -1.0, w1 - 1.0))",
                         "log1m_v = tl.log(1.0 - v)  # MUTANT: cancellation for small v")]},
        killers=("stream_edges",),
        note="Elsewhere the error (about 3e-8 / v in log E) is below the certification's tolerance.",
    ),
    # -- the murmur3 family (SPEC 3b): the Triton sampler built with streams="murmur3" -----------
    Mutant(
        "murmur3_key_word_order",
        "MurmurHash3 key words in another order: (seed_lo, seed_hi, x, pos_lo) instead of SPEC 3b's "
        "(seed_lo, seed_hi, pos_lo, x), so every token's resampling noise is another hash.",
        TRITON,
        {"murmur3.py": [("    h = _mix(h, pos.to(tl.int64).to(tl.uint32))\n    h = _mix(h, idx.to(tl.uint32))\n",
                         "    h = _mix(h, idx.to(tl.uint32))  # MUTANT: token before position\n"
                         "    h = _mix(h, pos.to(tl.int64).to(tl.uint32))\n")]},
        build=MURMUR3_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "murmur3_seed_high_word_dropped",
        "The seed's high word dropped from the MurmurHash3 key (the seed held as 32 bits): seeds that differ "
        "above bit 31 share their resampling noise, and seed_hi is hashed as 0.",
        TRITON,
        {"murmur3.py": [("h = _mix(h, (seed.to(tl.int64) >> 32).to(tl.uint32))",
                         "h = _mix(h, (seed.to(tl.int64) & 0).to(tl.uint32))  # MUTANT: seed_hi dropped")]},
        build=MURMUR3_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "murmur3_drafter_salt_on_target",
        "The drafter's position salt (pos + 2**30) applied to the target's resampling noise: the resample "
        "hashes (seed, pos + 2**30, x), the stream a drafter of the same seed draws its drafts with.",
        TRITON,
        {"murmur3.py": [("h = _mix(h, pos.to(tl.int64).to(tl.uint32))",
                         "h = _mix(h, (pos.to(tl.int64) + 1073741824).to(tl.uint32))  # MUTANT: drafter salt")]},
        build=MURMUR3_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "murmur3_uniform_one_conversion",
        "Another uniform formula: u = fp32(h) * 2**-32 (one rounded conversion) instead of SPEC 3b's two exact "
        "16-bit halves plus half a step, so h = 0 gives u = 0 and G = +inf (the token wins whatever its p), the "
        "smallest hashes lose the half step (h = 1: u two thirds of SPEC 3b's) and the others are off by up to "
        "2**-25.",
        TRITON,
        {"murmur3.py": [("    hi = (h >> 16).to(tl.float32) * 1.52587890625e-05\n"
                         "    lo = ((h & 0xFFFF).to(tl.float32) + 0.5) * 2.3283064365386963e-10\n"
                         "    return hi + lo\n",
                         "    return h.to(tl.float32) * 2.3283064365386963e-10  # MUTANT: fp32(h) * 2**-32\n")]},
        build=MURMUR3_BUILD,
        killers=("stream_edges", "certified_equivalence"),
        note="Off the edges G differs by more than the certification's tolerance (eps L, L >= |G| ~ 22 there) only for hashes below "
             "about 100 (a few in 2**32 tokens): the tiny-noise edge point (hash 0: u = 0, G = +inf) is where it shows.",
    ),
    Mutant(
        "murmur3_bonus_noise_still_philox",
        "A half-migrated sampler: the resample after a rejected draft draws murmur3 noise, the draw without "
        "one (the bonus, or the resample after a padded draft) still Philox's rand(randint(seed, pos), x).",
        TRITON,
        {"residual.py": [("gum = resample_noise(g, pos, idx, mask, STREAM)",
                          "gum = tl.where(use_q | (excl >= 0), resample_noise(g, pos, idx, mask, STREAM), "
                          "resample_noise(resample_key(g, pos, \"philox\"), pos, idx, mask, \"philox\"))"
                          "  # MUTANT: bonus still Philox")]},
        build=MURMUR3_BUILD,
        killers=("certified_equivalence",),
        note="Both resample loops pass a rejected, valid draft as use_q (model drafts) or excl (one-hot drafts).",
    ),
    # -- SPEC 3b's step-mixed block seed and murmur3-fp64 -------------------------------------------
    Mutant(
        "block_seed_plain_where_step_declared",
        "A sampler that declares vLLM 0.33.0's step-mixed block seed (block_seed = 'step') but keys every block "
        "step by the plain seed, as vLLM 0.31 and 0.32 did: steps i >= 1 draw other acceptance uniforms.",
        TRITON,
        {"block.py": [("key = seed ^ (tl.cast(i, tl.int64) << 32)", "key = seed  # MUTANT: the plain seed")]},
        build=MURMUR3_STEP_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "block_seed_step_where_plain_declared",
        "The converse: a sampler that declares the plain block seed (the default) but draws vLLM 0.33.0's "
        "seed ^ (i << 32) at block step i (an upgrade that changed the kernel, not the declaration).",
        TRITON,
        {"sampler.py": [('"philox_step" if block_seed == STEP else "philox"',
                         '"philox_step"  # MUTANT: the step seed whatever is declared')]},
        build='pkg.TritonSampler(block_v=32, streams="murmur3", block_seed="plain")',
        killers=("certified_equivalence",),
    ),
    Mutant(
        "block_seed_step_in_low_word",
        "The block step mixed into the seed's low word (seed ^ i) instead of its high word (seed ^ (i << 32)): "
        "a shift lost when the helper was ported.",
        TRITON,
        {"block.py": [("key = seed ^ (tl.cast(i, tl.int64) << 32)",
                       "key = seed ^ tl.cast(i, tl.int64)  # MUTANT: the low word")]},
        build=MURMUR3_STEP_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "fp64_noise_one_hash",
        "murmur3-fp64's two hashes made one: the high word hashed with seed 0 like the low word (the second "
        "hash seed 0x9E3779B9 dropped), so r = (h << 21) | (h >> 11) and every token's noise is another.",
        TRITON,
        {"murmur3.py": [("hi = murmur3_hash(seed, pos, idx, HI_HASH_SEED).to(tl.uint64)",
                         "hi = murmur3_hash(seed, pos, idx).to(tl.uint64)  # MUTANT: one hash")]},
        build=FP64_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "fp64_uniform_not_clamped",
        "murmur3-fp64's uniform without the clamp below 1: r = 2**53 - 1 gives u = 1.0, log u = 0 and G = +inf, "
        "so that token wins whatever its p (one key in 2**53: only the planted edge reaches it).",
        TRITON,
        {"murmur3.py": [("    u = tl.where(u == 1.0, u - ULP53, u)\n", "    # MUTANT: no clamp below 1\n")]},
        build=FP64_BUILD,
        killers=("certified_equivalence",),
    ),
    # -- the explicit family (SPEC 3c): the Triton sampler reading the batch's noise --------------
    Mutant(
        "explicit_noise_of_another_request",
        "The resample noise of another request: request r reads row r + 1 of resample_gumbel (an index into "
        "the noise off by one request, as when noise laid out per request is offset by a padding row), so "
        "its resample follows a neighbour's noise.",
        TRITON,
        {"residual.py": [("g = gumbel_ptr + r * Vp",
                          "g = gumbel_ptr + ((r + 1) % R) * Vp  # MUTANT: a neighbour's noise")]},
        build=EXPLICIT_BUILD,
        killers=("certified_equivalence",),
        note="A batch of one request reads its own row (r + 1 wraps to r): equivalent there.",
    ),
    Mutant(
        "explicit_acceptance_uniform_reused_for_resample",
        "The inverse-CDF resample reuses the acceptance uniform of the row that samples (u_j) instead of the "
        "request's own U_r (SPEC 3c): after a rejection u_j > p/q, so the resample is biased towards the "
        "residual's later tokens.",
        TRITON,
        {"residual.py": [("u = tl.load(unif_ptr + r, mask=draws, other=0.5).to(tl.float32)",
                          "u = tl.load(unif_ptr + jt, mask=draws, other=0.5).to(tl.float32)  # MUTANT: u_j")],
         "sampler.py": [("t_max, t_logsum, d_max, d_logsum, t_thr, t_cut, l_res, gumbel_d, unif_d,",
                         "t_max, t_logsum, d_max, d_logsum, t_thr, t_cut, l_res, gumbel_d, "
                         "accept_d,  # MUTANT: the acceptance uniforms as U")]},
        build=EXPLICIT_ICDF_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "explicit_inverse_cdf_against_u",
        "Inverse CDF comparing the prefix sums with U instead of U * S: right only when the residual "
        "sums to 1, so after a rejection (S = 1 - sum min(p, q) < 1) the late tokens of the residual are "
        "never sampled and the fallback (the last token) takes their mass.",
        TRITON,
        {"inverse_cdf.py": [("bound = (u * tl.where(use_r, s_r, s_p))[:, None]",
                             "bound = u[:, None]  # MUTANT: U, not U * S")]},
        build=EXPLICIT_ICDF_BUILD,
        killers=("certified_equivalence",),
        note="For the bonus (S = sum p = 1 up to rounding) it is excused: only resamples after a rejection show it.",
    ),
    Mutant(
        "explicit_row_shifted_uniform",
        "The acceptance uniform of the next row: u_{j+1} tests the draft of row j (the vLLM layout's "
        "draft_token_ids[j + 1] offset applied to the uniforms too).",
        TRITON,
        {"kernels.py": [("u, log_scale = explicit_uniform(tl.load(accept_ptr + j_vec, mask=smask, other=0.5))",
                         "u, log_scale = explicit_uniform(tl.load(accept_ptr + j_vec + 1, mask=smask, other=0.5))"
                         "  # MUTANT: the next row's u")]},
        build=EXPLICIT_BUILD,
        killers=("certified_equivalence",),
        note="Row j + 1 exists: a verified row is never a request's last (its bonus row).",
    ),
    Mutant(
        "explicit_noise_sign",
        "The Gumbel noise with its sign turned (argmax log r - G, as when an exponential race divides by "
        "exp(G) instead of exp(-G)): the resample prefers the tokens the noise should hold back.",
        TRITON,
        {"streams.py": [("gum = tl.load(key + idx, mask=mask, other=0.0)\n",
                         "gum = -tl.load(key + idx, mask=mask, other=0.0)  # MUTANT: -G\n")]},
        build=EXPLICIT_BUILD,
        killers=("certified_equivalence",),
    ),
    # -- chunking (SPEC section 7) ---------------------------------------------------------------
    Mutant(
        "planner_drops_last_chunk",
        "Chunk planner that drops the last chunk of requests (an off-by-one in the chunk loop): those "
        "requests keep -1 outputs when the batch is verified in several chunks.",
        TRITON,
        {"sampler.py": [("    for a, b in iter_request_chunks(cu_host, cap):\n",
                         "    plan = list(iter_request_chunks(cu_host, cap))\n"
                         "    for a, b in (plan[:-1] if len(plan) > 1 else plan):  # MUTANT: last chunk dropped\n")]},
        killers=("chunked_equals_full",),
    ),
    Mutant(
        "planner_splits_request",
        "Chunk planner that splits a request: the rows of a chunk are capped at max_chunk_logits even inside "
        "one request, so the rows past the cap get no statistics.",
        TRITON,
        {"sampler.py": [("        hi = min(max(int(cu_host[b]), lo), n)\n",
                         "        hi = min(max(int(cu_host[b]), lo), n, lo + cap)  # MUTANT: splits a request\n"),
                        STATS_ZEROED]},
        killers=("chunked_equals_full",),
    ),
    Mutant(
        "chunk_request_offset_not_rebased",
        "Chunk offsets not rebased: the verify kernel of every chunk gets request offset 0, so it re-verifies "
        "the first requests and never the chunk's own.",
        TRITON,
        {"sampler.py": [("                a, n, r, s, k, v, vd, v_eff, masked, block_mode, defer,\n",
                         "                0, n, r, s, k, v, vd, v_eff, masked, block_mode, defer,  # MUTANT: offset not rebased\n"),
                        ("                    a, b, n, r, s, k, v, vd, v_eff, masked, block_mode, int(has_draft),\n",
                         "                    0, b - a, n, r, s, k, v, vd, v_eff, masked, block_mode, int(has_draft),  # MUTANT\n")]},
        killers=("chunked_equals_full",),
    ),
    Mutant(
        "planner_packs_twice_the_cap",
        "Chunk planner packing twice the cap into a chunk, the processed-logits buffer holding the whole "
        "chunk and reported honestly in extras['max_buffer_rows']: the output is correct, the buffer twice "
        "what SPEC section 7 allows (an OOM at a cap sized to the device).",
        TRITON,
        {"sampler.py": [("    for a, b in iter_request_chunks(cu_host, cap):\n",
                         "    for a, b in iter_request_chunks(cu_host, 2 * cap):  # MUTANT: twice the cap\n"),
                        ("rows = max((min(hi - lo, cap) for _, _, lo, hi in chunks), default=0)",
                         "rows = max((hi - lo for _, _, lo, hi in chunks), default=0)  # MUTANT: the chunk's rows"),
                        ("            for blo in range(lo, hi, cap):\n"
                         "                bhi = min(blo + cap, hi)\n",
                         "            for blo in range(lo, hi, max(1, hi - lo)):  # MUTANT: the whole chunk at once\n"
                         "                bhi = hi\n")]},
        killers=("buffer_within_cap",),
        note="Only the buffer shows it (chunking never changes the output): buffer_within_cap alone kills it.",
    ),
    Mutant(
        "logprobs_chunk_local_cu",
        "Concatenated logprobs with a chunk-local cu_num_generated_tokens: the result keeps the last chunk's "
        "own cu list (LogprobsTensors.cat(parts, parts[-1].cu_num_generated_tokens)) instead of the batch's.",
        TRITON,
        {"protocol.py": [("            cu = [int(c) for c in np.asarray(batch.cu_num_logits)]\n",
                         "            cu = [int(c) for c in np.asarray(batch.cu_num_logits)]\n"
                         "            from ..contract.chunking import iter_request_chunks  # MUTANT\n"
                         "            last = list(iter_request_chunks(np.asarray(batch.cu_num_logits), cap))[-1][0]\n"
                         "            cu = [c - cu[last] for c in cu[last:]]  # MUTANT: the last chunk's own cu\n")]},
        killers=("chunked_equals_full",),
        note="A call with the default cap is one chunk (its cu is right): the chunked calls of chunked_equals_full "
             "against the full batch see it; output_invariants checks the same field on unchunked calls.",
    ),
    Mutant(
        "logprobs_at_chunk_offset",
        "Logprobs concatenated in the wrong order: each chunk's logprobs are written at chunk-local rows, so "
        "later chunks overwrite earlier ones.",
        TRITON,
        {"sampler.py": [("                lp_ids[blo:bhi] = t_ids\n"
                         "                lp_vals[blo:bhi] = t_vals\n"
                         "                lp_ranks[blo:bhi] = t_ranks\n",
                         "                lp_ids[blo - lo:bhi - lo] = t_ids  # MUTANT: chunk-local rows\n"
                         "                lp_vals[blo - lo:bhi - lo] = t_vals\n"
                         "                lp_ranks[blo - lo:bhi - lo] = t_ranks\n")]},
        killers=("chunked_equals_full",),
    ),
    # -- batch invariance (SPEC section 8) --------------------------------------------------------
    Mutant(
        "block_v_from_batch_size",
        "Block size depending on the batch size: small batches (N < 8 rows) get one 1024-wide vocab block, "
        "larger ones the configured block, so the reduction order (and a request's logprob bits) change with "
        "the batch the request is in.",
        TRITON,
        {"sampler.py": [("    block = _check_block_v(block_v)\n",
                         "    block = _check_block_v(block_v) if target_logits.shape[0] >= 8 else 1024  # MUTANT\n")]},
        killers=("blackbox_chunking", "batch_invariance"),
        note="Under the interpreter fp32 reductions of different block sizes mostly round alike below V ~ 129: "
             "only logprobs of wider vocabularies show it (on a GPU the tree reduction differs far more often).",
    ),
    Mutant(
        "int32_row_offset_overflow",
        "int32 overflow of row x vocab: the row offset wraps. Emulated by truncating j * V modulo 2**7 "
        "(instead of 2**32) so that small batches (N * V > 128) show it.",
        TRITON,
        _k((ROW_STATS_TARGET, "m, sum_exp, arg = _row_stats(target_ptr + (j * V) % 128, live, Vp, t_div, BLOCK_R, BLOCK_V)  # MUTANT"),
           ("zd = tl.load(target_ptr + j_vec * V + d_safe,", "zd = tl.load(target_ptr + (j_vec * V) % 128 + d_safe,"),
           ("t_row = target_ptr + jt * V", "t_row = target_ptr + (jt * V) % 128  # MUTANT"),
           ("rows = target_ptr + j * V\n", "rows = target_ptr + (j * V) % 128  # MUTANT\n")),
        killers=("greedy_chain", "certified_equivalence"),
        note="The real bug needs N * V >= 2**31 (e.g. 14,000 rows of a 152k vocabulary); the wrapped offset "
             "(j * V) mod 2**7 <= j * V keeps every read in bounds.",
    ),
    # -- layout and indexing (SPEC sections 1 and 4) ----------------------------------------------
    Mutant(
        "draft_id_off_by_one",
        "Off-by-one in draft_token_ids[j + 1]: row j verifies draft_token_ids[j] (the vLLM layout misread).",
        TRITON,
        {"kernels.py": [("d = tl.load(draft_ids_ptr + j_vec + 1, mask=smask, other=-1)",
                         "d = tl.load(draft_ids_ptr + j_vec, mask=smask, other=-1)  # MUTANT: j, not j + 1"),
                        ("    else:\n        has_d = t < n\n        d_t = tl.load(draft_ids_ptr + jt + 1, mask=has_d, other=-1)",
                         "    else:\n        has_d = t < n\n        d_t = tl.load(draft_ids_ptr + jt, mask=has_d, other=-1)  # MUTANT")],
         "residual.py": [("        d_t = tl.load(draft_ids_ptr + jt + 1, mask=has_d, other=-1)\n",
                          "        d_t = tl.load(draft_ids_ptr + jt, mask=has_d, other=-1)  # MUTANT (resample_kernel)\n")]},
        killers=("output_invariants", "greedy_chain"),
    ),
    Mutant(
        "padded_draft_used_as_index",
        "-1 placeholder drafts used as an index and accepted: a negative id wraps like a Python index "
        "(-1 -> V' - 1), is tested against p(V' - 1) and emitted as -1 when accepted.",
        TRITON,
        _k(("        ok = smask & (d >= 0) & (d < Vp)\n        d_safe = tl.where(ok, d, 0)\n",
            "        ok = smask & (d < Vp)  # MUTANT: negative ids are not rejected\n"
            "        d_safe = tl.where(smask, (d % Vp + Vp) % Vp, 0)\n")),
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "padded_draft_verified_as_zero",
        "A 0 verified as a draft instead of -1: padded ids are clamped to token 0, which may be accepted.",
        TRITON,
        _k(("d = tl.load(draft_ids_ptr + j_vec + 1, mask=smask, other=-1)",
            "d = tl.maximum(tl.load(draft_ids_ptr + j_vec + 1, mask=smask, other=-1), 0)  # MUTANT")),
        killers=("output_invariants",),
    ),
    Mutant(
        "bonus_from_next_request_row",
        "Bonus token drawn from the wrong row: cu[r + 1] (the next request's first row) instead of "
        "cu[r + 1] - 1.",
        TRITON,
        {"kernels.py": [("    jt = tl.minimum(tl.maximum(start + t, 0), N - 1)\n    if greedy:",
                         "    jt = tl.minimum(tl.maximum(tl.where(t == n, end, start + t), 0), N - 1)  # MUTANT\n    if greedy:")],
         "residual.py": [("        jt = tl.minimum(tl.maximum(start + t, 0), N - 1)\n        has_d",
                          "        jt = tl.minimum(tl.maximum(tl.where(t == n, end, start + t), 0), N - 1)  # MUTANT\n"
                          "        has_d")]},
        killers=("greedy_chain", "certified_equivalence"),
    ),
    Mutant(
        "accepted_count_not_prefix",
        "Accepted count not a prefix: num_accepted = the number of accepted drafts, not the index of the "
        "first rejection, so a rejected draft followed by accepted ones is emitted.",
        TRITON,
        _k(("t = tl.minimum(t, tl.reduce(tl.where(smask & (acc == 0), i_vec, BIG_INDEX), 0, _MIN))",
            "t = tl.minimum(t, kb + tl.sum((smask & (acc != 0)).to(tl.int32), 0))  # MUTANT: a count")),
        killers=("greedy_chain", "certified_equivalence"),
    ),
    Mutant(
        "draft_vocab_padding_ignored",
        "Draft vocab padding ignored: the target's max / sum / argmax run over V instead of V' = min(V, Vd), "
        "so p is normalised over tokens no draft can propose and greedy may pick one.",
        TRITON,
        _k((ROW_STATS_TARGET, "m, sum_exp, arg = _row_stats(target_ptr + j * V, live, V, t_div, BLOCK_R, BLOCK_V)  # MUTANT: V")),
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "tail_tile_padding_wins_argmax",
        "Padded vocab tail tile winning the argmax: the last block's out-of-vocab lanes read 0 instead of -inf, "
        "and the range clamp on the emitted token is gone, so a token >= V' is emitted.",
        TRITON,
        _k(("tl.load(row_ptr + idx, mask=mask, other=NEG_INF)", "tl.load(row_ptr + idx, mask=mask, other=0.0)"),
           (FINAL_CLAMP, "    pass  # MUTANT: no range clamp on the emitted token\n")),
        killers=("greedy_chain", "output_invariants"),
    ),
    Mutant(
        "nan_row_emits_vocab_size",
        "NaN rows emitting out-of-vocab ids (validation off): a NaN logit is not read as -inf, poisons the row's "
        "log-sum-exp, every resample score turns NaN, and the argmax's 'not found' (n = V', FlashInfer-style) is "
        "emitted unclamped; a row with no finite logit does the same.",
        TRITON,
        {"kernels.py": [("        z = tl.where(z == z, z, NEG_INF)\n        gt = z > m_vec",
                         "        gt = z > m_vec  # MUTANT: NaN not read as -inf"),
                        ("    arg = tl.where(arg == BIG_INDEX, 0, arg)\n", "    arg = tl.where(m > NEG_INF, arg, n)  # MUTANT\n"),
                        (FINAL_CLAMP, "    pass  # MUTANT: no range clamp\n")],
         "residual.py": [("    return tl.where((tok >= 0) & (tok < n), tok, 0)\n",
                          "    return tl.where(tl.reduce(mp, AXIS, _MAX) > NEG_INF, tok, n)  # MUTANT: 'not found' is n\n")]},
        killers=("unvalidated_in_bounds",),
        note="Only invalid batches reach it: the classes target_nan (stochastic rows) and target_row_no_finite, "
             "2 of the 44 defect classes unvalidated_in_bounds draws from (four distinct classes per example: "
             "properties/inputs.py).",
    ),
    # -- temperature and the greedy constant (SPEC section 2) ------------------------------------
    Mutant(
        "greedy_when_temperature_is_one",
        "Greedy constant mistaken: T == 1 (the 'no scaling' value) treated as greedy.",
        TRITON,
        _k((GREEDY, "greedy = (temp == 0.0) | (temp == 1.0)  # MUTANT")),
        killers=("certified_equivalence",),
    ),
    Mutant(
        "greedy_below_epsilon",
        "Greedy constant mistaken: T <= 1e-5 treated as greedy (vLLM's _SAMPLING_EPS); SPEC 2: only T == 0 is "
        "greedy, a tiny T samples among (near-)tied maxima.",
        TRITON,
        _k((GREEDY, "greedy = temp <= 1e-5  # MUTANT")),
        killers=("tiny_temperatures",),
        note="The batch strategies draw T in [0.05, 4] (and 0, 1): only a tiny-temperature property reaches it.",
    ),
    Mutant(
        "draft_temperature_not_applied",
        "Temperature applied to the target but not to the draft: q = softmax(draft) instead of "
        "softmax(draft / T) (target and draft processed with different sampling params).",
        TRITON,
        _k((ROW_STATS_DRAFT, "dm, ds, _ = _row_stats(draft_ptr + (s * K + i) * Vd, verifies, Vp, tl.full([BLOCK_R], 1.0, "
                             "tl.float32), BLOCK_R, BLOCK_V)  # MUTANT"),
           (VERIFY_ZQ, VERIFY_ZQ.replace("tl.div_rn(zq.to(tl.float32), t_div)", "zq.to(tl.float32)  # MUTANT")),
           (RESAMPLE_ZQ, RESAMPLE_ZQ.replace("tl.div_rn(zq.to(tl.float32), t_div)", "zq.to(tl.float32)  # MUTANT"))),
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "temperature_applied_twice",
        "Temperature applied twice (a logits processor and the sampler both divide): z = x / T**2.",
        TRITON,
        _k(("t_div = tl.where(temp == 0.0, 1.0, temp)", "t_div = tl.where(temp == 0.0, 1.0, temp * temp)  # MUTANT"),
           ("t_div = tl.where(greedy, 1.0, temp)", "t_div = tl.where(greedy, 1.0, temp * temp)  # MUTANT"),
           ("t_div = tl.where((PROCESSED != 0) & (temp != 0.0), temp, 1.0)",
            "t_div = tl.where((PROCESSED != 0) & (temp != 0.0), temp * temp, 1.0)  # MUTANT")),
        killers=("certified_equivalence",),
    ),
    Mutant(
        "processed_logprobs_of_greedy_rows_divided",
        "Processed logprobs of greedy rows divided by T: T = 0 is not special-cased, so x / 0 gives "
        "infinite logits and NaN logprobs (SPEC 6: raw for greedy rows).",
        TRITON,
        _k(("t_div = tl.where((PROCESSED != 0) & (temp != 0.0), temp, 1.0)",
            "t_div = tl.where(PROCESSED != 0, temp, 1.0)  # MUTANT: greedy rows divided too")),
        killers=("certified_equivalence",),
    ),
    Mutant(
        "bf16_draft_probabilities",
        "bf16 draft probabilities: the draft's processed logit in the acceptance test is rounded to bfloat16.",
        TRITON,
        _k((VERIFY_ZQ, VERIFY_ZQ.replace(
            "tl.div_rn(zq.to(tl.float32), t_div)",
            "tl.div_rn(zq.to(tl.float32), t_div).to(tl.bfloat16).to(tl.float32)  # MUTANT"))),
        killers=("certified_equivalence",),
    ),
    # -- the algorithm (SPEC section 4) ------------------------------------------------------------
    Mutant(
        "one_hot_residual_keeps_draft",
        "One-hot residual not zeroing the draft: after rejecting draft d the resample draws from p, d included.",
        TRITON,
        _k(("excl = tl.where(ok_t, d_t, -1)", "excl = -1  # MUTANT: r(d) not zeroed")),
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "padded_draft_residual_uses_q",
        "Padded (-1) model drafts resampled from max(p - q, 0) with the q of a step that proposed nothing "
        "(measured vLLM MRV2 behaviour; SPEC 4 resamples from p).",
        TRITON,
        {"kernels.py": [("        ok_t = has_d & (d_t >= 0) & (d_t < Vp)\n        pos_t = tl.load(pos_ptr + jt)",
                         "        ok_t = has_d  # MUTANT: padded drafts use q\n        pos_t = tl.load(pos_ptr + jt)")],
         "residual.py": [("        ok_t = has_d & (d_t >= 0) & (d_t < Vp)\n        thr",
                          "        ok_t = has_d  # MUTANT: padded drafts use q (resample_kernel)\n        thr")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "empty_residual_emits_token_0",
        "No fallback on an empty residual: when p and q are saturated on the same tokens, max(p - q, 0) has no "
        "positive mass and the Gumbel argmax over all -inf scores returns token 0, with p = 0 (measured vLLM "
        "MRV2 behaviour; SPEC 4 falls back to p).",
        TRITON,
        {"residual.py": [("    tok = tl.where(tl.reduce(mr, AXIS, _MAX) > NEG_INF, ir, ip)\n",
                          "    tok = ir  # MUTANT: no fallback to p\n")]},
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "resample_ignores_residual",
        "Resample from p instead of the residual max(p - q, 0) after a rejected model draft.",
        TRITON,
        {"residual.py": [("        sr = tl.where(use_q, tl.where(pos_mass, log_r + gum, NEG_INF), sr)\n",
                          "        pass  # MUTANT: residual ignored\n")]},
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "acceptance_ignores_draft_probability",
        "Acceptance test without q for model drafts: accept iff p(d) > u (the one-hot rule), not p(d) > u q(d).",
        TRITON,
        _k(("            acc = ok & (log_p > thr)\n", "            acc = ok & (log_p > tl.log(u))  # MUTANT\n")),
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "argmax_regardless_of_temperature",
        "Argmax used regardless of temperature: the resample / bonus token is the argmax of z for every request.",
        TRITON,
        _k(("    if greedy:\n        tok = tl.load(t_arg_ptr + jt)\n",
            "    if temp >= 0.0:  # MUTANT: argmax for every request\n        tok = tl.load(t_arg_ptr + jt)\n")),
        killers=("certified_equivalence", "output_invariants"),
    ),
    Mutant(
        "argmax_ties_to_highest_index",
        "Argmax ties broken towards the highest index across vocab lanes (SPEC 4: the lowest index).",
        TRITON,
        _k(("arg = tl.reduce(tl.where(m_vec == m[:, None], i_vec, BIG_INDEX), 1, _MIN)",
            "arg = tl.max(tl.where(m_vec == m[:, None], i_vec, -1), 1)  # MUTANT: highest index")),
        killers=("greedy_chain",),
    ),
    Mutant(
        "logprob_ranks_count_ties",
        "Logprobs rank counting >= instead of > (the token counts itself: every rank is one too large).",
        TRITON,
        {"logprobs.py": [("ranks = (lp > tok_lp).sum(dim=1).to(torch.int64) + 1",
                          "ranks = (lp >= tok_lp).sum(dim=1).to(torch.int64) + 1  # MUTANT")]},
        killers=("certified_equivalence",),
    ),
    # -- block verification (SPEC section 4b) ---------------------------------------------------
    Mutant(
        "block_verified_token_wise",
        "A 'block' path that verifies token by token (vllm-ascend #7807 / #7808): the sampler declares block "
        "verification, takes use_block_verification, and runs the token-wise rule and residual.",
        TRITON,
        {"sampler.py": [('block_mode = int(verification == "block")',
                         "block_mode = 0  # MUTANT: block batches verified token by token")]},
        killers=("certified_equivalence", "distribution_block_sequences"),
    ),
    Mutant(
        "block_no_rescue",
        "tau taken as the first step with u_i > h_i (the token-wise stopping rule) instead of the last step "
        "with u_i <= h_i: a later step never rescues the block.",
        TRITON,
        {"block.py": [("tau = tl.where(ok, i + 1, tau)",
                       "tau = tl.where(ok & (tau == i), i + 1, tau)  # MUTANT: no rescue"),
                      ("l_res = tl.where(ok, l_p, l_res)", "l_res = tl.where(ok & (tau == i + 1), l_p, l_res)")]},
        killers=("certified_equivalence", "block_closed_forms"),
    ),
    Mutant(
        "block_unscaled_residual",
        "The block's resample residual taken as max(p - q, 0) (the token-wise one) instead of "
        "max(P_{tau-1} p - q, 0) after a partly accepted block.",
        TRITON,
        {"residual.py": [("l_scale = tl.load(l_res_ptr + r)",
                          "l_scale = tl.full([BLOCK_R], 0.0, tl.float32)  # MUTANT: P = 1")]},
        killers=("certified_equivalence", "output_invariants"),
    ),
    Mutant(
        "block_padded_draft_read_as_token",
        "A -1 placeholder read as a token in block mode (vLLM #50939): a padded draft does not end the block, "
        "its id is clamped to token 0 and the placeholder is emitted as accepted.",
        TRITON,
        {"block.py": [("((d < 0) | (d >= Vp)), i_vec, BIG_INDEX), 1, _MIN))",
                       "(d >= Vp), i_vec, BIG_INDEX), 1, _MIN))  # MUTANT: -1 not a padded draft")]},
        killers=("output_invariants", "certified_equivalence"),
    ),
    Mutant(
        "block_nan_prefix_accepts",
        "p(d) = q(d) = 0 makes vLLM's prefix ratio NaN and tl.minimum(NaN, 0) returns 0, so P = 1 and the "
        "block accepts a draft the target excludes (SPEC 4b: P = 0 there).",
        TRITON,
        {"block.py": [("l_p = tl.where((lp_d == NEG_INF) | (l_p == NEG_INF) | (step != step), NEG_INF, step)",
                       "l_p = tl.where(ratio != ratio, 0.0, tl.where((lp_d == NEG_INF) | (l_p == NEG_INF) | (step != step), "
                       "NEG_INF, step))  # MUTANT: a NaN ratio (p = q = 0) read as P = 1")]},
        killers=("output_invariants", "certified_equivalence"),
        note="tl.minimum (propagate_nan NONE: minnum) returns the number beside a NaN, in the interpreter "
             "(np.fmin) as on the GPU, so the step is already 0 there: the patch tests the ratio itself for NaN.",
    ),
    Mutant(
        "block_h_is_P",
        "The acceptance threshold h_i taken as P_i at every step (Z_{i+1} / (Z_{i+1} + 1 - P_i) not computed).",
        TRITON,
        {"block.py": [("log_h = tl.where(den > 0.0, tl.log(z_next) - tl.log(tl.where(den > 0.0, den, 1.0)), 0.0)",
                       "log_h = l_p  # MUTANT: h_i = P_i")]},
        killers=("certified_equivalence", "block_closed_forms"),
    ),
    Mutant(
        "block_z_unscaled",
        "Z_{i+1} summed as max(p - q, 0) over the next row (P_i left out of the residual mass) with model drafts.",
        TRITON,
        {"block.py": [("tl.load(d_logsum_ptr + j1), l_p, thr1, cut1,",
                       "tl.load(d_logsum_ptr + j1), tl.full(t_div.shape, 0.0, tl.float32), thr1, cut1,  # MUTANT: P_i = 1 in Z")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "block_one_hot_prefix_not_cumulative",
        "One-hot drafts with a wrong cumulative product (vllm-ascend #7603): P_i = p_i(d_i) of the step alone "
        "instead of the product over the prefix.",
        TRITON,
        {"block.py": [("step = tl.minimum(l_p + ratio, 0.0)",
                       "step = tl.minimum(ratio + (l_p if HAS_DRAFT else 0.0), 0.0)  # MUTANT: one-hot P not cumulative")]},
        killers=("certified_equivalence", "block_closed_forms"),
    ),
    # -- sampling parameters (SPEC section 2) ---------------------------------------------------
    Mutant(
        "top_p_ignored",
        "Top-p not applied in verification (mlc-llm #2940): min-p and top-k masks are, the top-p search is skipped.",
        TRITON,
        {"masks.py": [("    need_p = act & (top_p < 1.0)\n", "    need_p = act & (top_p > 1.0)  # MUTANT: top-p ignored\n")]},
        killers=("certified_equivalence", "output_invariants"),
    ),
    Mutant(
        "top_k_drops_ties",
        "Top-k kept strictly above the k-th value: the k-th token and every token tied with it masked "
        "(SPEC 2: ties at the k-th value kept).",
        TRITON,
        {"masks.py": [("        lo = tl.where(need_k, tl.maximum(lo, (kth ^ ((~kth >> 31) | INT_MIN)).to(tl.float32, bitcast=True)), lo)\n",
                       "        lo = tl.where(need_k, tl.maximum(lo, (kth ^ ((~kth >> 31) | INT_MIN)).to(tl.float32, bitcast=True)), lo)\n"
                       "        cut = tl.where(need_k, -1, cut)  # MUTANT: z > k-th value only\n")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "top_p_keeps_boundary_ties",
        "Every token tied with the top-p boundary value kept (SPEC 2: ties ordered by token id, kept while the "
        "mass before them is below top_p).",
        TRITON,
        {"masks.py": [("        splits = need_p & (keep < ties)\n",
                       "        splits = need_p & (keep < 0)  # MUTANT: all boundary ties kept\n")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "min_p_before_temperature",
        "Min-p threshold taken on softmax(logits) instead of softmax(logits / T) (the processing order of "
        "SPEC 2: temperature first).",
        TRITON,
        {"masks.py": [("tl.minimum(m + tl.log(min_p), m), NEG_INF)",
                       "tl.minimum(m + tl.log(min_p) * t_div, m), NEG_INF)  # MUTANT: before temperature")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "masks_on_bonus_row_only",
        "Sampling parameters applied to the bonus row only, skipped on verified rows as 'argmax-invariant' "
        "(vLLM #42744): acceptance and resampling use the unmasked p.",
        TRITON,
        _k(("    masks = live & (temp != 0.0) & (",
            "    bonus = (j == N - 1) | (tl.load(req_of_row_ptr + tl.minimum(j + 1, N - 1)).to(tl.int64) != r)"
            "  # MUTANT\n    masks = live & bonus & (temp != 0.0) & (")),
        killers=("certified_equivalence", "output_invariants"),
    ),
    Mutant(
        "processed_logprobs_unmasked",
        "Processed logprobs of the unmasked row: the masks reach the sampling but not the returned logprobs.",
        TRITON,
        {"sampler.py": [("blo, bhi, n, r, s, v, v_eff, processed, masked & processed,",
                         "blo, bhi, n, r, s, v, v_eff, processed, 0,  # MUTANT: logprobs unmasked")]},
        killers=("certified_equivalence",),
    ),
    Mutant(
        "top_p_before_min_p_top_k",
        "Top-p computed over the whole row and intersected with min-p and top-k, instead of over the tokens "
        "they leave (SPEC 2's order: min-p, then top-k, then top-p).",
        TRITON,
        {"masks.py": [("_radix_select(row_ptrs, n, t_div, lo, m, top_k, top_p, need_p, True, BLOCK_R, MB)",
                       "_radix_select(row_ptrs, n, t_div, tl.full([BLOCK_R], NEG_INF, tl.float32), m, top_k, top_p, "
                       "need_p, True, BLOCK_R, MB)  # MUTANT"),
                      ("        lo = tl.where(need_p, (key ^ ((~key >> 31) | INT_MIN)).to(tl.float32, bitcast=True), lo)",
                       "        lo = tl.where(need_p, tl.maximum(lo, (key ^ ((~key >> 31) | INT_MIN)).to(tl.float32, "
                       "bitcast=True)), lo)  # MUTANT")]},
        killers=("certified_equivalence",),
    ),
    # -- the reference (fast: the distribution campaigns run) --------------------------------------
    Mutant(
        "ref_residual_abs",
        "Residual |p - q| instead of max(p - q, 0): tokens the draft over-proposes are resampled too.",
        REFERENCE,
        {"slab.py": [("np.maximum(r, 0.0, out=r)", "np.abs(r, out=r)  # MUTANT")]},
        build="pkg.ReferenceSampler()",
        killers=("output_invariants", "certified_equivalence", "distribution_model_drafts"),
    ),
    Mutant(
        "ref_own_rng_shared_draft_noise",
        "Shared noise stream between draft and resample in a sampler with its own RNG: the resample noise is "
        "keyed at pos + 2**30, the stream the drafter drew its draft with.",
        REFERENCE,
        {"slab.py": [("slab.seeds[reqs], slab.pos[rows], vp, out=e)",
                      "slab.seeds[reqs], slab.pos[rows] + 2**30, vp, out=e)  # MUTANT")]},
        build="own_streams(pkg.ReferenceSampler())",
        killers=("distribution_model_drafts",),
        note="streams = 'own': no certification; only a test of fit over drafts drawn with the salted stream "
             "sees the bias (DESIGN: chi-square 320 vs 24.6).",
    ),
    Mutant(
        "ref_own_rng_draft_temperature_ignored",
        "Temperature applied to the target only (q without T) in a sampler with its own RNG.",
        REFERENCE,
        {"slab.py": [("return divide(q, self.row_temp[rows], out=q)", "return q  # MUTANT")]},
        build="own_streams(pkg.ReferenceSampler())",
        killers=("closed_forms", "distribution_model_drafts"),
    ),
    Mutant(
        "ref_own_rng_one_hot_keeps_draft",
        "One-hot residual not zeroing the rejected draft, in a sampler with its own RNG.",
        REFERENCE,
        {"slab.py": [("logr[np.arange(rej.size), d] = -np.inf", "pass  # MUTANT")]},
        build="own_streams(pkg.ReferenceSampler())",
        killers=("output_invariants", "distribution_one_hot_drafts"),
    ),
    Mutant(
        "ref_slab_cu_not_rebased",
        "cu offsets not rebased per chunk: a slab of requests [ra, rb) keeps the global cu[ra:rb + 1].",
        REFERENCE,
        {"slab.py": [("self.cu = cu[ra : rb + 1] - cu[ra]", "self.cu = cu[ra : rb + 1]  # MUTANT: not rebased")]},
        build="pkg.ReferenceSampler(slab_elems=1024)",
        killers=("blackbox_chunking", "certified_equivalence"),
        note="slab_elems=1024 makes batches with V >= 33 span several slabs (the default is 2**18).",
    ),
    Mutant(
        "ref_slab_logprobs_reversed",
        "Logprobs concatenated in the wrong order: the slabs' logprobs joined last slab first.",
        REFERENCE,
        {"sampler.py": [("logprobs = LogprobsTensors.cat(lp_parts, batch.cu_num_logits)",
                         "logprobs = LogprobsTensors.cat(lp_parts[::-1], batch.cu_num_logits)  # MUTANT")]},
        build="pkg.ReferenceSampler(slab_elems=1024)",
        killers=("blackbox_chunking", "certified_equivalence"),
        note="slab_elems=1024 makes batches with V >= 33 span several slabs.",
    ),
    # -- the reference's tree verification (SPEC 4c), explicit noise ---------------------------------
    Mutant(
        "tree_residual_not_updated",
        "Tree verification that forgets the residual after a rejected sibling: the next sibling is tried "
        "against p (not max(p~ - Q~, 0)), and the last token drawn from p.",
        REFERENCE,
        {"tree.py": [("                logpt = np.log(resid / mass) if mass > 0 else np.full(vp, -np.inf)",
                      "                pass  # MUTANT: p~ kept")]},
        build=TREE_BUILD,
        killers=("certified_equivalence", "distribution_tree"),
    ),
    Mutant(
        "tree_siblings_reversed",
        "Siblings tried in decreasing node index (the last drafted first): SPEC 4c tries them in increasing "
        "index, the order they were drawn in.",
        REFERENCE,
        {"tree.py": [("real = [c for c in kids[n] if 0 <= tokens[c] < vp]  # padded children are skipped",
                      "real = [c for c in kids[n] if 0 <= tokens[c] < vp][::-1]  # MUTANT: reversed")]},
        build=TREE_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "tree_accepts_against_q",
        "Children drawn without replacement accepted and subtracted against the parent's Q instead of Q~ "
        "(Q without the earlier siblings' tokens, renormalised): the iid rule applied to them.",
        REFERENCE,
        {"tree.py": [("logqt = _without(logq, [tokens[t] for t in tried]) if wr else logq",
                      "logqt = logq  # MUTANT: Q, not Q~")]},
        build=TREE_BUILD,
        killers=("certified_equivalence", "distribution_tree"),
    ),
    Mutant(
        "tree_uniform_of_parent_row",
        "A child's acceptance uniform read from its parent's row (the chain layout of SPEC 4) instead of its "
        "own row: siblings share one uniform.",
        REFERENCE,
        {"tree.py": [("u = float(row_uniforms(batch, [slab.lo + base + c])[0])",
                      "u = float(row_uniforms(batch, [slab.lo + base + n])[0])  # MUTANT: the parent's row")]},
        build=TREE_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "tree_row_of_depth",
        "The node at depth d read as row cu[r] + d (a chain's layout): the level's target row, draft row and "
        "emitted token come from the wrong node as soon as a tree branches.",
        REFERENCE,
        {"tree.py": [("logp_n = log_softmax64(slab.z[base + n].astype(np.float64))",
                      "logp_n = log_softmax64(slab.z[base + level].astype(np.float64))  # MUTANT: depth as node"),
                     ("logq = _q_row(slab, base + n) if model else None",
                      "logq = _q_row(slab, base + level) if model else None  # MUTANT: depth as node")]},
        build=TREE_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "tree_bonus_from_parent",
        "An accepted leaf's bonus drawn from its parent's p (the last row that verified something) instead "
        "of the leaf's own.",
        REFERENCE,
        {"tree.py": [("token, decisions = _emit(slab, r, base + n, level, logp_n, logpt, last, bool(path) and last is None)",
                      "token, decisions = _emit(slab, r, base + n, level, logp_n if real or not path else "
                      "log_softmax64(slab.z[base + (path[-2] if len(path) > 1 else 0)].astype(np.float64)), "
                      "logpt, last, bool(path) and last is None)  # MUTANT: the parent's p")]},
        build=TREE_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "tree_accepted_nodes_off_by_one",
        "accepted_nodes reported as draft indices (node - 1) instead of local node indices.",
        REFERENCE,
        {"tree.py": [("        nodes[r, : len(path)] = path\n",
                      "        nodes[r, : len(path)] = [c - 1 for c in path]  # MUTANT: off by one\n")]},
        build=TREE_BUILD,
        killers=("output_invariants", "certified_equivalence"),
    ),
    # -- the Triton sampler's tree kernel (SPEC 4c, rs_verify/triton_sampler/tree.py), explicit noise -----
    Mutant(
        "triton_tree_q_not_renormalised",
        "Drafts without replacement: the kernel takes the earlier siblings' tokens out of Q but forgets to "
        "renormalise what is left (Q~ = Q on the other tokens, not Q / (1 - the mass removed)), in the "
        "acceptance test and in the residual.",
        TRITON,
        {"tree.py": [("lq = tl.where(zq == zq, (zq - qm_n) - qls_n - log_den, NEG_INF)",
                      "lq = tl.where(zq == zq, (zq - qm_n) - qls_n, NEG_INF)  # MUTANT: Q~ not renormalised"),
                     ("lq = tl.where(gone, NEG_INF, lq - den_col)",
                      "lq = tl.where(gone, NEG_INF, lq)  # MUTANT: Q~ not renormalised")]},
        build=EXPLICIT_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "triton_tree_residual_not_renormalised",
        "After a rejected sibling the kernel stores max(p~ - Q~, 0) but keeps the old log mass: the next "
        "sibling is tested against the unnormalised residual (too small), and an empty residual is never seen.",
        TRITON,
        {"tree.py": [("                lz, log_den = _tree_residual(target_ptr + jn * V,",
                      "                _lz, log_den = _tree_residual(target_ptr + jn * V,  # MUTANT: lz kept\n"
                      "                                             ")]},
        build=EXPLICIT_BUILD,
        killers=("certified_equivalence",),
    ),
    Mutant(
        "triton_tree_coin_counts_repeats",
        "One coin per node: the running sum S_k adds p of a repeated sibling's token again (SGLang's kernel, "
        "undeclared) instead of summing over distinct tokens.",
        TRITON,
        {"tree.py": [("s_cur = s_prev + tl.where(fresh | (b > NEG_INF), tl.exp(lp_n), 0.0)",
                      "s_cur = s_prev + tl.exp(lp_n)  # MUTANT: a repeated token counted again")]},
        build=PER_NODE_BUILD,
        killers=("certified_equivalence",),
    ),
]


EQUIVALENT: list[Mutant] = [
    Mutant(
        "buffer_sized_by_chunk",
        "Processed-logits buffer sized by the largest planned chunk instead of min(chunk, cap): a request "
        "larger than the cap (a chunk of its own) gets a buffer of its n_r + 1 rows.",
        TRITON,
        {"sampler.py": [("rows = max((min(hi - lo, cap) for _, _, lo, hi in chunks), default=0)",
                         "rows = max((hi - lo for _, _, lo, hi in chunks), default=0)  # MUTANT: not capped")]},
        note="Equivalent by SPEC section 7: it is the seed's design (a chunk holds at least one whole request, the "
             "buffer the chunk's rows), at most max(max_chunk_logits, n_r + 1) rows; planner_packs_twice_the_cap "
             "is the planner bug the bound exists for.",
    ),
    Mutant(
        "plain_division",
        "`/` instead of tl.div_rn for the processed logits (fp32 division not IEEE-rounded on the GPU).",
        TRITON,
        _k(("z = tl.div_rn(tl.load(row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)",
            "z = tl.load(row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32) / t_col  # MUTANT"),
           ("z = tl.div_rn(tl.load(t_row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_div)",
            "z = tl.load(t_row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32) / t_div  # MUTANT"),
           ("zd = tl.div_rn(zd.to(tl.float32), t_div)", "zd = zd.to(tl.float32) / t_div  # MUTANT")),
        note="Equivalent on CPU: the interpreter evaluates both `/` and tl.div_rn with np.divide (IEEE). On a "
             "GPU `/` is off by <= 2 ulp, inside the certification's eps * L tolerance, and chunked / permuted "
             "runs of the same sampler round alike: no property of the SPEC 8 contract can see it.",
    ),
]


def by_name(name: str, catalogue=None) -> Mutant:
    for m in catalogue if catalogue is not None else MUTANTS + EQUIVALENT:
        if m.name == name:
            return m
    raise KeyError(f"no mutant named {name!r}")
