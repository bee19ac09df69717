"""Declared deviations (SPEC section 11): one `Deviation` record per known departure from SPEC
sections 4 and 4b, and their registry.

A production sampler can carry a known defect for months. Declared, the reference applies the
sampler's rule instead of the SPEC's at the one place the defect lives, so every other decision
is still certified bit for bit and the output rules hold the sampler to the declared rule. A
record (modelled on `rs_verify.contract.streams.StreamFamily`: one constructor call, checked when
built) holds:

- `name`, the SPEC `section` whose clause it replaces and that clause (`replaces`);
- `rules`: `{edge: rule}`, the NumPy function the reference applies at each *edge* it covers. The
  edges are the places the reference can apply a rule, each with its own signature and with how
  certification decides it (`EDGES`):
  - `"empty_residual"`: the residual of a rejection (SPEC 4 or 4b) has no positive mass.
    `rule(logp)`: float64 `[n, V']` log-probabilities of the rows -> float64 `[n, V']`, the log
    weights (unnormalised, `-inf` for none) sampled instead of SPEC's fallback `p`. Whether the
    residual is empty is decided in float32, as the sampler sees it, and certified with the margin
    of the residual's float64 mass (SPEC 8). How the sampler sees it is the record's `empty_view`
    (`EMPTY_VIEWS`): `"probabilities"` (the default: a residual of float32 probabilities,
    `residual_empty32`) or `"log"` (a residual kept in float32 log space, `residual_empty_log32`,
    where probabilities below float32's range still count).
  - `"inverse_cdf_top"`: an inverse-CDF resample (SPEC 4) where no prefix sum of the float32
    residual exceeds `U * S` (float32 rounding with `U` near 1; `inverse_cdf_unfound32`).
    `rule(logr, u)`: float64 `[n, V']` log residual and `U` `[n]` -> int64 `[n]` tokens. Certified
    with the normalised distance of `U` from the top, `1 - U`, against SPEC 8's inverse-CDF tolerance.
  - `"block_prefix"`: a block step (SPEC 4b) where `log P_{i-1} + log p_{j_i}(d_i) - log q_i(d_i)`
    is NaN (`-inf` minus `-inf`). `rule(prev, log_pd, log_qd)`: float64 `[n]` each -> float64 `[n]`,
    `log P_i` there (SPEC: `-inf`). Exact: the NaN comes from `-inf` logits, never a near-tie.
- `doc`: one line for the report;
- `empty_view`: the float32 view in which the sampler decides that a residual is empty (above).
  `record.viewed(view)` is the same deviation, same name, seen in another view: a sampler declares
  it as that record (or its `module:attribute` path); the shipped records take the default view.

`deviation(which)` looks a record up (a registered name, a `module:attribute` path of a record, or
the record itself; a clear `KeyError` otherwise); `register(record)` adds one; the shipped ones are
`rs_verify.contract.known_deviations`, imported by the package's `__init__`. `Applied` is the set a
sampler declares, as the reference and the output rules read it: at most one rule per edge, and
one record per name (a shipped record named beside a variant of it in another view yields to the
variant: the sampler's own declaration).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from .records import Registry, module_path

__all__ = ["Applied", "DEVIATIONS", "EDGES", "EMPTY_VIEWS", "Deviation", "Edge", "applied", "deviation",
           "deviation_path", "inverse_cdf_unfound32", "register", "registered", "residual_empty32",
           "residual_empty_log32", "shipped"]


@dataclass(frozen=True)
class Edge:
    """A place where the reference can apply a deviation's rule, and how certification decides it."""

    name: str
    where: str  # the SPEC clause whose outcome the rule replaces
    signature: str
    decided: str  # how the reference decides that the edge is reached, and the decision's margin


