"""Exceptions tpflare raises (all subclass TpflareError)."""
from __future__ import annotations

from .config import ConfigError  # noqa: F401  (re-exported)


class TpflareError(RuntimeError):
    """Base class of tpflare's runtime errors."""


class KnobMismatchError(TpflareError):
    """Ranks were prepared with different decision knobs."""


class PreparationError(TpflareError):
    """A preparation-time step failed (on this rank or another), or timed out."""


class NoValidComposition(PreparationError):
    """Every composition of a selection race failed its holdout validation (an agreed result:
    raised on every rank of the group at the same step)."""


class StaleWeightError(TpflareError):
    """A weight a rewrite depends on was changed in place after compile."""
