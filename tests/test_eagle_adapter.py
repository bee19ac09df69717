"""EAGLE's adapter (rs_verify.adapters.eagle) without eagle-llm: it wraps `fake_eagle`, a module with EAGLE
1.2.1's calling convention written here from SPEC 4c (not from the adapter), in torch:

- `evaluate_posterior(logits, candidates, logits_processor, cart_candidates_prob, op, p_indices,
  tree_candidates, b_indices)`: greedy (`logits_processor is None`) takes the longest path whose tokens
  are the argmax of the raw logits before them; stochastic descends level by level, tries the distinct
  children of the accepted node in path order with one `random.random()` each (EAGLE's loop variables
  `j`, the path, and `i`, the depth), accepts iff `r <= p~(x) / q~(x)`, and after a rejection sets
  `p~ = max(p~ - Q~, 0)` renormalised, `Q~` the parent's `Q` without the earlier siblings' tokens; it
  returns `sample_p`: `p~` after a rejection at the last level (`p` of that level's node when `p~` is
  empty: SPEC 4c's fallback, where EAGLE divides by 0), else the processed `p` of the last node (SPEC
  4c's bonus; `raw_bonus=True`: EAGLE's softmax of the raw logits);
- `prepare_logits_processor(temperature, top_k)`: a temperature division, then SPEC 2's top-k (`None` at 0);
- `random`: the module the function draws from (the adapter must replace it).

The adapter over the fake must pass the gate; miswired adapters (p and q swapped, the temperature lost,
a child's uniform taken from its parent's row) must fail certification.
"""

import functools
import random as _random
import re
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import Phase, settings

from rs_verify.adapters import discovery, eagle
from rs_verify.adapters.eagle import EagleSampler
from rs_verify.contract import explicit
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES


def fake_eagle(raw_bonus=False):
    mod = types.ModuleType("fake_eagle_utils")
    mod.random = _random

    def prepare_logits_processor(temperature=0.0, repetition_penalty=0.0, top_p=0.0, top_k=0):
        if temperature <= 0:
            return None

        def process(input_ids, scores):  # SPEC 2: T, then top-k (ties with the k-th value kept)
            z = scores / temperature
            if 0 < top_k < z.shape[-1]:
                z = z.masked_fill(z < torch.topk(z, top_k).values[..., -1:], -torch.inf)
            return z

        return process

    def evaluate_posterior(logits, candidates, logits_processor, cart_candidates_prob, op, p_indices,
                           tree_candidates, b_indices):
        paths, width, v = logits.shape
        assert logits.dtype == torch.float32 and candidates.dtype == torch.long and candidates.shape == (paths, width)
        assert (candidates[:, 0] == candidates[0, 0]).all(), "column 0 is the root's token on every path"
        assert cart_candidates_prob.shape == (paths, width) and tree_candidates.shape[0] == 1
        if logits_processor is None:
            match = (candidates[:, 1:] == torch.argmax(logits[:, :-1], dim=-1)).int()
            lengths = torch.cumprod(match, dim=1).sum(dim=1)
            best = int(torch.argmax(lengths))
            return torch.tensor(best), int(lengths[best]), logits[best, int(lengths[best])]
        accepted, best, rejected = 1, 0, False
        for i in range(1, width):
            if i != accepted:
                break
            rejected = False
            same = (candidates[:, :accepted] == candidates[best, :accepted]).all(dim=1)
            first = int(torch.nonzero(same)[0, 0])
            pt = pn = torch.softmax(logits_processor(None, logits[first, i - 1][None])[0], dim=0)
            seen = []
            for j in range(paths):
                x = int(candidates[j, i])
                if not same[j] or x == -1 or x in seen:
                    continue
                seen.append(x)
                r = mod.random.random()
                qx = cart_candidates_prob[j, i]  # q~ = 0: p~ / q~ is inf (accepted) or NaN (p~ = 0: rejected)
                if r <= pt[x] / qx:
                    accepted, best = accepted + 1, j
                    break
                q = op[i - 1][p_indices[j][i]].clone()
                if len(b_indices[j][i]) > 0:
                    q[tree_candidates[0][b_indices[j][i]]] = 0
                    q = q / q.sum()
                pt = torch.clamp(pt - q, min=0)
                pt = pt / pt.sum() if pt.sum() > 0 else pt  # an empty residual stays empty (never accepts)
                rejected = True
        if rejected and accepted != width:  # SPEC 4c: an empty p~ falls back to p_n
            return torch.tensor(best), accepted - 1, pt if pt.sum() > 0 else pn
        last = logits[best, accepted - 1]
        return torch.tensor(best), accepted - 1, torch.softmax(last if raw_bonus else logits_processor(None, last[None])[0], 0)

    mod.evaluate_posterior, mod.prepare_logits_processor = evaluate_posterior, prepare_logits_processor
    return mod


