"""Verification methods (SPEC sections 4, 4b and 4c): one `VerificationMethod` record per method.

PyTorch's OpInfo is the model: one constructor call per method, checked when it is built, and a
registry (`METHODS`, name -> record) that everything else reads. The batch contract validates
`SpecBatch.verification` against it; the sampler record checks `verification_methods` against it
and says what a sampler's declaration leaves unexercised; the context offers each declared method's
capability to the properties and the registry of properties explains it when missing; the gate's
summaries print its label; fixed and drawn batches are narrowed to the declared methods by one rule
(`narrow`).

Adding a method is one `VerificationMethod(...)` entry here, plus its rule in the reference
(`reference/`), the batches that exercise it (`strategies/`) and, where the Triton sampler offers
it, its kernel code.

This module imports nothing else of the project.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BASELINE", "BLOCK", "METHODS", "OFFERED", "TOKEN", "TREE", "UnknownMethod", "VerificationMethod",
           "declared", "lookup", "narrow"]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_SECTION = re.compile(r"[1-9][0-9]*[a-z]?\Z")


class UnknownMethod(LookupError):
    """A verification method the contract does not define (the message lists those it does)."""


@dataclass(frozen=True)
class VerificationMethod:
    """One verification method of the contract.

    `name` is the value of `SpecBatch.verification`; `section` the SPEC section that defines the
    method; `label` what the summaries print of it ("block verification"); `capability` the key of
    the context a property needs to run on batches verified this way (`None` for the baseline
    method, which every sampler verifies by and which needs nothing)."""

    name: str
    section: str
    label: str
    capability: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"verification method name {self.name!r}: a lowercase identifier, e.g. 'block'")
        who = f"verification method {self.name!r}"
        if not isinstance(self.section, str) or not _SECTION.match(self.section):
            raise ValueError(f"{who}: section {self.section!r} must name a SPEC section, e.g. '4b'")
        if not isinstance(self.label, str) or not self.label.strip() or self.label != self.label.strip():
            raise ValueError(f"{who}: label {self.label!r} must be a non-empty phrase, e.g. 'block verification'")
        if self.capability is not None and (not isinstance(self.capability, str) or not _NAME.match(self.capability)):
            raise ValueError(f"{who}: capability {self.capability!r} must be None or a lowercase identifier, "
                             f"e.g. '{self.name}_verification'")

    @property
    def baseline(self) -> bool:
        """Whether every sampler verifies by this method (it needs no capability)."""
        return self.capability is None

    @property
    def needs(self) -> tuple[str, ...]:
        """The capabilities a property needs to run on batches verified this way."""
        return () if self.capability is None else (self.capability,)

    @property
    def titled(self) -> str:
        """The label with its SPEC section, as the summaries print it."""
        return f"{self.label} (SPEC section {self.section})"

    @property
    def not_declared(self) -> str:
        """Why a property that needs this method's capability is skipped."""
        return f"the sampler does not declare {self.label} (verification_methods, SPEC section 10)"


def _registry(*methods: VerificationMethod) -> dict[str, VerificationMethod]:
    """`METHODS`, checked: unique names and capabilities, and the baseline method first and alone."""
    out: dict[str, VerificationMethod] = {}
    for m in methods:
        if not isinstance(m, VerificationMethod):
            raise TypeError(f"not a VerificationMethod: {m!r}")
        if m.name in out:
            raise ValueError(f"verification method {m.name!r} is registered twice")
        out[m.name] = m
    baselines = [m.name for m in methods if m.baseline]
    if not methods or baselines != [methods[0].name]:
        raise ValueError(f"exactly one verification method, the first, needs no capability; got {baselines}")
    capabilities = [m.capability for m in methods if m.capability is not None]
    if len(set(capabilities)) != len(capabilities):
        raise ValueError(f"two verification methods share a capability: {capabilities}")
    return out


TOKEN = VerificationMethod("token", section="4", label="token verification")
BLOCK = VerificationMethod("block", section="4b", label="block verification", capability="block_verification")
TREE = VerificationMethod("tree", section="4c", label="tree verification", capability="tree_verification")

METHODS = _registry(TOKEN, BLOCK, TREE)
BASELINE = next(iter(METHODS.values()))  # every sampler verifies by it (SPEC section 10's default)
OFFERED = tuple(m for m in METHODS.values() if not m.baseline)  # declared besides it, and reported


def lookup(name: str) -> VerificationMethod:
    """The record of method `name`; `UnknownMethod` for a name the contract does not define."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise UnknownMethod(f"unknown verification method {name!r}; the SPEC defines {list(METHODS)} "
                            "(rs_verify/contract/methods.py)") from None


def declared(names: Iterable[str]) -> tuple[str, ...]:
    """The methods among `names`, in the registry's order (a sampler's `verification_methods`)."""
    names = set(names)
    return tuple(m for m in METHODS if m in names)


def narrow(verification: str, names: Iterable[str]) -> str:
    """The method a batch verified by `verification` is sent with to a sampler declaring `names`:
    the same when declared, else the baseline method (SPEC section 10: a sampler that declares
    nothing is never sent a block batch)."""
    return verification if verification in set(names) else BASELINE.name