EDGES = {e.name: e for e in (
    Edge("empty_residual", "SPEC 4 and 4b: a residual with no positive mass falls back to p",
         "rule(logp: float64 [n, V']) -> float64 [n, V'] log weights sampled instead of p",
         "emptiness in float32, as the sampler sees it; margin: the residual's float64 mass (within eps)"),
    Edge("inverse_cdf_top", "SPEC 4: the smallest x with r(x) > 0 and S_x > U * S",
         "rule(logr: float64 [n, V'], u: float64 [n]) -> int64 [n] tokens",
         "float32 prefix sums; margin: 1 - U (within SPEC 8's inverse-CDF tolerance)"),
    Edge("block_prefix", "SPEC 4b: log P_i = -inf when p(d_i) = 0 or P_{i-1} = 0",
         "rule(prev, log_pd, log_qd: float64 [n]) -> float64 [n] log P_i where their sum is NaN",
         "exact: the sum is NaN only for -inf log-probabilities, never a near-tie"),
    Edge("tree_bonus", "SPEC 4c: a path that ends on an accepted node emits the bonus from p_n",
         "rule(logp: float64 [n, V'], raw: float64 [n, V']) -> float64 [n, V'] log weights sampled instead of p_n",
         "the node's raw target logits; its argmax is certified as any bonus"),
    Edge("tree_siblings", "SPEC 4c: one coin per node, S_k over the first k distinct siblings' tokens",
         "rule(p: float64 [V'], tokens: int64 [c]) -> float64 [c] the bounds S_k",
         "the coin's distance to the rule's nearer bound, as SPEC 4c's"),
)}

# The float32 views in which a sampler decides that a residual is empty (the `"empty_residual"` edge).
EMPTY_VIEWS = {
    "probabilities": "float32(P p) > float32(q) nowhere (a residual of float32 probabilities: vLLM V1, LMDeploy)",
    "log": "float32 exp(log q - (log P + log p)) < 1 nowhere (a residual kept in float32 log space: vLLM MRV2)",
}


