"""The failure type of the property library."""

from __future__ import annotations

from ..contract.batch import SpecBatch


class PropertyFailure(AssertionError):
    """A property does not hold. Carries the batch (for bundles and replay) and details."""

    def __init__(self, message: str, *, batch: SpecBatch | None = None, details: dict | None = None):
        super().__init__(message)
        self.batch = batch
        self.details = details or {}