class Miswired(EagleSampler):
    """The adapter with one convention wrong: "swapped_pq" (target and draft distributions exchanged),
    "lost_temperature" (EAGLE given no temperature warper), "parent_uniform" (a child's uniform read from
    its parent's row, the token-batch layout on trees)."""

    def __init__(self, wrong, **kw):
        self.wrong = wrong
        super().__init__(**kw)

    def unvalidated(self):
        return type(self)(self.wrong, module=self.module, validate=False, deviations=self.deviations)

    def request(self, batch, r, tree):
        req = super().request(batch, r, tree)
        nd = batch.node_draft_logits
        if self.wrong == "swapped_pq" and tree and nd is not None and req["t"] > 0:
            lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
            draft = torch.tensor(np.asarray(nd[lo:hi, : req["vp"]], np.float32))
            req["q"] = torch.softmax(req["raw"] / np.float32(req["t"]), dim=-1)  # the target's law as Q
            req["raw"] = draft  # the draft logits as the target's
        if self.wrong == "parent_uniform" and tree:
            req["uniform_rows"] = np.maximum(req["uniform_rows"] - 1, req["uniform_rows"][0])
        return req

    def arguments(self, batch, req):
        args, paths = super().arguments(batch, req)
        if self.wrong == "lost_temperature" and args["logits_processor"] is not None:
            args["logits_processor"] = lambda input_ids, scores: scores
        return args, paths


def _eagle(raw_bonus=False, deviations=()):
    return EagleSampler(module=fake_eagle(raw_bonus), deviations=deviations)


def _tree_batch(temperature=0.7) -> SpecBatch:
    """One request: root 0 with children 1, 2 (drawn without replacement), node 1 with child 3."""
    rng = np.random.default_rng(3)
    v = 6
    b = SpecBatch(target_logits=rng.standard_normal((4, v)).astype(np.float32), draft_logits=None,
                  draft_token_ids=np.array([0, 2, 4, 1], np.int64), cu_num_logits=np.array([0, 4], np.int32),
                  pos=np.arange(4, dtype=np.int64), idx_mapping=np.zeros(1, np.int32),
                  temperature=np.array([temperature], np.float32), seeds=np.zeros(1, np.int64), num_speculative_steps=2,
                  verification="tree", tree_parent=np.array([-1, 0, 0, 1], np.int32),
                  node_draft_logits=rng.standard_normal((4, v)).astype(np.float32), tree_drafts="without_replacement")
    return explicit.filled(b)


def test_declarations_and_discovery(tmp_path):
    sampler = _eagle(deviations=None)
    rec = record_of(sampler)
    assert (rec.streams, rec.resample, rec.tree_drafts, rec.tree_uniforms) == (
        "explicit", "inverse_cdf", frozenset({"without_replacement"}), "per_child")
    assert rec.verification_methods == {"token", "tree"} and sampler.deviations == {"tree_bonus_unprocessed"}
    utils = tmp_path / "eagle" / "model" / "utils.py"
    utils.parent.mkdir(parents=True)
    utils.write_text("def evaluate_posterior(\n    r = random.random()\n")
    assert discovery.offered("eagle_llm", tmp_path) == [("rs_verify.adapters.eagle:EagleSampler", None)]
    utils.write_text("def evaluate_posterior(\n")
    assert discovery.offered("eagle-llm", tmp_path)[0][1].startswith("this eagle-llm has no tree verification")


