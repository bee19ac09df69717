"""SGLang's tree verification kernel (`tree_speculative_sampling_target_only`) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.sglang_tree:SglangTreeSampler --rs-device cuda

`SglangTreeSampler` wraps the function of an installed sglang (`sglang.kernels.ops.speculative.sampling`,
a CUDA JIT kernel, `sgl_kernel/speculative/sampling.cuh`; `sgl_kernel` in older trees). It needs a GPU:
without CUDA building the sampler raises `RuntimeError`, and its tests skip. No SGLang code lives in
this repository. The calling convention, read from SGLang 0.5.23 and passed by parameter name:

    tree_speculative_sampling_target_only(
        predicts,              # int32 [bs * D], out: the token emitted at each accepted slot (global index)
        accept_index,          # int32 [bs, S], out: the global slots of the accepted path, the root first
        accept_token_num,      # int32 [bs], out: the accepted depth
        candidates,            # int64 [bs, D]: each slot's token (slot 0 the root, never verified)
        retrive_index,         # int64 [bs, D]: each slot's global index (b * D + i)
        retrive_next_token,    # int64 [bs, D]: a slot's first child, -1 for none
        retrive_next_sibling,  # int64 [bs, D]: a slot's next sibling, -1 for none
        uniform_samples,       # float32 [bs, D]: the coin of the children of slot i
        uniform_samples_for_final_sampling,  # float32 [bs]: the inverse-CDF uniform of the emitted token
        target_probs,          # float32 [bs, D, V']: p of slot i's children
        draft_probs,           # float32 [bs, D, V'], zeros: the kernel writes p of each rejected token there
        threshold_single, threshold_acc, deterministic,  # 1.0, 1.0, True: exact sampling
    ) -> None

One-hot trees, one coin per parent node (`tree_uniforms = "per_node"`): the `k`-th sibling is accepted
iff the coin is below the running sum `S_k` of `p` over the siblings tried (a repeated token counted
again: the declared deviation `tree_duplicate_siblings`, SPEC 11); the emitted token by inverse CDF over
`relu(p - D)` (`D`: `p` at the rejected siblings' tokens) with the final uniform.

What the adapter does in SGLang's place:
- Slots are the request's nodes in local order; the links name real children only (a padded child,
  token outside `[0, V')`, is left out: SPEC 4c skips it, and the kernel would index `p` with it).
  Requests are grouped by node count (`D`), `S = K + 1` for all.
- Noise (SPEC 3c): `uniform_samples[b, i] = accept_uniforms[cu[r] + i]` (the parent's row: per_node),
  the final uniform `resample_uniforms[r]`, both rounded to float32 as SGLang's `torch.rand` coins are.
- `target_probs = softmax(z)` in float32 (SPEC 2; SGLang renormalises by top-k / top-p before the
  kernel, which the adapter does not: `sampling_params` is empty).
- Greedy requests: SGLang verifies them with `verify_tree_greedy`, another kernel; the adapter descends
  by `torch.argmax` itself (`rs_verify.contract.tree.greedy_tokens`' rule), so greedy decisions gate the
  adapter.
- Token batches (SPEC 4) are chains with one-hot drafts: draft `i` is node `i + 1`, verified with the
  coin of row `cu[r] + i` (SPEC 4's row), the same rule for one child.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import torch

from ..contract import methods
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.tree import children
from . import explicit_inputs
from .sglang import NOISE, PARAMETERS

MODULES = (("sglang.kernels.ops.speculative.sampling", "tree_speculative_sampling_target_only"),
           ("sgl_kernel", "tree_speculative_sampling_target_only"))


def load_tree_kernel():
    """SGLang's `tree_speculative_sampling_target_only` from the first module of `MODULES` that has it."""
    errors = []
    for module, name in MODULES:
        try:
            fn = getattr(importlib.import_module(module), name, None)
        except ImportError as exc:
            errors.append(f"{module}: {exc}")
            continue
        if callable(fn):
            return fn
        errors.append(f"{module} has no {name}")
    raise ImportError(f"rs_verify.adapters.sglang_tree needs SGLang's tree_speculative_sampling_target_only, which "
                      f"could not be imported ({'; '.join(errors)}). Install sglang (0.5.21 to 0.5.23) on a CUDA "
                      f"machine, or pass tree_speculative_sampling= a function with the same calling convention.")


def check_convention(fn) -> None:
    """TypeError if `fn` takes other parameters than the adapter passes."""
    params = tuple(inspect.signature(fn).parameters)
    if params != PARAMETERS:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)}{params}: the SGLang tree adapter passes {list(PARAMETERS)}: "
                        f"the calling convention changed")


