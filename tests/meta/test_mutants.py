"""The planted-bug catalogue (`mutants/catalogue.py`) and `python -m mutants`.

(a) Every patch of every mutant still applies (a `PatchError` here means the sampler changed
    under a patch: update the catalogue) and every mutant builds its sampler.
(b) A fast subset of mutants, each with the property that must kill it, one property family
    each: a surviving mutant means that property lost its power. Shrinking is off (the kill,
    not the minimal batch, is the point) and the ci profile is derandomized, so the
    examples are the same on every run.
(c) The `mutate` command in this process: matrix, report and exit codes.

The full kill matrix (every mutant x every property) is `python -m mutants`, recorded in
benchmarks/results/mutants/.
"""

import json

import pytest
from hypothesis import Phase

from mutants.catalogue import EQUIVALENT, MUTANTS, REFERENCE, TRITON, Mutant
from mutants import campaign as mutate
from mutants import matrix
from mutants.mutation import PatchError, load_patched
from rs_verify.properties import PROPERTIES

CATALOGUE = "mutants.catalogue:MUTANTS"
ALL = MUTANTS + EQUIVALENT


def test_catalogue_shape():
    names = [m.name for m in ALL]
    assert len(MUTANTS) >= 26
    assert len(names) == len(set(names)), "mutant names must be unique"
    for m in ALL:
        assert m.target in (TRITON, REFERENCE), m.name
        assert m.models and m.patches, m.name
        assert set(m.killers) <= set(PROPERTIES), f"{m.name}: unknown killers {m.killers}"
        assert m.killers or m in EQUIVALENT, f"{m.name}: name the properties expected to kill it"
        assert any("MUTANT" in new for pairs in m.patches.values() for _, new in pairs), \
            f"{m.name}: mark the planted code with a # MUTANT comment"


@pytest.mark.parametrize("mutant", ALL, ids=lambda m: m.name)
def test_patches_apply(mutant):
    """No PatchError: each `old` text is still present exactly once in the module it patches."""
    sampler = mutant.sampler()  # load_patched + the build expression
    assert callable(sampler) and hasattr(sampler, "name")


def test_stale_patch_fails_loudly():
    stale = Mutant("stale", "a patch whose text left the sampler", TRITON,
                   {"kernels.py": [("this text is not in kernels.py", "x")]}, killers=("planner",))
    with pytest.raises(PatchError, match="expected exactly one occurrence"):
        stale.load()
    with pytest.raises(PatchError, match="no module files"):
        load_patched(TRITON, {"missing.py": [("a", "b")]})


# One mutant per property family, each checked only against one property expected to kill it,
# at the ci profile's own budget (None: its 40 derandomized examples, the inputs the gate runs);
# the run stops at the first failing example, so a kill costs what the kill matrix shows. The
# murmur3 family (SPEC 3b) keeps one defect each for its edges and its certification (under 1 s each), the
# explicit family (SPEC 3c) one for its certification (under 1 s).
FAST_SUBSET = {
    "planner_drops_last_chunk": ("chunked_equals_full", None),  # equivalence: chunked vs full
    "rng_keyed_by_batch_row": ("batch_invariance", None),  # equivalence: permuted / split / merged batches
    "block_v_from_batch_size": ("batch_invariance", None),  # equivalence: numerics that change with batch size
    "planner_packs_twice_the_cap": ("buffer_within_cap", None),  # memory
    "nan_row_emits_vocab_size": ("unvalidated_in_bounds", None),  # bad input
    "argmax_ties_to_highest_index": ("greedy_chain", None),  # invariants: greedy argmax chain
    "draft_id_off_by_one": ("output_invariants", None),  # invariants: accepted prefix
    "sign_extended_resample_seed": ("certified_equivalence", None),  # certification
    "acceptance_uniform_not_clamped": ("stream_edges", None),  # edges (a fixed campaign)
    "ref_own_rng_shared_draft_noise": ("distribution_model_drafts", None),  # distribution (reference: fast)
    "murmur3_uniform_one_conversion": ("stream_edges", None),  # edges of the murmur3 family (SPEC 3b)
    "murmur3_bonus_noise_still_philox": ("certified_equivalence", None),  # certification drawing murmur3
    "explicit_noise_sign": ("certified_equivalence", None),  # certification reading the batch's noise (SPEC 3c)
}


