"""Context budgets: fit a long chat into a token budget keeping whole turns (`fit_context`, `BudgetPolicy`), plan
a compaction (`plan_compaction`) and clamp the output cap to the window. Nothing is cut silently."""

from ctxlock.budget._compaction import CompactionPlan, apply_compaction
from ctxlock.budget._fit import BudgetPolicy, Fitted, fit_context

__all__ = [
    "BudgetPolicy",
    "CompactionPlan",
    "Fitted",
    "apply_compaction",
    "fit_context",
]