def test_the_feed_follows_eagles_convention():
    """Paths sorted by node index, q~ as EAGLE's drafter computes it, earlier siblings, the child's own uniform."""
    batch = _tree_batch()
    sampler = _eagle()
    req = sampler.request(batch, 0, True)
    args, paths = sampler.arguments(batch, req)
    assert paths == [[0, 1, 3], [0, 2]]
    assert args["candidates"].tolist() == [[0, 2, 1], [0, 4, -1]]
    q = torch.softmax(torch.tensor(batch.node_draft_logits) / np.float32(0.7), dim=-1)
    assert torch.allclose(args["cart_candidates_prob"][1, 1], q[0, 4] / (1 - q[0, 2]))
    assert args["b_indices"][1][1].tolist() == [1] and args["b_indices"][0][1] == []
    assert args["p_indices"][0] == [-1, 0, 1] and torch.equal(args["op"][1][1], q[1])
    assert list(req["uniform_rows"]) == [0, 1, 2, 3]
    calls = []
    fake = fake_eagle()
    original = fake.evaluate_posterior

    @functools.wraps(original)
    def spy(**kw):
        calls.append(1)
        return original(**kw)

    fake.evaluate_posterior = spy
    out = EagleSampler(module=fake, deviations=())(batch)
    assert calls and fake.random is _random and out.accepted_nodes.shape == (1, 2)


def test_the_stand_in_refuses_another_caller():
    stand_in = eagle._Uniforms(lambda j, i: 0.5)
    with pytest.raises(RuntimeError, match="calling convention changed"):
        stand_in.random()
    with pytest.raises(AttributeError, match="random.uniform"):
        stand_in.uniform(0, 1)


def test_a_changed_calling_convention_fails_at_construction(monkeypatch):
    fake = fake_eagle()
    fake.evaluate_posterior = lambda logits, candidates, logits_processor: None  # noqa: E731
    with pytest.raises(TypeError, match="calling convention changed"):
        EagleSampler(module=fake)
    monkeypatch.setitem(sys.modules, "eagle", None)
    with pytest.raises(ImportError, match="needs EAGLE's eagle.model.utils"):
        EagleSampler()


# -- through the gate ----------------------------------------------------------------------------


def _gate(name, sampler, reference, shrink=True):
    """One property at the ci profile's budget; `shrink=False` stops at the first failing example (a kill)."""
    base = None if shrink else settings(settings.get_profile("ci"), phases=[Phase.explicit, Phase.reuse, Phase.generate])
    return run(PROPERTIES[name], make_context(sampler, reference, profile="ci"), base)


@pytest.mark.parametrize("name", ["certified_equivalence", "output_invariants",
                                  pytest.param("rejects_bad_input", marks=pytest.mark.long)])
def test_the_gate_passes_the_adapter(name, reference):
    outcome = _gate(name, _eagle(), reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason


def test_eagles_raw_bonus_fails_undeclared_and_passes_declared(reference):
    """SPEC 11's `tree_bonus_unprocessed`: undeclared, EAGLE's raw bonus fails certification; declared, it is
    certified on tree and token batches alike (a chain is a tree, SPEC 4c: its bonus, or the step of a padded
    draft after an accepted one, ends the path on an accepted node)."""
    undeclared = _gate("certified_equivalence", _eagle(raw_bonus=True), reference, shrink=False)
    assert undeclared.status == "failed"
    declared = _gate("certified_equivalence", _eagle(raw_bonus=True, deviations=("tree_bonus_unprocessed",)), reference,
                     shrink=False)
    assert declared.status == "passed", declared.failure.text()[:3000] if declared.failure else declared.reason


@pytest.mark.parametrize("wrong", ["swapped_pq", "lost_temperature", "parent_uniform"])
def test_a_miswired_adapter_fails_certification(wrong, reference):
    outcome = _gate("certified_equivalence", Miswired(wrong, module=fake_eagle(), deviations=()), reference,
                    shrink=False)
    assert outcome.status == "failed", outcome.status
    assert re.search("differ from the reference|outside the residual|p~ excludes|looks like|breaks SPEC sections 4-6",
                     outcome.failure.text())
