"""A release's dependencies, resolved from its wheel's own metadata: no catalogue entry needed.

pip's resolver answers without installing anything: `pip install --dry-run --ignore-installed
--report FILE name==version` pins the whole tree in JSON (each package's name, version and
`Requires-Dist`). The gate installs all of it beside the wheel with `--no-deps`, except

- what the environment provides: torch, triton and numpy always (the gate runs on the environment's
  own; torch's companion builds, torchvision and the like, are built against one torch and are left
  out with it), any other distribution that ships a `triton` (a fork would shadow the real one), and
  every package the environment already has installed (pytest, rich, Hypothesis and what they
  import keep the versions the gate itself runs on: the release's site directory comes first on
  the gate's `PYTHONPATH`);
- the CUDA-only packages (`nvidia-*`, `cuda-*`, `nccl*`, `cupy*`) and every package that requires
  one of them unconditionally: none of them imports on a machine without a GPU driver.

The pins come back in resolution order; `Resolution.left_out` says why each omitted package was
left out, and the gate records both in its table's metadata so that a run can be repeated
(`catalogue.toml` in `--out` is a catalogue of the resolved pins).
"""

from __future__ import annotations

import json
import re
from importlib import metadata
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROVIDED = ("torch", "triton", "numpy")
CUDA_PREFIXES = ("nvidia-", "cuda-", "nccl", "cupy")
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Resolution:
    name: str  # the release's distribution name as its metadata spells it
    version: str
    pins: tuple[str, ...] = ()  # "pkg==1.2", to install --no-deps beside the wheel
    left_out: dict = field(default_factory=dict)  # pkg -> why it is not installed
    error: str | None = None


def canonical(name: str) -> str:
    """PEP 503's normalised name: `Keras_Hub`, `keras.hub` and `keras-hub` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _unconditional(requires: list[str] | None) -> list[str]:
    """The names a package requires whatever extras are asked for (an `extra ==` marker is left out)."""
    out = []
    for req in requires or ():
        marker = req.split(";", 1)[1] if ";" in req else ""
        m = REQUIREMENT_NAME.match(req)
        if m and "extra" not in marker:
            out.append(canonical(m.group(1)))
    return out


def environment() -> frozenset[str]:
    """The canonical names of the distributions installed in this interpreter's environment."""
    return frozenset(canonical(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"])


def why_left_out(name: str, provided: frozenset[str] = frozenset()) -> str | None:
    """Why a package is not installed beside a release (None: it is), from its name and what the
    environment has (`provided`)."""
    n = canonical(name)
    if n in PROVIDED or n in provided:
        return "provided by the environment"
    if n.startswith("torch") or n.startswith("pytorch-"):
        return "built against one torch: the environment's torch is used"
    if "triton" in n:
        return "ships a triton, which would shadow the environment's"
    if n.startswith(CUDA_PREFIXES):
        return "CUDA-only"
    return None


def select(report: dict, release: str, provided: frozenset[str] | None = None) -> Resolution:
    """The pins of a pip `--report` (its `install` list) for the release named `release`;
    `provided`: what the environment has (default: this interpreter's, `environment()`)."""
    provided = environment() if provided is None else provided
    items = [(canonical(i["metadata"]["name"]), i["metadata"]) for i in report.get("install", [])]
    own = next((meta for n, meta in items if n == canonical(release)), None)
    if own is None:
        return Resolution(release, "", error=f"pip's resolution does not contain {release}")
    left = {n: why for n, _ in items if n != canonical(release) and (why := why_left_out(n, provided))}
    changed = True
    while changed:  # a package that requires a CUDA-only one is CUDA-only too
        changed = False
        for n, meta in items:
            if n in left or n == canonical(release):
                continue
            cuda = [d for d in _unconditional(meta.get("requires_dist")) if left.get(d, "").startswith("CUDA-only")]
            if cuda:
                left[n], changed = f"CUDA-only (requires {cuda[0]})", True
    pins = tuple(f"{meta['name']}=={meta['version']}" for n, meta in items if n not in left and n != canonical(release))
    return Resolution(own["name"], own["version"], pins, {n: left[n] for n, _ in items if n in left})


def resolve(requirement: str, *, find_links: str | None = None, no_index: bool = False,
            timeout: float = 900.0) -> Resolution:
    """Resolve `requirement` (`vllm==0.32.0`, `vllm`, or a wheel's path) with pip's resolver, without
    installing; `error` says why pip could not."""
    release = requirement
    if requirement.endswith(".whl"):
        release = Path(requirement).name.split("-", 1)[0]
    else:
        release = REQUIREMENT_NAME.match(requirement).group(1)
    source = (["--no-index"] if no_index else []) + (["--find-links", str(find_links)] if find_links else [])
    with tempfile.TemporaryDirectory(prefix="rs-verify-resolve-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(out), *source, requirement]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Resolution(release, "", error=f"pip's resolver did not finish within {timeout:g} s")
        if proc.returncode != 0 or not out.is_file():
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
            errors = [ln for ln in lines if "ERROR" in ln]
            return Resolution(release, "", error=(errors or lines or [f"pip exited {proc.returncode}"])[-1].strip())
        return select(json.loads(out.read_text()), release)
