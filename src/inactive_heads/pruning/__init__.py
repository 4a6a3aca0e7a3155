"""Static pruning: choose heads from a calibration, remove them from the model, save it, and measure what it costs."""

from .checkpoint import load_pruned, require_new_directory, save_pruned
from .mask import HeadInactivity, head_inactivity, static_mask
from .surgery import prune_heads, pruned_mask

__all__ = [
    "HeadInactivity",
    "head_inactivity",
    "load_pruned",
    "prune_heads",
    "pruned_mask",
    "require_new_directory",
    "save_pruned",
    "static_mask",
]
