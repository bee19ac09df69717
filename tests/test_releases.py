"""`rs-verify releases` (rs_verify.frontends.releases, rs_verify.engine.releases) on a fake release,
without the network: a wheel written here (`rsfakelib`, whose sampler is rs-verify's own
reference), installed from a local directory with `--no-index` into a temporary cache, gated
through the pytest plugin in a child process; a release that cannot be fetched, one the
catalogue does not know and a sampler that cannot be loaded each become one cell of the table."""

import base64
import hashlib
import json
import zipfile

import pytest

from rs_verify.adapters import discovery
from rs_verify.engine import releases as catalogue
from rs_verify.engine import resolve
from rs_verify.frontends import cli
from rs_verify.frontends.releases import LOAD_ERROR, Cell, exit_code, parse_junit

# `make` declares (and has) a deviation, so the table's deviation section has a line to show.
SAMPLER = ("from rs_verify.reference import ReferenceSampler\n\n\n"
           "def make():\n    return ReferenceSampler(deviations=['empty_residual_token0'])\n")


def _wheel(directory, name="rsfakelib", version="1.0", requires=()):
    """A minimal pure-Python wheel: `name/__init__.py`, `name/sampler.py` and its dist-info."""
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}/__init__.py": "", f"{name}/sampler.py": SAMPLER,
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


CATALOGUE = """
["rsfakelib==1.0"]
adapters = ["rsfakelib.sampler:make", "rsfakelib.sampler:missing"]
pure_python = []
env = { RS_FAKE_ENV = "1" }
absent = { "rsfakelib.v1:Gone" = "rsfakelib 1.0 has no v1 (removed)" }

["rsfakelib==2.0"]
adapters = ["rsfakelib.sampler:make"]
"""