# Killed within the ci budget too, but late (about 40 s and 20 s of CPU through the interpreter):
# their kills are in the recorded matrix and the long run; batch invariance keeps
# rng_keyed_by_batch_row here, the invariants argmax_ties_to_highest_index.
LONG_RUN_ONLY = {"block_v_from_batch_size", "draft_id_off_by_one"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long) if n in LONG_RUN_ONLY else n
                                  for n in sorted(FAST_SUBSET)])
def test_fast_subset_is_killed(name):
    prop, examples = FAST_SUBSET[name]
    res = mutate.run_mutant(CATALOGUE, name, profile="ci", properties=[prop], max_examples=examples,
                            phases=[Phase.explicit, Phase.reuse, Phase.generate])
    assert not res.load_error, res.load_error
    (cell,) = res.cells
    assert cell.symbol in (matrix.KILLED, matrix.ERRORED), f"{name} survived {prop}: {cell}"
    assert cell.symbol == matrix.KILLED, f"{name}: {prop} crashed instead of failing: {cell.message}"


# The tree verifier's mutants (SPEC 4c, the reference's tree.py under the explicit family), each killed in
# process at the ci profile's own budget by certification (0.4 s to 10 s each on an idle core).
TREE_MUTANTS = ("tree_residual_not_updated", "tree_siblings_reversed", "tree_accepts_against_q",
                "tree_uniform_of_parent_row", "tree_row_of_depth", "tree_bonus_from_parent",
                "tree_accepted_nodes_off_by_one")


@pytest.mark.parametrize("name", TREE_MUTANTS)
def test_tree_mutants_are_killed_at_ci(name):
    res = mutate.run_mutant(CATALOGUE, name, profile="ci", properties=["certified_equivalence"],
                            phases=[Phase.explicit, Phase.reuse, Phase.generate])
    assert not res.load_error, res.load_error
    (cell,) = res.cells
    assert cell.symbol == matrix.KILLED, f"{name} survived certified_equivalence at ci: {cell}"


def test_tree_mutants_cover_the_catalogue():
    assert sorted(TREE_MUTANTS) == sorted(m.name for m in MUTANTS if m.name.startswith("tree_"))


# The Triton tree kernel's mutants (SPEC 4c, rs_verify/triton_sampler/tree.py through the interpreter), each
# killed in process at the ci profile's own budget by certification (6 s to 25 s each on an idle core: the
# long run's; `tests/test_triton_tree.py` holds the kernel's hand-built unit tests).
TRITON_TREE_MUTANTS = ("triton_tree_q_not_renormalised", "triton_tree_residual_not_renormalised",
                       "triton_tree_coin_counts_repeats")


@pytest.mark.long
@pytest.mark.parametrize("name", TRITON_TREE_MUTANTS)
def test_triton_tree_mutants_are_killed_at_ci(name):
    test_tree_mutants_are_killed_at_ci(name)


def test_triton_tree_mutants_cover_the_catalogue():
    assert sorted(TRITON_TREE_MUTANTS) == sorted(m.name for m in MUTANTS if m.name.startswith("triton_tree_"))


def test_fast_subset_covers_the_catalogue():
    by_name = {m.name: m for m in MUTANTS}
    for name, (prop, _) in FAST_SUBSET.items():
        assert prop in by_name[name].killers, f"{name}: {prop} is not among its expected killers"
    assert len({PROPERTIES[p].family for p, _ in FAST_SUBSET.values()}) >= 6


