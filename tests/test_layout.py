"""The package's layout holds: no import cycle, the walls between layers, no hidden lazy imports.

Read from the source with `ast` (nothing is imported), so the checks see every module-level
import, including ones a test run would not exercise.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rs_verify", "reference", "strategies", "mutants")
# Folders that install under another name (pyproject's package-dir): one top-level import name.
INSTALLED_AS = {"reference": "rs_verify.reference", "strategies": "rs_verify.strategies"}
MAX_LINES = 420  # "modules of a few hundred lines"; data tables are exempt below
DATA_TABLES = {"mutants.catalogue"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = (*INSTALLED_AS.get(parts[0], parts[0]).split("."), *parts[1:])
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if is_pkg else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    target = node.module or ""
    full = f"{base}.{target}".strip(".") if node.level else target
    # `from pkg import mod` imports pkg.mod when that is a module
    return [f"{full}.{a.name}" if f"{full}.{a.name}" in MODULES else full for a in node.names]


def _imports(name: str, *, top_level: bool) -> set[str]:
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _resolve(name, node, path.name == "__init__.py"):
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
    return found


GRAPH = {m: _imports(m, top_level=True) for m in MODULES}


def test_no_import_cycle():
    # Tarjan-free check: repeatedly peel modules whose imports are all peeled (a DAG empties).
    left = {m: set(deps) & set(MODULES) for m, deps in GRAPH.items()}
    while True:
        leaves = [m for m, deps in left.items() if not deps - {m}]
        if not leaves:
            break
        for m in leaves:
            del left[m]
        for deps in left.values():
            deps.difference_update(leaves)
    assert not left, f"import cycle among: {sorted(left)}"


def _all_imports(module: str) -> set[str]:
    return _imports(module, top_level=False)


# Each layer and what it may import. `rs_verify` itself (the package `__init__`: the contract's
# re-exports) is allowed by exact name only; everything else by prefix.
WALLS = [
    ("rs_verify.contract", ("rs_verify.contract",)),
    ("rs_verify.reference", ("rs_verify.reference", "rs_verify.contract", "rs_verify")),
    ("rs_verify.strategies", ("rs_verify.strategies", "rs_verify.contract", "rs_verify")),
    ("rs_verify.harness", ("rs_verify.harness", "rs_verify.contract", "rs_verify")),
    # Properties import only the contract, the harness and the strategies (never the engine that runs
    # them, never a concrete sampler).
    ("rs_verify.properties", ("rs_verify.properties", "rs_verify.contract", "rs_verify.harness", "rs_verify.strategies",
                              "rs_verify")),
    ("rs_verify.triton_sampler", ("rs_verify.triton_sampler", "rs_verify.contract", "rs_verify.harness.device",
                                  "rs_verify")),
]


def _allowed(target: str, allowed) -> bool:
    return any(target == a or (a != "rs_verify" and target.startswith(a + ".")) for a in allowed)


@pytest.mark.parametrize("layer, allowed", WALLS)
def test_walls_between_layers(layer, allowed):
    """The contract imports nothing else; the oracle and the strategies only the contract; properties
    no concrete sampler; the Triton sampler never the reference (the oracle and the system under test
    stay independent)."""
    for module in (m for m in MODULES if m == layer or m.startswith(layer + ".")):
        bad = [t for t in _all_imports(module) if not _allowed(t, allowed)]
        assert not bad, f"{module} imports {bad} (allowed: {allowed})"


def test_one_top_level_import_name():
    """The wheel installs one top-level package, `rs_verify`: every package folder of the product is
    listed in pyproject.toml, the oracle and the strategies under `rs_verify.` through package-dir."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    assert all(p == "rs_verify" or p.startswith("rs_verify.") for p in listed), listed
    assert setup["package-dir"] == {name: folder for folder, name in INSTALLED_AS.items()}
    folders = {m for m, p in MODULES.items() if p.name == "__init__.py" and not m.startswith("mutants")}
    assert folders == listed, f"package folders {sorted(folders - listed)} not listed; listed but absent: " \
                              f"{sorted(listed - folders)}"


def test_function_local_imports_say_why():
    """A function-local import exists only to keep something light, and says so (`lazy:`). An import in
    a module-level `try` (a fallback package on an older Python) is a top-level import."""
    offenders = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        top = {id(n) for n in tree.body}
        for block in (n for n in tree.body if isinstance(n, ast.Try)):
            top |= {id(n) for n in block.body + [x for h in block.handlers for x in h.body]}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                window = " ".join(lines[max(0, node.lineno - 3): node.end_lineno])
                if "lazy" not in window and "noqa" not in window:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, "function-local imports without a `lazy:` reason: " + ", ".join(offenders)


def test_modules_stay_short():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    long = {n: k for n, k in long.items() if k > MAX_LINES and n not in DATA_TABLES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_plugin_and_contract_import_neither_torch_nor_triton():
    code = ("import sys, rs_verify, rs_verify.frontends.plugin, rs_verify.frontends.cli; "
            "heavy = [m for m in ('torch', 'triton') if m in sys.modules]; print(heavy); sys.exit(bool(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_one_module_decides_the_backend():
    setters = [str(p.relative_to(ROOT)) for p in MODULES.values()
               if 'environ["TRITON_INTERPRET"]' in p.read_text() or "environ.setdefault(\"TRITON_INTERPRET\"" in p.read_text()]
    assert setters == ["rs_verify/harness/device.py"], setters


def test_only_the_record_reads_a_samplers_declarations():
    """`rs_verify.harness.record.record_of` is the one reader of a sampler's attributes (SPEC section
    10): elsewhere a declaration is read from a `SamplerRecord`, never from a sampler (`x.sampler.
    memory_stats`, `getattr(sampler, "draft_modes", ...)`). The samplers themselves are exempt."""
    from dataclasses import fields

    from rs_verify.harness.record import SamplerRecord

    declared = {f.name for f in fields(SamplerRecord)} - {"name", "loaded_as", "interpreted_why", "has_unvalidated"}
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith("rs_verify.") or name == "rs_verify.harness.record" \
                or name.startswith(("rs_verify.triton_sampler", "rs_verify.adapters")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in declared:
                base = ast.unparse(node.value).lower()
                if "sampler" in base and "record" not in base:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in declared:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "read through rs_verify.harness.record.record_of instead: " + ", ".join(offenders)