class _Probs:
    """The processed logits `z = fp32(x) / T` (SPEC 2; greedy rows untouched) and `p = softmax(z)` over
    `[0, V')` of every row, float32 on `device`; `greedy` per request."""

    def __init__(self, batch: SpecBatch, device):
        self.vocab = vp = batch.effective_vocab_size
        cu = np.asarray(batch.cu_num_logits, np.int64)
        temps = np.asarray(batch.temperature, np.float32)[np.asarray(batch.idx_mapping, np.int64)]
        self.greedy = temps == 0
        t_row = torch.from_numpy(np.repeat(np.where(self.greedy, np.float32(1), temps), np.diff(cu)))
        x = torch.from_numpy(np.array(np.asarray(batch.target_logits)[:, :vp], np.float32))
        self.z = (x / t_row.unsqueeze(1)).to(device)
        self.p = torch.softmax(self.z, dim=-1)


class SglangTreeSampler:
    """SGLang's tree kernel as a sampler (see the module docstring).

    - tree_speculative_sampling: the function (default: imported from sglang; needs CUDA).
    - device: torch device (default "cuda"; a given function may run elsewhere, a test's fake on "cpu").
    - validate: run `rs_verify.validate` before any work (`unvalidated()` turns it off).
    - deviations: declared deviations (SPEC 11); None: what 0.5.21-0.5.23 carry (`tree_duplicate_siblings`).
    """

    name = "sglang-tree"
    streams = "explicit"
    resample = "inverse_cdf"
    supports_chunking = False
    supports_logprobs = False
    draft_modes = frozenset({"one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    verification_methods = frozenset({methods.TOKEN.name, methods.TREE.name})
    tree_drafts = frozenset({"one_hot"})
    tree_uniforms = "per_node"  # one coin per parent node
    sampling_params = frozenset()
    memory_stats = False
    deviations = frozenset({"tree_duplicate_siblings"})

    def __init__(self, *, tree_speculative_sampling=None, device=None, validate: bool = True, deviations=None):
        if deviations is not None:
            self.deviations = frozenset(deviations)
        if tree_speculative_sampling is None:
            if not torch.cuda.is_available():
                raise RuntimeError("SGLang's tree kernel is CUDA only (a JIT kernel): no CUDA device here")
            tree_speculative_sampling = load_tree_kernel()
        check_convention(tree_speculative_sampling)
        self.fn = tree_speculative_sampling
        self.device = torch.device("cuda" if device is None else device)
        self.interpreted = self.device.type != "cuda"
        self.validate = bool(validate)

    def unvalidated(self) -> "SglangTreeSampler":
        return type(self)(tree_speculative_sampling=self.fn, device=self.device, validate=False,
                          deviations=self.deviations)

    def __repr__(self) -> str:
        return f"SglangTreeSampler({getattr(self.fn, '__module__', '?')}, device={str(self.device)!r})"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        explicit_inputs.admit(self, batch, NOISE, "SGLang renormalises by them before the kernel",
                              "SGLang's kernel verifies trees and chains")
        if batch.node_draft_logits is not None or batch.draft_logits is not None:
            raise ValueError("draft_logits: SGLang's tree kernel verifies one-hot drafts only (draft_modes, tree_drafts)")
        if batch.num_reqs == 0:
            return empty_output(batch)
        tree = batch.verification == methods.TREE.name
        prep = _Probs(batch, self.device)
        reqs = [self.request(batch, r, tree) for r in range(batch.num_reqs)]
        found: list = [None] * batch.num_reqs
        for r in np.flatnonzero(prep.greedy):
            found[r] = self.greedy(prep, reqs[r])
        stochastic = [r for r in range(batch.num_reqs) if not prep.greedy[r]]
        for m in sorted({len(reqs[r]["parents"]) for r in stochastic}):
            group = [r for r in stochastic if len(reqs[r]["parents"]) == m]
            for r, res in zip(group, self.verify(batch, prep, [reqs[r] for r in group], m)):
                found[r] = res
        k = batch.num_speculative_steps
        sampled = np.full((batch.num_reqs, k + 1), -1, np.int64)
        nodes = np.full((batch.num_reqs, k), -1, np.int32)
        num = np.zeros(batch.num_reqs, np.int32)
        for r, (path, tokens) in enumerate(found):
            sampled[r, : len(tokens)] = tokens
            nodes[r, : len(path)] = path
            num[r] = len(tokens)
        return SamplerOutput(sampled=sampled, num_sampled=num, accepted_nodes=nodes if tree else None)

    def request(self, batch: SpecBatch, r: int, tree: bool) -> dict:
        """Request `r`'s nodes: `parents`, `tokens` (-1 where padded) and `rows` (each node's row of `p` and of
        its children's coin: node `i` of a chain is SPEC 4's row of draft `i`)."""
        vp = batch.effective_vocab_size
        lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
        ids = np.asarray(batch.draft_token_ids, np.int64)[lo:hi]
        if tree:
            parents = [int(p) for p in np.asarray(batch.tree_parent)[lo:hi]]
        else:
            parents = [-1] + list(range(1 + int(explicit_inputs.effective_drafts(batch)[r]) - 1))
        m = len(parents)
        tokens = [int(x) if 0 <= x < vp else -1 for x in ids[:m]]
        tokens[0] = max(tokens[0], 0)  # the root's token: never verified
        return dict(parents=parents, tokens=tokens, rows=lo + np.arange(m), lo=lo)

    def greedy(self, prep, req) -> tuple[list[int], list[int]]:
        """SPEC 4c, greedy: the first child whose token is the node's argmax, then the first level's argmax
        without one (torch's argmax of the processed row, lowest index on ties)."""
        kids = children(req["parents"])
        n, path = 0, []
        while True:
            a = int(torch.argmax(prep.z[int(req["rows"][n])]))
            nxt = next((c for c in kids[n] if req["tokens"][c] == a), None)
            if nxt is None:
                return path, [req["tokens"][c] for c in path] + [a]
            path.append(nxt)
            n = nxt

    def arguments(self, batch: SpecBatch, prep, reqs: list[dict], m: int) -> dict:
        """The keyword arguments of one kernel call: requests `reqs`, each with `m` nodes."""
        dev, bs, vp, s = self.device, len(reqs), prep.vocab, batch.num_speculative_steps + 1
        cand = np.zeros((bs, m), np.int64)
        nxt = np.full((bs, m), -1, np.int64)
        sib = np.full((bs, m), -1, np.int64)
        for b, req in enumerate(reqs):
            cand[b] = [max(t, 0) for t in req["tokens"]]
            for n, kids in enumerate(children(req["parents"])):
                real = [c for c in kids if req["tokens"][c] >= 0]
                if real:
                    nxt[b, n] = real[0]
                for c, after in zip(real, real[1:]):
                    sib[b, c] = after
        rows = np.stack([req["rows"] for req in reqs])
        u = np.asarray(batch.accept_uniforms, np.float64)[rows]
        final = np.asarray(batch.resample_uniforms, np.float64)[[self._req_of(batch, req) for req in reqs]]

        def tensor(a, dtype):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dtype)

        return dict(
            predicts=torch.full((bs * m,), -1, dtype=torch.int32, device=dev),
            accept_index=torch.full((bs, s), -1, dtype=torch.int32, device=dev),
            accept_token_num=torch.zeros(bs, dtype=torch.int32, device=dev),
            candidates=tensor(cand, torch.int64),
            retrive_index=tensor(np.arange(bs * m, dtype=np.int64).reshape(bs, m), torch.int64),
            retrive_next_token=tensor(nxt, torch.int64), retrive_next_sibling=tensor(sib, torch.int64),
            uniform_samples=tensor(u.astype(np.float32), torch.float32),
            uniform_samples_for_final_sampling=tensor(final.astype(np.float32), torch.float32),
            target_probs=prep.p[torch.from_numpy(rows.reshape(-1)).to(dev)].reshape(bs, m, vp).contiguous(),
            draft_probs=torch.zeros((bs, m, vp), dtype=torch.float32, device=dev),
            threshold_single=1.0, threshold_acc=1.0, deterministic=True)

    @staticmethod
    def _req_of(batch: SpecBatch, req: dict) -> int:
        return int(np.searchsorted(np.asarray(batch.cu_num_logits), req["lo"], side="right") - 1)

    def verify(self, batch: SpecBatch, prep, reqs: list[dict], m: int) -> list[tuple[list[int], list[int]]]:
        args = self.arguments(batch, prep, reqs, m)
        self.fn(**args)
        num = args["accept_token_num"].cpu().numpy().astype(np.int64)
        index = args["accept_index"].cpu().numpy().astype(np.int64)
        predicts = args["predicts"].cpu().numpy().astype(np.int64)
        out = []
        for b, req in enumerate(reqs):
            a = int(num[b])
            slots = index[b, : a + 1]
            if not 0 <= a < index.shape[1] or not ((b * m <= slots) & (slots < (b + 1) * m)).all():
                raise RuntimeError(f"the kernel returned accept_token_num {a} and accept_index {index[b].tolist()} "
                                   f"for a request of {m} nodes")
            path = [int(x) - b * m for x in slots[1:]]
            out.append((path, [int(predicts[x]) for x in slots]))
        return out
