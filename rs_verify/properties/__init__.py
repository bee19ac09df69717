"""The property library. Importing this package registers every property."""

from . import bad_input, certification, distribution, edges, equivalence, invariants, memory, planner, streams  # noqa: F401  (registration)
from .base import PROPERTIES, Context, Property, PropertyFailure

__all__ = ["PROPERTIES", "Context", "Property", "PropertyFailure"]
