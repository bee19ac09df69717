"""Eager checks of the keyword arguments ("knobs") of the batch strategies.

Hypothesis's convention: a strategy validates its arguments when it is built and
raises `InvalidArgument` naming the argument. Imports only Hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

INT64_MAX = 2**63 - 1


def check_int(name, value, lo):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if value < lo:
        raise InvalidArgument(f"{name}={value!r} must be >= {lo}")


def check_bool(name, value):
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be a bool")


def check_choices(name, values, allowed) -> tuple:
    """`values` as a tuple without repeats; each must be one of `allowed`."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise InvalidArgument(f"{name}={values!r} must be a sequence drawn from {allowed}")
    values = tuple(values)
    if not values:
        raise InvalidArgument(f"{name} must not be empty")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InvalidArgument(f"{name}: unknown values {bad}; expected some of {allowed}")
    return tuple(dict.fromkeys(values))


def check_strategy(name, value):
    if value is not None and not isinstance(value, st.SearchStrategy):
        raise InvalidArgument(f"{name}={value!r} must be None or a SearchStrategy")


def check_ints(name, values, lo) -> tuple:
    """A non-empty sequence of ints `>= lo`, as a sorted tuple without repeats."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise InvalidArgument(f"{name}={values!r} must be a non-empty sequence of ints")
    for v in values:
        check_int(f"{name} entry", v, lo)
    return tuple(sorted({int(v) for v in values}))


def vocab_strategy(vocab_sizes, default) -> st.SearchStrategy[int]:
    """The vocab-size strategy: `default` when `vocab_sizes` is None, the strategy itself,
    or `sampled_from` a non-empty sequence of ints `>= 1`."""
    if vocab_sizes is None:
        return default
    if isinstance(vocab_sizes, st.SearchStrategy):
        return vocab_sizes
    if isinstance(vocab_sizes, (str, bytes)) or not isinstance(vocab_sizes, Sequence) or not vocab_sizes:
        raise InvalidArgument(f"vocab_sizes={vocab_sizes!r} must be a strategy or a non-empty sequence")
    for v in vocab_sizes:
        check_int("vocab_sizes entry", v, 1)
    return st.sampled_from(tuple(vocab_sizes))


def drawn_vocab(value) -> int:
    """A vocab size drawn from a user strategy, checked."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgument(f"vocab_sizes drew {value!r}; expected an int >= 1")
    return int(value)


def drawn_int64(value, name, lo) -> int:
    """A seed or position drawn from a user strategy, checked against `[lo, 2**63 - 1]`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= INT64_MAX:
        raise InvalidArgument(f"{name} drew {value!r}; expected an int in [{lo}, 2**63 - 1]")
    return int(value)


def rare(draw, n: int = 4) -> bool:
    """True about once in `n` draws; shrinks to False."""
    return draw(st.integers(0, n - 1)) == n - 1
