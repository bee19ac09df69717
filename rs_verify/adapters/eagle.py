"""EAGLE's tree verification (eagle-llm 1.2.1, `evaluate_posterior`) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.eagle:EagleSampler

`EagleSampler` wraps `evaluate_posterior` of an installed eagle-llm's `eagle/model/utils.py` (the
distribution is `eagle-llm`, the import name `eagle`; its package `__init__` files are empty, so only
that module and what it imports, torch and transformers' logits processors, are loaded). No EAGLE code
lives in this repository. The calling convention, read from the release and passed by parameter name:

    evaluate_posterior(
        logits,                # float32 [P, L, V']: the raw target logits of each path's nodes (path j, depth i)
        candidates,            # int64 [P, L]: each root-to-leaf path's tokens, column 0 the root, -1 past the leaf
        logits_processor,      # EAGLE's prepare_logits_processor(temperature=T, top_k=k) (HF warpers), None for greedy
        cart_candidates_prob,  # float32 [P, L]: q~ of each path node's token, as its drafter's `sample` returns it
        op,                    # per depth i - 1: float32 rows Q (softmax of the processed draft logits)
        p_indices,             # [P][L]: the row of op[i - 1] holding the parent's Q of path j's node at depth i
        tree_candidates,       # int64 [1, m]: every node's token
        b_indices,             # [P][L]: the node indices of the siblings tried before path j's node at depth i
    ) -> (best_candidate, accept_length, sample_p)

Stochastic requests: at each level it tries the distinct children of the accepted node in path order,
one `random.random()` per child tried, accepts iff `r <= p~(x) / q~(x)` and otherwise replaces `p~` by
`max(p~ - Q~, 0)` renormalised (`Q~`: the parent's `Q` with the earlier siblings' tokens removed and
renormalised: drafts without replacement, `tree_drafts = {"without_replacement"}`); it returns the
path and `sample_p`, from which EAGLE's `update_inference_inputs` draws the next token with
`torch.multinomial`. Where the path ends on an accepted node with no rejection at its last level,
`sample_p` is `softmax` of the node's raw logits: the declared deviation `tree_bonus_unprocessed`.

What the adapter does in EAGLE's place (docs/engines.md):
- The tree: one path per leaf, sorted by their node indices, so that a node's children come in
  increasing node index (SPEC 4c's trying order); `b_indices` names the earlier real siblings, padded
  children (tokens outside `[0, V')`) carry EAGLE's `-1` and are skipped. `cart_candidates_prob` is
  computed as EAGLE's drafter (`cnets.Model.sample`) computes it for children drawn without replacement
  in node order: `Q(x) / (1 - sum of Q over the earlier siblings)`, clamped to `[0, 1]`, NaN or inf to 0.
  `Q = softmax(node_draft_logits / T)` (SPEC 2: draft logits get temperature only).
- Noise (SPEC 3c): EAGLE's module-level `random` is replaced during the call by a stand-in whose
  `random()` returns `accept_uniforms` of the child being tried, read from the caller's loop variables
  (`j`, the path, and `i`, the depth: EAGLE 1.2.1's names; the stand-in refuses any other caller). The
  final draw is `torch.multinomial(sample_p, 1)` in EAGLE, whose uniform cannot be fed: the adapter
  draws it by SPEC 4's inverse CDF with `resample_uniforms[r]` over EAGLE's `sample_p` (the same
  distribution; `resample = "inverse_cdf"`), after the checks `torch.multinomial` makes (a NaN, infinite
  or negative `sample_p` raises torch's own error).
- Token batches (SPEC 4) are chains: request `r`'s drafts up to the first padded one (SPEC 3c), draft
  `i` verified with the uniform of row `cu[r] + i` and `Q` of `draft_logits[s, i]` (one-hot drafts: a
  point mass, `q~ = 1`).
- Greedy requests go through EAGLE too (`logits_processor = None`: longest path of argmax matches, then
  `torch.argmax` of the returned row, as `update_inference_inputs` does). A request with no draft node
  is sampled as EAGLE's first step samples (`initialize_tree`: `torch.multinomial(softmax(z))`), by the
  adapter with the same inverse CDF.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import numpy as np
import torch

from ..contract import explicit, methods
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate
from . import explicit_inputs

MODULE = "eagle.model.utils"
FUNCTION = "evaluate_posterior"
PARAMETERS = ("logits", "candidates", "logits_processor", "cart_candidates_prob", "op", "p_indices",
              "tree_candidates", "b_indices")
NOISE = explicit.READS[explicit.INVERSE_CDF]


def load_eagle():
    """EAGLE's `eagle.model.utils` module (its `evaluate_posterior`, `prepare_logits_processor`, `random`)."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        raise ImportError(f"rs_verify.adapters.eagle needs EAGLE's {MODULE}.{FUNCTION}, which could not be imported: "
                          f"{exc}. Install eagle-llm (1.2.1) and transformers, or pass module= an object with the "
                          f"same calling convention.") from exc
    return module


