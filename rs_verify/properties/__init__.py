"""The property library. Importing this package registers every property (see `registry`)."""

from . import bad_input, certification, distribution, edges, equivalence, invariants, memory, planner, streams  # noqa: F401  (registration)
from . import distribution_tree  # noqa: F401  (registration: the tree campaign, SPEC 4c)
from . import baseline  # noqa: F401  (registration; last: the regression gate's items run after the library's)
from .registry import NEEDS, PROPERTIES, Context, Property, PropertyFailure, by_cost

__all__ = ["NEEDS", "PROPERTIES", "Context", "Property", "PropertyFailure", "by_cost"]
