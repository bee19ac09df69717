"""The property library. Importing this package registers every property (see `registry`)."""

from . import bad_input, certification, distribution, edges, equivalence, invariants, memory, planner, streams  # noqa: F401  (registration)
from .registry import NEEDS, PROPERTIES, Context, Property, PropertyFailure, by_cost

__all__ = ["NEEDS", "PROPERTIES", "Context", "Property", "PropertyFailure", "by_cost"]