def check_convention(module) -> None:
    """TypeError when `module` lacks what the adapter calls or `evaluate_posterior` takes other parameters."""
    for name in (FUNCTION, "prepare_logits_processor"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"{getattr(module, '__name__', module)} has no {name}: the calling convention changed")
    if not hasattr(module, "random"):
        raise TypeError(f"{getattr(module, '__name__', module)} draws no `random`: the calling convention changed")
    params = tuple(inspect.signature(getattr(module, FUNCTION)).parameters)
    if params != PARAMETERS:
        raise TypeError(f"{FUNCTION}{params}: the EAGLE adapter passes {list(PARAMETERS)}: the calling convention "
                        f"changed")


class _Uniforms:
    """Stands in for EAGLE's `random` module during one call: `random()` is the uniform of the child tried,
    `uniform(j, i)` of path `j`'s node at depth `i` (EAGLE's loop variables in its caller)."""

    def __init__(self, uniform):
        self._feed = uniform
        self.calls = 0

    def random(self) -> float:
        frame = sys._getframe(1)
        names = frame.f_locals
        if frame.f_code.co_name != FUNCTION or "i" not in names or "j" not in names:
            raise RuntimeError(f"random.random() called from {frame.f_code.co_name}, not from {FUNCTION}'s loop over "
                               f"paths j and depths i: the calling convention changed")
        self.calls += 1
        return float(self._feed(int(names["j"]), int(names["i"])))

    def __getattr__(self, name):
        raise AttributeError(f"{FUNCTION} called random.{name}, which the adapter does not feed: the calling "
                             f"convention changed")


