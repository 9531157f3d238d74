"""budget."""

from ctxlock.budget._compaction import CompactionPlan, apply_compaction
from ctxlock.budget._fit import BudgetPolicy, Fitted, fit_context

__all__ = [
    "BudgetPolicy",
    "CompactionPlan",
    "Fitted",
    "apply_compaction",
    "fit_context",
]
