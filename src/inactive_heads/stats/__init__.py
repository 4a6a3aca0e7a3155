"""Statistics over recorded scores and per-item answers: curves and Table 2, thresholds, bootstrap, overlap, distances.

Computation only: no figures, no files. The package namespace (also ``inactive_heads.analysis``) holds the curve and
distance functions; the bootstrap, overlap and threshold functions are in their modules.
"""

from .curves import (
    TABLE2_TOLERANCE,
    Curve,
    Table2Row,
    common_fraction_range,
    max_zeroed_within,
    normalized_auc,
    rank_scores,
    spearman,
    table2,
    top_k_iou,
    within_tolerance,
    zero_frequency,
)
from .distances import depth_bins, wasserstein1, wasserstein_table

__all__ = [
    "TABLE2_TOLERANCE",
    "Curve",
    "Table2Row",
    "common_fraction_range",
    "depth_bins",
    "max_zeroed_within",
    "normalized_auc",
    "rank_scores",
    "spearman",
    "table2",
    "top_k_iou",
    "wasserstein1",
    "wasserstein_table",
    "within_tolerance",
    "zero_frequency",
]