def inverse_cdf(sample_p: torch.Tensor, u: float) -> int:
    """The final token: `torch.multinomial`'s checks on `sample_p`, then SPEC 4's inverse CDF with `u`."""
    w = sample_p.detach().to(torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not float(w.sum()) > 0:
        torch.multinomial(sample_p, 1)  # raises torch's own error for what EAGLE would hand it
        raise RuntimeError(f"sample_p {sample_p.tolist()} is not a distribution")
    cum = torch.cumsum(w, 0)
    hit = (w > 0) & (cum > u * cum[-1])
    return int(torch.nonzero(hit)[0, 0]) if bool(hit.any()) else int(torch.nonzero(w > 0)[-1, 0])


def paths_of(parents: list[int]) -> list[list[int]]:
    """Each leaf's root path (local nodes, the root first), sorted by node indices: a node's children
    appear in increasing index, as SPEC 4c tries them."""
    kids = [[] for _ in parents]
    for c in range(1, len(parents)):
        kids[parents[c]].append(c)
    out = []
    for leaf in (n for n in range(len(parents)) if not kids[n]):
        path = [leaf]
        while path[-1] > 0:
            path.append(parents[path[-1]])
        out.append(path[::-1])
    return sorted(out)


class EagleSampler:
    """EAGLE 1.2.1's `evaluate_posterior` as a tree-verifying sampler (see the module docstring).

    - module: an object with EAGLE's `evaluate_posterior`, `prepare_logits_processor` and a `random`
      attribute (default: `eagle.model.utils`, imported when built).
    - validate: run `rs_verify.validate` before any work (`unvalidated()` turns it off).
    - deviations: declared deviations (SPEC 11); None: what 1.2.1 carries (`tree_bonus_unprocessed`).
    """

    name = "eagle"
    streams = "explicit"
    resample = "inverse_cdf"
    supports_chunking = False
    supports_logprobs = False
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    verification_methods = frozenset({methods.TOKEN.name, methods.TREE.name})
    tree_drafts = frozenset({"without_replacement"})  # cnets.Model.sample: torch.multinomial(Q, k, replacement=False)
    tree_uniforms = "per_child"  # one random.random() per child tried
    sampling_params = frozenset({"top_k"})  # HF's TopKLogitsWarper; EAGLE applies top-p before top-k: not SPEC 2's
    interpreted = True  # one Python call per request: too slow for the distribution campaigns' 200,000 requests
    memory_stats = False
    deviations = frozenset({"tree_bonus_unprocessed"})

    def __init__(self, *, module=None, validate: bool = True, deviations=None):
        if deviations is not None:
            self.deviations = frozenset(deviations)
        self.module = load_eagle() if module is None else module
        check_convention(self.module)
        self.validate = bool(validate)

    def unvalidated(self) -> "EagleSampler":
        return type(self)(module=self.module, validate=False, deviations=self.deviations)

    def __repr__(self) -> str:
        return f"EagleSampler({getattr(self.module, '__name__', '?')}.{FUNCTION}, validate={self.validate})"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate if self.validate else check_layout)(batch)
        explicit_inputs.require_noise(batch, NOISE)
        other = [n for n in batch.sampling_params_on() if n not in self.sampling_params]
        if other:
            raise ValueError(f"{', '.join(other)}: this adapter applies top_k only (EAGLE's logits processor applies "
                             f"top-p before top-k, not SPEC 2's order, and has no min-p; sampling_params = {{'top_k'}})")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (EAGLE verifies "
                             f"trees; a token batch is verified as chains)")
        if batch.num_reqs == 0:
            return empty_output(batch)
        tree = batch.verification == methods.TREE.name
        k = batch.num_speculative_steps
        sampled = np.full((batch.num_reqs, k + 1), -1, np.int64)
        nodes = np.full((batch.num_reqs, k), -1, np.int32)
        num = np.zeros(batch.num_reqs, np.int32)
        for r in range(batch.num_reqs):
            path, tokens = self.verify(batch, r, tree)
            sampled[r, : len(tokens)] = tokens
            nodes[r, : len(path)] = path
            num[r] = len(tokens)
        return SamplerOutput(sampled=sampled, num_sampled=num, accepted_nodes=nodes if tree else None)

    # -- one request ---------------------------------------------------------------------------

    def request(self, batch: SpecBatch, r: int, tree: bool) -> dict:
        """Request `r` as EAGLE sees it: `parents`, `tokens` (-1 where padded), `raw` (float32 [m, V'] each
        node's raw target logits), `uniform_rows` (the accept_uniforms row of each node), `q` (float32 [m, V'] Q of
        each node's children, None for one-hot drafts) and `t`."""
        vp = batch.effective_vocab_size
        lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
        s = int(batch.idx_mapping[r])
        t = float(np.asarray(batch.temperature, np.float32)[s])
        ids = np.asarray(batch.draft_token_ids, np.int64)[lo:hi]
        if tree:
            parents = [int(p) for p in np.asarray(batch.tree_parent)[lo:hi]]
            m = hi - lo
        else:  # a chain up to the first padded draft (SPEC 3c)
            m = 1 + int(explicit_inputs.effective_drafts(batch)[r])
            parents = [-1] + list(range(m - 1))
        tokens = [int(x) if 0 <= x < vp else -1 for x in ids[:m]]
        tokens[0] = max(tokens[0], 0)  # the root's token: never verified
        rows = lo + np.arange(m)
        uniform_rows = rows if tree else np.maximum(rows - 1, lo)
        q = None
        div = np.float32(t if t > 0 else 1.0)
        if tree and batch.node_draft_logits is not None:
            d = torch.from_numpy(np.array(batch.node_draft_logits[lo:hi, :vp], np.float32))
            q = torch.softmax(d / div, dim=-1)
        elif not tree and batch.draft_logits is not None and m > 1:
            d = torch.from_numpy(np.array(batch.draft_logits[s, : m - 1, :vp], np.float32))
            q = torch.zeros((m, vp), dtype=torch.float32)
            q[: m - 1] = torch.softmax(d / div, dim=-1)
        raw = torch.from_numpy(np.array(batch.target_logits[rows, :vp], np.float32))
        top_k = 0 if batch.top_k is None else int(np.asarray(batch.top_k)[s])
        return dict(parents=parents, tokens=tokens, raw=raw, uniform_rows=uniform_rows, q=q, t=t, vp=vp, top_k=top_k)

    def arguments(self, batch: SpecBatch, req: dict) -> tuple[dict, list[list[int]]]:
        """The keyword arguments of the call for request `req` (`request`) and its paths."""
        parents, tokens, vp = req["parents"], req["tokens"], req["vp"]
        paths = paths_of(parents)
        width = max(len(p) for p in paths)
        m = len(parents)
        kids = [[] for _ in parents]
        for c in range(1, m):
            kids[parents[c]].append(c)
        q = req["q"]
        if q is None:  # one-hot drafts: Q a point mass at each child (q~ = 1)
            q = torch.zeros((m, vp), dtype=torch.float32)
            for c in range(1, m):
                if tokens[c] >= 0:
                    q[parents[c], tokens[c]] = 1.0
        qt = torch.ones(m, dtype=torch.float32)  # q~ of each node's token, as cnets.Model.sample computes it
        before = {}  # node -> its earlier real siblings
        for n in range(m):
            real = [c for c in kids[n] if tokens[c] >= 0]
            if req["q"] is None or not real:
                before.update({c: [s for s in real if s < c] for c in real})
                continue
            probs = q[n, torch.tensor([tokens[c] for c in real])]
            cum = torch.cat((torch.zeros(1), torch.cumsum(probs, 0)[:-1]))
            ratio = probs / (1 - cum)
            ratio[torch.isinf(ratio) | torch.isnan(ratio)] = -1
            for c, v in zip(real, torch.clamp(ratio, min=0.0, max=1.0)):
                qt[c] = v
                before[c] = [s for s in real if s < c]
        raw = req["raw"]
        rows = [[p[i] if i < len(p) else p[-1] for i in range(width)] for p in paths]
        idx = torch.tensor(rows)
        cand = torch.tensor([[tokens[n] for n in p] + [-1] * (width - len(p)) for p in paths], dtype=torch.long)
        prob = torch.tensor([[float(qt[n]) for n in p] + [1.0] * (width - len(p)) for p in paths], dtype=torch.float32)
        b = [[[] if i >= len(p) or not before.get(p[i]) else torch.tensor(before[p[i]]) for i in range(width)]
             for p in paths]
        pidx = [[-1] + [parents[p[i]] if i < len(p) else 0 for i in range(1, width)] for p in paths]
        t = req["t"]
        proc = None if t == 0 else self.module.prepare_logits_processor(temperature=t, top_k=req["top_k"])
        return dict(logits=raw[idx], candidates=cand, logits_processor=proc, cart_candidates_prob=prob,
                    op=[q] * max(width - 1, 1), p_indices=pidx,
                    tree_candidates=torch.tensor([tokens], dtype=torch.long), b_indices=b), paths

    def verify(self, batch: SpecBatch, r: int, tree: bool) -> tuple[list[int], list[int]]:
        """`(accepted local nodes, emitted tokens)` of request `r`."""
        req = self.request(batch, r, tree)
        u_final = float(np.asarray(batch.resample_uniforms, np.float64)[r])
        if len(req["parents"]) == 1:  # no draft: EAGLE's plain sampling step (initialize_tree)
            z = req["raw"][0]
            proc = (None if req["t"] == 0 else
                    self.module.prepare_logits_processor(temperature=req["t"], top_k=req["top_k"]))
            if proc is None:  # EAGLE: temperature <= 1e-5 is greedy
                return [], [int(torch.argmax(z))]
            return [], [inverse_cdf(torch.softmax(proc(None, z[None])[0], dim=0), u_final)]
        args, paths = self.arguments(batch, req)
        accept = np.asarray(batch.accept_uniforms, np.float64)
        urow = req["uniform_rows"]
        stand_in = _Uniforms(lambda j, i: accept[urow[paths[j][i]]])
        saved = self.module.random
        self.module.random = stand_in
        try:
            best, length, sample_p = getattr(self.module, FUNCTION)(**args)
        finally:
            self.module.random = saved
        best, length = int(best), int(length)
        if not 0 <= best < len(paths) or not 0 <= length < len(paths[best]):
            raise RuntimeError(f"request {r}: {FUNCTION} returned path {best} and accept length {length} for paths "
                               f"{paths}")
        path = paths[best][1 : length + 1]
        greedy = args["logits_processor"] is None  # update_inference_inputs: argmax, else torch.multinomial
        token = int(torch.argmax(sample_p)) if greedy else inverse_cdf(sample_p, u_final)
        return path, [req["tokens"][n] for n in path] + [token]
