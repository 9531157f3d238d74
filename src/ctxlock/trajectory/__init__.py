"""Token-in/token-out trajectories for multi-turn RL (docs/trajectories.md): the prompt's ids, each completion's ids
as the engine returned them, and for each new tool or user turn only the template's delta; per-token loss mask,
provenance and log-probs; and every fork from the canonical render of the whole conversation, named with its cause."""

from ctxlock.trajectory._build import MAX_STEPS, PARTS, Step, Trajectory, TrajectoryResult
from ctxlock.trajectory._forks import CAUSES, Fork
from ctxlock.trajectory._input import build_line, read_line

__all__ = [
    "CAUSES",
    "MAX_STEPS",
    "PARTS",
    "Fork",
    "Step",
    "Trajectory",
    "TrajectoryResult",
    "build_line",
    "read_line",
]