def test_mutate_command_in_process(tmp_path, capsys):
    """Killed mutant -> exit 0 with a Markdown and JSON matrix; a survivor -> exit 1."""
    from mutants.campaign import main
    from rs_verify.engine.profiles import active

    report = tmp_path / "report"
    code = main(["--only", "acceptance_uniform_not_clamped", "--properties", "planner", "stream_edges",
                 "--workers", "0", "--profile", active(), "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 of 1 mutants killed" in out
    doc = json.loads((report / "mutants.json").read_text())
    (m,) = doc["mutants"]
    assert m["first_killer"] == "stream_edges" and m["killers"] == ["stream_edges"]
    assert [c["symbol"] for c in m["cells"]] == [".", "K"]  # cheapest first
    assert m["cells"][1]["batch"]["R"] == 2 and m["cells"][1]["found_at"] == 1
    assert doc["property_summary"]["stream_edges"]["only"] == ["acceptance_uniform_not_clamped"]
    md = (report / "mutants.md").read_text()
    assert "| `acceptance_uniform_not_clamped` | triton |" in md and "`stream_edges`" in md
    again = tmp_path / "again"
    assert main(["--from-json", str(report / "mutants.json"), "--report", str(again)]) == 0
    assert (again / "mutants.md").read_text() == md  # a recorded run re-renders identically
    capsys.readouterr()

    code = main(["--catalogue", "mutants.catalogue:EQUIVALENT", "--only", "plain_division", "--properties",
                 "stream_edges", "--workers", "0", "--profile", active()])
    out = capsys.readouterr().out
    assert code == 1 and "survivors: plain_division" in out
    assert main(["--only", "no_such_mutant", "--workers", "0"]) == 2


def test_abbreviations_are_unique():
    labels = matrix.abbreviations(list(PROPERTIES))
    assert len(set(labels.values())) == len(labels)


def test_every_mutant_is_a_sampler_spec():
    """`mutants.samplers:NAME` loads a mutant the way the plugin loads a user's sampler."""
    from rs_verify.harness.samplers import load_sampler

    s = load_sampler("mutants.samplers:planner_drops_last_chunk")
    assert callable(s) and s.loaded_as == "mutants.samplers:planner_drops_last_chunk"
    with pytest.raises(ValueError, match="no attribute"):
        load_sampler("mutants.samplers:no_such_mutant")


@pytest.mark.long  # long run: the campaign machinery, not a gate property
def test_a_failing_control_voids_that_property_for_its_mutants():
    """A control is the unpatched build: a property failing on it (here: the reference built
    without validation fails rejects_bad_input) would 'kill' every mutant of that build for a
    reason no mutant planted, so `void` keeps it from counting."""
    control = mutate.find_mutant(CATALOGUE, f"control: {REFERENCE} pkg.ReferenceSampler(validate=False)")
    assert control.patches == {} and control.target == REFERENCE
    res = mutate.run_mutant(CATALOGUE, control.name, profile="ci", properties=["rejects_bad_input"])
    assert res.killers == ["rejects_bad_input"]
    res = mutate.run_mutant(CATALOGUE, "ref_residual_abs", profile="ci", properties=["planner", "certified_equivalence"],
                            void=("certified_equivalence",))
    assert not res.killed and res.cells[1].symbol == matrix.NOT_RUN and "control" in res.cells[1].message


def test_recorded_runs_merge_into_one_matrix(tmp_path):
    """`--from-json A B`: a matrix recorded in parts (a long campaign split by mutant, one part
    run on fewer properties) renders as one; a mutant in two parts is refused."""
    cheap, dear = mutate.ordered_properties()[0], "certified_equivalence"
    a = [matrix.MutantResult("m1", cells=[matrix.Cell(cheap, matrix.KILLED), matrix.Cell(dear, matrix.NOT_RUN)])]
    b = [matrix.MutantResult("m2", cells=[matrix.Cell(dear, matrix.KILLED)])]
    matrix.write_report(a, [cheap, dear], tmp_path / "a", {"profile": "ci", "wall_s": 10})
    matrix.write_report(b, [dear], tmp_path / "b", {"profile": "ci", "wall_s": 20})
    results, props, meta = matrix.merge_results([tmp_path / "a" / "mutants.json", tmp_path / "b" / "mutants.json"])
    assert [r.name for r in results] == ["m1", "m2"] and all(r.killed for r in results)
    assert props == [cheap, dear] and meta["profile"] == "ci" and "wall_s" not in meta
    assert "1 mutants, properties certified_equivalence; wall_s 20" in meta["merged from"]
    assert mutate.main(["--from-json", str(tmp_path / "a" / "mutants.json"), str(tmp_path / "b" / "mutants.json"),
                        "--report", str(tmp_path / "ab")]) == 0
    assert "**2 of 2 mutants killed.**" in (tmp_path / "ab" / "mutants.md").read_text()
    with pytest.raises(ValueError, match="m1 is in both"):
        matrix.merge_results([tmp_path / "a" / "mutants.json", tmp_path / "ab" / "mutants.json"])
    kept, _, _ = matrix.merge_results([tmp_path / "a" / "mutants.json", tmp_path / "ab" / "mutants.json"], only={"m2"})
    assert [r.name for r in kept] == ["m2"]  # m2 of the merged file only: the first part holds none