@pytest.fixture
def fake(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    cat = tmp_path / "releases.toml"
    cat.write_text(CATALOGUE)
    return {"wheels": wheels, "catalogue": cat, "cache": tmp_path / "cache", "out": tmp_path / "out"}


def _run(fake, *specs, extra=()):
    code = cli.main(["releases", *specs, "--catalogue", str(fake["catalogue"]), "--cache", str(fake["cache"]),
                     "--out", str(fake["out"]), "--find-links", str(fake["wheels"]), "--no-index",
                     "-k", "output_invariants", "--max-examples", "3", *extra])
    table = json.loads((fake["out"] / "releases.json").read_text())
    return code, [Cell(**c) for c in table["cells"]]


def test_a_fake_release_is_installed_and_each_adapter_gated(fake):
    code, cells = _run(fake, "rsfakelib==1.0", extra=["--jobs", "2"])
    by_adapter = {(c.adapter, c.property): c for c in cells}
    assert by_adapter["rsfakelib.sampler:make", "output_invariants"].status == "passed"
    missing = [c for c in cells if c.adapter == "rsfakelib.sampler:missing"]
    assert len(missing) == 1 and missing[0].status == "error" and "cannot load the sampler" in missing[0].message
    assert by_adapter["rsfakelib.v1:Gone", "-"].status == "skipped"
    assert code == 1 and exit_code(cells, "never") == 0
    site = fake["cache"] / "rsfakelib-1.0" / "site"
    assert (site / "rsfakelib" / "sampler.py").is_file()
    md = (fake["out"] / "releases.md").read_text()
    assert "| rsfakelib==1.0 | `rsfakelib.sampler:make` | output_invariants | passed |" in md
    # per release and adapter, each declared deviation with what its rule decided (the plugin's summary)
    done = {d["adapter"]: d for d in json.loads((fake["out"] / "releases.json").read_text())["exercised"]}
    line = "empty_residual_token0 (SPEC section 11, replaces section 4): "
    assert [d for d in done["rsfakelib.sampler:make"]["exercised"] if d.startswith("deviation ")][0].startswith(
        "deviation " + line), done
    assert not any("deselected" in d for d in done["rsfakelib.sampler:make"]["exercised"])  # pytest's tally is not
    assert f"| rsfakelib==1.0 | `rsfakelib.sampler:make` | {line}" in md
    assert "| rsfakelib==1.0 | `rsfakelib.sampler:missing` | none declared |" in md
    # the cache is reused, even offline
    installed = catalogue.install(catalogue.load_catalogue(fake["catalogue"])["rsfakelib==1.0"], fake["cache"],
                                  offline=True)
    assert installed.reused and installed.site == site


def test_a_release_that_cannot_be_fetched_is_a_cell_not_a_crash(fake):
    code, cells = _run(fake, "rsfakelib==2.0", "nolib==1.0")
    assert [(c.release, c.status) for c in cells] == [("rsfakelib==2.0", "error"), ("nolib==1.0", "error")]
    assert cells[0].message.startswith("cannot resolve the dependencies of rsfakelib==2.0")
    assert "No matching distribution found for nolib==1.0" in cells[1].message
    assert code == 1 and not (fake["cache"] / "rsfakelib-2.0" / "site").exists()
    code, cells = _run(fake, "rsfakelib==2.0", extra=["--offline"])
    assert cells[0].status == "skipped" and "not in the cache" in cells[0].message and code == 0


def test_usage_errors(tmp_path):
    with pytest.raises(catalogue.CatalogueError, match="name==version"):
        catalogue.parse_spec("vllm>=0.33")
    assert cli.main(["releases", "vllm>=0.33"]) == 2
    assert cli.main(["releases", str(tmp_path / "vllm-9.0-py3-none-any.whl")]) == 2  # no such wheel
    assert cli.main(["releases", "vllm", "--offline", "--cache", str(tmp_path)]) == 2  # none cached
    assert cli.main(["releases", "vllm==0.33.0", "--jobs", "0"]) == 2


def test_the_packaged_catalogue_only_overrides():
    known = catalogue.load_catalogue()  # parses; any release gates without an entry
    for release in known.values():
        assert all(":" in a for a in release.adapters)
        assert all("==" in pin for pin in release.pure_python)
        assert not {resolve.canonical(p.split("==")[0]) for p in release.pure_python} & set(resolve.PROVIDED)


def test_a_malformed_catalogue_names_the_fault(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('["x==1"]\nadapter = []\n')
    with pytest.raises(catalogue.CatalogueError, match="unknown keys"):
        catalogue.load_catalogue(bad)
    bad.write_text('["x==1"]\nadapters = "a:b"\n')
    with pytest.raises(catalogue.CatalogueError, match="list of strings"):
        catalogue.load_catalogue(bad)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="" name="rs-verify::certified_equivalence" time="2.5">
 <properties><property name="rs_verify_bundle" value="/b/cert.npz"/></properties>
 <failure message="request 1, step 0: argmax diverges&#10;more">text</failure></testcase>
<testcase classname="" name="rs-verify::chunked_equals_full" time="0.1">
 <skipped type="pytest.skip" message="chunked_equals_full: needs internal chunking"/></testcase>
<testcase classname="" name="rs-verify::output_invariants" time="1.0"/>
</testsuite></testsuites>"""


def test_junit_cells_and_a_load_error_reported_once(tmp_path):
    installed = catalogue.Installed(catalogue.Release("lib==1", env={"A": ""}), tmp_path / "site")
    path = tmp_path / "j.xml"
    path.write_text(JUNIT)
    cells = parse_junit(path, "lib==1", "m:a", installed)
    assert [(c.property, c.status) for c in cells] == [("certified_equivalence", "failed"),
                                                        ("chunked_equals_full", "skipped"),
                                                        ("output_invariants", "passed")]
    assert cells[0].message == "request 1, step 0: argmax diverges"
    assert cells[0].replay == f"A='' PYTHONPATH={tmp_path / 'site'} rs-verify replay /b/cert.npz"
    assert cells[1].message == "needs internal chunking"
    load = "".join(f'<testcase name="rs-verify::p{i}"><failure message="{LOAD_ERROR} \'m:a\': ImportError: gone"/>'
                   "</testcase>" for i in range(3))
    path.write_text(f"<testsuites><testsuite>{load}</testsuite></testsuites>")
    cells = parse_junit(path, "lib==1", "m:a", installed)
    assert len(cells) == 1 and cells[0].status == "error" and cells[0].message.endswith("ImportError: gone")


# -- any release, no catalogue entry: resolution, discovery, the newest, a wheel file --------------

OFFERS = (discovery.Offer("rsfakelib.sampler:make", "rsfakelib", (("rsfakelib/sampler.py", "def make("),), "no make"),
          discovery.Offer("rsfakelib.v2:Sampler", "rsfakelib", (("rsfakelib/v2.py", ""),),
                          "this rsfakelib has no v2 sampler"),
          discovery.Offer("rsfakelib.sampler:fp64", "rsfakelib", (("rsfakelib/sampler.py", ""),), "",
                          refuses=(("rsfakelib/sampler.py", "ReferenceSampler", "draws from a family not shipped"),)))


@pytest.fixture
def any_release(tmp_path, monkeypatch):
    """rsfakelib 1.0 and 1.1 (1.1 requires rsfakedep and numpy) and no catalogue entry for either."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    _wheel(wheels, version="1.1", requires=["rsfakedep>=1", "numpy; python_version >= '3'", "rsfakedoc; extra == 'doc'"])
    _wheel(wheels, name="rsfakedep")
    _wheel(wheels, name="numpy", version="9.9")  # resolved (pip sees no installed one), never installed
    monkeypatch.setattr(discovery, "ADAPTERS", discovery.ADAPTERS + OFFERS)
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    return {"wheels": wheels, "catalogue": empty, "cache": tmp_path / "cache", "out": tmp_path / "out"}


def test_any_release_resolves_its_dependencies_and_offers_its_adapters(any_release):
    code, cells = _run(any_release, "rsfakelib")  # the newest release: 1.1
    table = json.loads((any_release["out"] / "releases.json").read_text())
    assert {c.release for c in cells} == {"rsfakelib==1.1"} and table["meta"]["asked"] == ["rsfakelib"]
    status = {(c.adapter, c.property): (c.status, c.message) for c in cells}
    assert status["rsfakelib.sampler:make", "output_invariants"][0] == "passed"
    assert status["rsfakelib.v2:Sampler", "-"] == ("skipped", "this rsfakelib has no v2 sampler")
    assert status["rsfakelib.sampler:fp64", "-"] == ("skipped", "draws from a family not shipped")
    pins = table["meta"]["pins"]["rsfakelib==1.1"]
    assert pins["pins"] == ["rsfakedep==1.0"] and pins["left_out"] == {"numpy": "provided by the environment"}
    site = any_release["cache"] / "rsfakelib-1.1" / "site"
    assert (site / "rsfakedep" / "sampler.py").is_file() and not (site / "numpy").exists()
    # the matrix: what the adapter declared, its counts; the pins as a catalogue that repeats the run
    row = next(r for r in table["matrix"] if r["adapter"] == "rsfakelib.sampler:make")
    assert row["detected"]["streams"] == "triton-philox" and row["passed"] == 1 and row["failed"] == 0
    assert row["detected"]["deviations"] == "empty_residual_token0"
    md = (any_release["out"] / "releases.md").read_text()
    assert md.index("## Matrix") < md.index("## Per property")
    again = catalogue.load_catalogue(any_release["out"] / "catalogue.toml")["rsfakelib==1.1"]
    assert again.pinned and again.pure_python == ("rsfakedep==1.0",) and not again.adapters
    assert code == 0
    # a wheel file is a release candidate: that file is installed
    wheel = any_release["wheels"] / "rsfakelib-1.0-py3-none-any.whl"
    installed = catalogue.install(catalogue.target(str(wheel)), any_release["cache"],
                                  find_links=str(any_release["wheels"]), no_index=True)
    assert installed.error is None and installed.release.spec == "rsfakelib==1.0"
    assert json.loads((installed.site.parent / catalogue.MARKER).read_text())["wheel"] == str(wheel)
    assert catalogue.target(str(wheel)).wheel == str(wheel) and catalogue.cached_versions("rsfakelib",
                                                                                         any_release["cache"]) == ["1.0", "1.1"]
    assert catalogue.target("rsfakelib", root=any_release["cache"], offline=True).spec == "rsfakelib==1.1"


def test_resolution_leaves_out_the_environment_and_cuda_only_packages():
    def item(name, version, *requires):
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}
    report = {"install": [item("vllm", "0.32.0", "torch==2.9", "flashinfer-python", "pydantic>=2"),
                          item("torch", "2.9.0"), item("torchvision", "0.24"), item("pytorch-triton", "3.5"),
                          item("flashinfer-python", "0.6", "cuda-python", "torch"), item("cuda-python", "13"),
                          item("kernels", "0.1", "nvidia-ml-py; extra == 'gpu'"), item("nvidia-ml-py", "13"),
                          item("Pydantic", "2.14.4", "rich"), item("rich", "14")]}
    pins, left = resolve.select(report, "vllm", provided=frozenset({"rich"}), left_out={"cuda-tile": "CUDA-only"})
    assert pins == ("kernels==0.1", "Pydantic==2.14.4")  # an optional (extra) CUDA requirement is kept
    assert left == {"cuda-tile": "CUDA-only", "torch": "provided by the environment",
                    "torchvision": "built against one torch: the environment's torch is used",
                    "pytorch-triton": "built against one torch: the environment's torch is used",
                    "flashinfer-python": "CUDA-only (requires cuda-python)", "cuda-python": "CUDA-only",
                    "nvidia-ml-py": "CUDA-only", "rich": "provided by the environment"}


def test_a_requirement_without_a_wheel_here_is_left_out_and_the_rest_resolved(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, requires=["rsfakedep", "rsnowheel>=1", "cuda-tile==1.6.0rc5", "torch==2.14.1",
                                     "rsfakewin; sys_platform == 'win32'"])
    _wheel(wheels, name="rsfakedep")
    found = resolve.resolve(str(wheel), downloads=tmp_path / "dl", find_links=str(wheels), no_index=True)
    assert found.error is None and (found.name, found.version, found.pins) == ("rsfakelib", "1.0", ("rsfakedep==1.0",))
    assert found.left_out["cuda-tile"] == "CUDA-only" and found.left_out["torch"] == "provided by the environment"
    assert found.left_out["rsnowheel"].startswith("no wheel for this machine") and "rsfakewin" not in found.left_out


def test_a_catalogue_leave_out_keeps_a_direct_requirement_and_what_it_pulls_in_out(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, requires=["rsfakedep", "rsfakeheavy"])
    _wheel(wheels, name="rsfakedep")
    _wheel(wheels, name="rsfakeheavy", requires=["rsfakeheavydep"])
    _wheel(wheels, name="rsfakeheavydep")
    found = resolve.resolve(str(wheel), downloads=tmp_path / "dl", find_links=str(wheels), no_index=True,
                            leave_out={"RsFakeHeavy": "not the sampler's"})
    assert found.error is None and found.pins == ("rsfakedep==1.0",)
    assert found.left_out["rsfakeheavy"] == "not the sampler's" and "rsfakeheavydep" not in found.left_out
    cat = tmp_path / "releases.toml"
    cat.write_text('["rsfakelib==1.0"]\nleave_out = { rsfakeheavy = "not the sampler\'s" }\n')
    assert catalogue.load_catalogue(cat)["rsfakelib==1.0"].leave_out == {"rsfakeheavy": "not the sampler's"}


def test_a_cuda_only_offer_is_skipped_without_cuda(tmp_path):
    site = tmp_path / "site"
    dspark = site / discovery.SGLANG_DSPARK
    dspark.parent.mkdir(parents=True)
    dspark.write_text("def blockwise_rejection_triton(\ndef blockwise_rejection_torch(\n")
    found = dict(discovery.offered("sglang", site, cuda=False))
    assert "libdevice.log1p" in found["rs_verify.adapters.sglang_dspark:DsparkTritonSampler"]
    assert found["rs_verify.adapters.sglang_dspark:DsparkTorchSampler"] is None
    assert dict(discovery.offered("sglang", site, cuda=True))["rs_verify.adapters.sglang_dspark:DsparkTritonSampler"] is None


def test_sglang_tree_kernel_is_offered_on_cuda_only(tmp_path):
    """SGLang's tree kernel (a CUDA JIT module) is offered by a release that holds it, skipped without CUDA
    with its reason, and missing with another reason from a release without it."""
    site = tmp_path / "site"
    tree = site / discovery.SGLANG_TREE
    tree.parent.mkdir(parents=True)
    tree.write_text("def chain_speculative_sampling_target_only(\n")
    adapter = "rs_verify.adapters.sglang_tree:SglangTreeSampler"
    assert "no tree verification kernel" in dict(discovery.offered("sglang", site, cuda=True))[adapter]
    tree.write_text("def tree_speculative_sampling_target_only(\n    predicts,\n")
    assert "CUDA device only" in dict(discovery.offered("sglang", site, cuda=False))[adapter]
    assert dict(discovery.offered("sglang", site, cuda=True))[adapter] is None


def test_discovery_reads_the_installed_files(tmp_path):
    site = tmp_path / "site"
    mrv2 = site / discovery.VLLM_MRV2
    mrv2.parent.mkdir(parents=True)
    mrv2.write_text("def rejection_sample(\n    use_fp64=False,\n")
    (site / discovery.VLLM_GUMBEL).parent.mkdir(parents=True)
    (site / discovery.VLLM_GUMBEL).write_text("def tl_rand64(seed, offset):\n")
    found = dict(discovery.offered("vLLM", site))
    assert found["rs_verify.adapters.vllm:VllmSampler"] is None
    assert "no V1 rejection sampler" in found["rs_verify.adapters.vllm_v1:VllmV1Sampler"]
    assert "no chunk loop" in found["rs_verify.adapters.vllm_chunks:VllmChunkedSampler"]
    assert "tl.randint4x" in found["rs_verify.adapters.vllm:VllmFp64Sampler"]
    (site / discovery.VLLM_GUMBEL).write_text("def murmur3_uniform64(seed, pos, offset):\n")
    assert dict(discovery.offered("vllm", site))["rs_verify.adapters.vllm:VllmFp64Sampler"] is None
    assert discovery.offered("nolib", site) == []


def test_earlier_tables_combine_and_say_what_changed_between_releases(tmp_path):
    """`--tables`: runs' tables rendered as one, ordered by version, with the detected changes."""
    def run(directory, release, streams, block_seed, status="passed"):
        cells = [Cell(release, "rs_verify.adapters.vllm:VllmSampler", "certified_equivalence", status,
                      "request 0, step 1: argmax diverges" if status == "failed" else "")]
        declared = [f"streams: {streams}", f"block_seed: {block_seed}", "interpreted: yes"]
        from rs_verify.frontends.release_table import Exercised, write
        write(cells, tmp_path / directory, {"releases": [release], "profile": "ci", "created": "now", "cache": "c",
                                            "device": "auto", "pins": {release: {"pins": ["x==1"], "left_out": {}}}},
              [Exercised(release, "rs_verify.adapters.vllm:VllmSampler", [], [], declared)])
    run("b", "vllm==0.33.0", "murmur3", "step", "failed")
    run("a", "vllm==0.32.0", "murmur3", "plain")
    run("c", "vllm==0.29.0", "triton-philox", "plain")
    out = tmp_path / "all"
    assert cli.main(["releases", "--tables", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"),
                     "--out", str(out), "--fail-on", "never"]) == 0
    md = (out / "releases.md").read_text()
    assert ("- vllm==0.29.0 -> vllm==0.32.0: `vllm:VllmSampler`: streams triton-philox -> murmur3\n"
            "- vllm==0.32.0 -> vllm==0.33.0: `vllm:VllmSampler`: block_seed plain -> step") in md
    rows = json.loads((out / "releases.json").read_text())["matrix"]
    assert [r["release"] for r in rows] == ["vllm==0.29.0", "vllm==0.32.0", "vllm==0.33.0"]
    assert rows[2]["failures"] == ["certified_equivalence (SPEC 8): request 0, step 1: argmax diverges"]
    assert cli.main(["releases", "--tables", str(tmp_path / "a"), "vllm==0.33.0"]) == 2
    assert cli.main(["releases"]) == 2