@dataclass(frozen=True)
class Deviation:
    """One declared deviation (see the module docstring); checked when built. `rules` may be given
    as a dict; it is kept as a tuple of `(edge, rule)` pairs in `EDGES` order."""

    name: str
    section: str
    replaces: str
    rules: tuple
    doc: str = field(default="", compare=False)
    empty_view: str = "probabilities"

    def __post_init__(self):
        who = f"deviation {self.name!r}"
        if not isinstance(self.name, str) or not self.name or ":" in self.name or "," in self.name:
            raise ValueError(f"{who}: the name must be a non-empty string without ':' or ','")
        if not isinstance(self.section, str) or not self.section.startswith("4"):
            raise ValueError(f"{who}: section must name the SPEC section whose clause it replaces ('4', '4b', '4c'), "
                             f"not {self.section!r}")
        if not isinstance(self.replaces, str) or not self.replaces.strip():
            raise ValueError(f"{who}: replaces must quote the SPEC clause the deviation replaces")
        rules = dict(self.rules) if isinstance(self.rules, (dict, tuple, list)) else None
        if not rules or not set(rules) <= set(EDGES):
            raise ValueError(f"{who}: rules must map some of the edges {list(EDGES)} to NumPy functions, "
                             f"not {self.rules!r}")
        for edge, fn in rules.items():
            if not callable(fn):
                raise ValueError(f"{who}: the rule at {edge!r} must be a function: {EDGES[edge].signature}")
        object.__setattr__(self, "rules", tuple((e, rules[e]) for e in EDGES if e in rules))
        if self.empty_view not in EMPTY_VIEWS or (self.empty_view != "probabilities" and "empty_residual" not in rules):
            raise ValueError(f"{who}: empty_view must be one of {list(EMPTY_VIEWS)}, and a view other than the "
                             f"default needs a rule at 'empty_residual', not {self.empty_view!r}")
        self.check()

    def rule(self, edge: str) -> Callable | None:
        return dict(self.rules).get(edge)

    @property
    def edges(self) -> tuple[str, ...]:
        return tuple(e for e, _ in self.rules)

    def describe(self) -> str:
        view = "" if self.empty_view == "probabilities" else f"; empty residuals in float32 {self.empty_view} space"
        return f"{self.name} (SPEC section 11; replaces section {self.section}: {self.replaces}{view})"

    def viewed(self, view: str) -> "Deviation":
        """This deviation, same name and rules, with emptiness decided in the float32 `view` (EMPTY_VIEWS)."""
        return replace(self, empty_view=view)

    def residual_empty32(self, scaled_p, q, logp, logq, draft=None, log_scale=None) -> np.ndarray:
        """bool `[n]`: whether each residual is empty in this record's float32 view (`residual_empty32`
        on the probabilities `scaled_p = P p` and `q`, or `residual_empty_log32` on `log p`, `log q`
        and `log P`; `q`, `logq` None: one-hot drafts, `draft` `[n]` rejected)."""
        if self.empty_view == "log":
            return residual_empty_log32(logp, logq, draft, log_scale)
        return residual_empty32(scaled_p, q, draft)

    def check(self) -> None:
        """Each rule answers in its edge's shapes and dtypes on a small input; `ValueError` otherwise."""
        who = f"deviation {self.name!r}"
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.log(np.array([[0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 1.0, 0.0]]))
            for edge, fn in self.rules:
                if edge == "empty_residual":
                    out = np.asarray(fn(logp.copy()))
                    ok = out.shape == logp.shape and out.dtype == np.float64 and (out > -np.inf).any(axis=1).all()
                elif edge == "tree_bonus":
                    out = np.asarray(fn(logp.copy(), np.log(np.array([[1.0, 2.0, 3.0, 4.0]] * 2))))
                    ok = out.shape == logp.shape and out.dtype == np.float64 and (out > -np.inf).any(axis=1).all()
                elif edge == "tree_siblings":
                    out = np.asarray(fn(np.exp(logp[0]), np.array([0, 1, 0], np.int64)))
                    ok = out.shape == (3,) and out.dtype == np.float64 and (np.diff(out) >= 0).all()
                elif edge == "inverse_cdf_top":
                    out = np.asarray(fn(logp.copy(), np.array([0.999999, 0.5])))
                    ok = out.shape == (2,) and out.dtype.kind == "i" and ((out >= 0) & (out < 4)).all()
                else:
                    out = np.asarray(fn(np.array([0.0, -np.inf]), np.array([-np.inf, -1.0]), np.array([-np.inf, -np.inf])))
                    ok = out.shape == (2,) and out.dtype == np.float64 and not np.isnan(out).any() and (out <= 0).all()
                if not ok:
                    raise ValueError(f"{who}: the rule at {edge!r} must be {EDGES[edge].signature}; got "
                                     f"{getattr(out, 'dtype', '?')} {getattr(out, 'shape', '?')} {out!r}")


def _unknown(which, known) -> str:
    return (f"unknown deviation {which!r}: the shipped deviations are {known} (SPEC section 11); another is "
            "declared as a Deviation record or its module:attribute path")


DEVIATIONS = Registry(Deviation, "deviation", _unknown)


def register(record: Deviation) -> Deviation:
    """Add `record` to the registry; a name taken by another record raises."""
    return DEVIATIONS.register(record)


def shipped() -> list[Deviation]:
    return DEVIATIONS.shipped()


def registered(record: Deviation) -> bool:
    return DEVIATIONS.registered(record)


def deviation(which) -> Deviation:
    """The record of `which`: a registered name, a `module:attribute` path of a record, or a record."""
    return DEVIATIONS.lookup(which)


def deviation_path(record: Deviation) -> str | None:
    """The `module:attribute` of a module-level attribute holding an unregistered record (how it
    crosses a process boundary), searched first in the modules of its rules (`records.module_path`)."""
    return module_path(record, (fn for _, fn in record.rules))


