"""A release's dependencies, resolved from its wheel's own metadata: no catalogue entry needed.

The wheel is fetched (`pip download --no-deps`, kept in the cache's `downloads/`) or given, and
its `Requires-Dist` read (markers evaluated here, extras left out). Its direct requirements lose,
before anything is resolved,

- what the environment provides: torch, triton and numpy always (the gate runs on the environment's
  own; torch's companion builds, torchvision and the like, are built against one torch and are left
  out with it), any other distribution that ships a `triton` (a fork would shadow the real one), and
  every package the environment already has installed (pytest, rich, Hypothesis and what they
  import keep the versions the gate itself runs on: the release's site directory comes first on
  the gate's `PYTHONPATH`);
- the CUDA-only packages (`nvidia-*`, `cuda-*`, `nccl*`, `cupy*`).

pip's resolver pins the rest without installing anything (`pip install --dry-run
--ignore-installed --only-binary :all: --report FILE`: nothing is built, as a gate should not
compile a CUDA extension to learn its metadata); the same rules then leave out what it pulled in,
with every package that requires a CUDA-only one unconditionally. A direct requirement that has no
wheel for this machine, or whose own requirements have none, is left out with pip's reason and
the rest resolved again (`attempts` times at most). The pins come back in resolution order;
`Resolution.left_out` says why each omitted package was left out, and the gate records both in its
table's metadata so that a run can be repeated (`catalogue.toml` in `--out` is a catalogue of the
resolved pins).
"""

from __future__ import annotations

import email
import json
import re
import zipfile
from importlib import metadata
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

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
    wheel: str | None = None  # the release's wheel file, fetched or given


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


def select(report: dict, release: str, provided: frozenset[str] | None = None,
           left_out: dict | None = None) -> tuple[tuple[str, ...], dict]:
    """The pins of a pip `--report` (its `install` list) and why the rest is left out: the release
    itself is never a pin; `provided`: what the environment has (default: this interpreter's,
    `environment()`); `left_out`: what was left out before resolving."""
    provided = environment() if provided is None else provided
    items = [(canonical(i["metadata"]["name"]), i["metadata"]) for i in report.get("install", [])
             if canonical(i["metadata"]["name"]) != canonical(release)]
    left = {**(left_out or {}), **{n: why for n, _ in items if (why := why_left_out(n, provided))}}
    changed = True
    while changed:  # a package that requires a CUDA-only one is CUDA-only too
        changed = False
        for n, meta in items:
            if n in left:
                continue
            cuda = [d for d in _unconditional(meta.get("requires_dist")) if left.get(d, "").startswith("CUDA-only")]
            if cuda:
                left[n], changed = f"CUDA-only (requires {cuda[0]})", True
    return tuple(f"{meta['name']}=={meta['version']}" for n, meta in items if n not in left), left


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, its requirements that apply here) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = email.message_from_bytes(z.read(meta))
    needs = []
    for text in msg.get_all("Requires-Dist") or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            needs.append(str(req).split(";", 1)[0].strip())
    return msg["Name"], msg["Version"], needs


def _pip(args: list[str], timeout: float) -> tuple[int | None, str]:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"pip did not finish within {timeout:g} s"
    return proc.returncode, proc.stdout + proc.stderr


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and "WARNING" not in ln]
    errors = [ln for ln in lines if "ERROR" in ln]
    return (errors or lines or ["pip failed"])[-1]


def fetch(requirement: str, downloads: Path, source: list[str], timeout: float) -> tuple[Path | None, str]:
    """The wheel of `requirement` in `downloads` (fetched without its dependencies, or already there)."""
    downloads.mkdir(parents=True, exist_ok=True)
    code, out = _pip(["download", "--no-deps", "--only-binary", ":all:", "-d", str(downloads), *source, requirement],
                     timeout)
    if code != 0:
        return None, out if code is None else _last_error(out)
    found = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", out)
    return (Path(found[-1]), "") if found else (None, f"pip download named no wheel for {requirement}")


def _culprit(output: str, top: dict) -> str | None:
    """The direct requirement to leave out after a failed resolution: the one pip found no wheel for,
    or the direct requirement whose own requirement it was (`(from X==...)`)."""
    for m in re.finditer(r"(?:satisfies the requirement|No matching distribution found for) ([A-Za-z0-9._-]+)"
                         r"(?:[^\n(]*\(from ([A-Za-z0-9._-]+))?", output):
        for name in (m.group(1), m.group(2)):
            if name and canonical(name) in top:
                return canonical(name)
    for m in re.finditer(r"([A-Za-z0-9._-]+) [^\s]+ depends on", output):
        if canonical(m.group(1)) in top:
            return canonical(m.group(1))
    return None


def resolve(requirement: str, *, downloads: Path, find_links: str | None = None, no_index: bool = False,
            timeout: float = 900.0, attempts: int = 8, leave_out: dict | None = None) -> Resolution:
    """Resolve `requirement` (`vllm==0.32.0`, `vllm` for the newest, or a wheel's path) with pip's
    resolver, without installing (module docstring); `error` says why it could not. `leave_out`:
    direct requirements not to install, each with the reason (a catalogue's override)."""
    source = (["--no-index"] if no_index else []) + (["--find-links", str(find_links)] if find_links else [])
    wheel, why = (Path(requirement), "") if requirement.endswith(".whl") else fetch(requirement, downloads, source,
                                                                                    timeout)
    if wheel is None:
        return Resolution(REQUIREMENT_NAME.match(requirement).group(1), "", error=why)
    name, version, needs = wheel_metadata(wheel)
    provided = environment()
    top, left = {}, {}
    skip = {canonical(k): v for k, v in (leave_out or {}).items()}
    for need in needs:
        n = canonical(REQUIREMENT_NAME.match(need).group(1))
        why = skip.get(n) or why_left_out(n, provided)
        if why:
            left[n] = why
        else:
            top[n] = need
    with tempfile.TemporaryDirectory(prefix="rs-verify-resolve-") as tmp:
        out = Path(tmp) / "report.json"
        for _ in range(attempts):
            code, output = _pip(["install", "--dry-run", "--ignore-installed", "--only-binary", ":all:", "--quiet",
                                 "--report", str(out), *source, *top.values()], timeout) if top else (0, "")
            if code == 0:
                report = json.loads(out.read_text()) if top else {"install": []}
                pins, left = select(report, name, provided, left)
                return Resolution(name, version, pins, left, wheel=str(wheel))
            culprit = None if code is None else _culprit(output, top)
            if culprit is None:
                return Resolution(name, version, error=output if code is None else _last_error(output))
            left[culprit] = f"no wheel for this machine ({_last_error(output)})"
            del top[culprit]
    return Resolution(name, version, error=f"still unresolved after leaving out {attempts} requirements")