class Applied:
    """The deviations a sampler declares, as the reference and the output rules read them: the
    record ruling each edge (`at(edge)`), at most one per edge."""

    def __init__(self, declared: Iterable = ()):
        by_name: dict[str, Deviation] = {}
        for rec in map(deviation, declared):
            have = by_name.setdefault(rec.name, rec)
            if have == rec or registered(rec):  # a shipped record yields to a variant of it (another view)
                continue
            if not registered(have):
                raise ValueError(f"two records named {rec.name!r} are declared ({have.empty_view!r} and "
                                 f"{rec.empty_view!r} views): declare one of them")
            by_name[rec.name] = rec
        self.records = tuple(sorted(by_name.values(), key=lambda d: d.name))
        self._by_edge: dict[str, Deviation] = {}
        for rec in self.records:
            for edge in rec.edges:
                other = self._by_edge.setdefault(edge, rec)
                if other is not rec:
                    raise ValueError(f"deviations {other.name!r} and {rec.name!r} both rule the edge {edge!r}: "
                                     "declare one of them")

    def at(self, edge: str) -> Deviation | None:
        return self._by_edge.get(edge)

    def __bool__(self) -> bool:
        return bool(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.records)

    def __eq__(self, other) -> bool:
        return isinstance(other, Applied) and self.records == other.records

    def __hash__(self) -> int:
        return hash(self.records)

    def __repr__(self) -> str:
        return f"Applied({list(self.names)})"


NONE = Applied()


def applied(declared) -> Applied:
    """`declared` (an `Applied`, None, or an iterable of names, paths and records) as an `Applied`."""
    if isinstance(declared, Applied):
        return declared
    return NONE if not declared else Applied(declared)


def residual_empty32(scaled_p: np.ndarray, q: np.ndarray | None, draft: np.ndarray | None = None) -> np.ndarray:
    """bool `[n]`: whether the residual has no positive mass in float32, as a float32 sampler sees it
    (SPEC 11): model drafts `float32(P p) > float32(q)` nowhere (`scaled_p` float64 `[n, V']` is
    `P p`, `P = 1` token by token); one-hot drafts (`q` None) `float32(p) > 0` nowhere but at the
    rejected `draft` `[n]`."""
    p32 = np.asarray(scaled_p, np.float64).astype(np.float32)
    if q is None:
        pos = p32 > 0
        pos[np.arange(pos.shape[0]), np.asarray(draft, np.int64)] = False
        return ~pos.any(axis=1)
    return ~(p32 > np.asarray(q, np.float64).astype(np.float32)).any(axis=1)


def residual_empty_log32(logp: np.ndarray, logq: np.ndarray | None, draft: np.ndarray | None = None,
                         log_scale: np.ndarray | None = None) -> np.ndarray:
    """bool `[n]`: whether the residual has no positive mass in float32 log space, as a sampler that
    keeps it there sees it (SPEC 11; vLLM MRV2's resample kernel: `log r = log P p + log1p(-ratio)`
    where `ratio = exp(log q - log P p) < 1`, `-inf` elsewhere). Model drafts: the float32 `ratio`
    is `< 1` nowhere, with `log P p = float32(log p) + float32(log P)` in float32 (`log_scale` `[n]`
    is `log P`, None for `P = 1`) and NaN (`-inf` both) not `< 1`; so probabilities below float32's
    range still count. One-hot drafts (`logq` None): `log p > -inf` nowhere but at the rejected
    `draft` `[n]` (`P` cancels). `logp`, `logq`: float64 `[n, V']` without underflow."""
    lp = np.asarray(logp, np.float64).astype(np.float32)
    if logq is None:
        pos = lp > -np.inf
        pos[np.arange(pos.shape[0]), np.asarray(draft, np.int64)] = False
        return ~pos.any(axis=1)
    if log_scale is not None:
        lp = lp + np.asarray(log_scale, np.float64).astype(np.float32).reshape(-1, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(np.asarray(logq, np.float64).astype(np.float32) - lp)
    return ~(ratio < 1).any(axis=1)


def inverse_cdf_unfound32(logr: np.ndarray, u: np.ndarray) -> np.ndarray:
    """bool `[n]`: no float32 prefix sum of the residual `exp(logr)` (float64 `[n, V']`) exceeds
    `float32(U) * S` (SPEC 4's inverse CDF as a float32 sampler sums it, left to right)."""
    r32 = np.exp(np.asarray(logr, np.float64)).astype(np.float32)
    s32 = np.cumsum(r32, axis=1, dtype=np.float32)
    thr = np.asarray(u, np.float64).astype(np.float32) * s32[:, -1]
    return ~(s32 > thr[:, None]).any(axis=1)
