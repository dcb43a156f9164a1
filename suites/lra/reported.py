"""Published LRA numbers, as data with their source. Shown by ``attnbench table lra`` as separate, labelled rows.

These are *reported* numbers from papers, never measurements: they are not in the results store and never
share a table (or a column) with measured rows. Each :class:`ReportedTable` names its paper, table and setting.

NaLaFormer Table 14 ("Full LRA", A = accuracy %, T = training throughput, M = peak memory MB), transcribed from
the double-blind review version of "Norm×Direction: Restoring the Missing Query Norm in Vision Linear Attention"
(NaLaFormer; Meng et al., arXiv 2506.21137, Appendix, Table 14). The paper gives no LRA configuration; its
Softmax and Skyformer rows equal Skyformer's own published numbers (Chen et al., NeurIPS 2021), and its column set
(Text 4k, ListOps 2k, Retrieval 4k, Pathfinder 1k, Image 1k) is Skyformer's, so the setting is the Skyformer
PyTorch setting (the ``skyformer`` preset). Throughput units ("TGS") and the GPU are not stated in the paper.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder")


@dataclasses.dataclass(frozen=True)
class ReportedRow:
    method: str  # as printed in the paper
    attention: Optional[str]  # the attnbench registry name, None if attnbench has no such mechanism
    accuracy: dict[str, float]  # task -> accuracy in %
    throughput: dict[str, float] = dataclasses.field(default_factory=dict)  # task -> "T" as printed
    memory_mb: dict[str, float] = dataclasses.field(default_factory=dict)  # task -> "M" (MB) as printed
    avg: Optional[float] = None  # the paper's printed average accuracy


@dataclasses.dataclass(frozen=True)
class ReportedTable:
    label: str  # how the rows are labelled wherever they are shown
    setting: str  # the attnbench setting these numbers belong to (for comparison only, never mixed)
    source: str
    rows: tuple[ReportedRow, ...]
    notes: str = ""


def _row(method, attention, acc, t, m, avg):
    keys = ("image", "pathfinder", "listops", "text", "retrieval")  # Table 14's row order
    return ReportedRow(method, attention, dict(zip(keys, acc)), dict(zip(keys, t)), dict(zip(keys, m)), avg)


#: NaLaFormer Table 14 (columns Img 1k, Path 1k, List 2k, Text 4k, Retri 4k in the paper).
NALAFORMER_TABLE14 = ReportedTable(
    label="reported (NaLaFormer Table 14, Skyformer setting)",
    setting="lra/skyformer",
    source="Meng et al., 'Norm×Direction: Restoring the Missing Query Norm in Vision Linear Attention' "
           "(NaLaFormer), arXiv 2506.21137, review version, Table 14 'Full LRA'",
    rows=(
        _row("Softmax", "softmax", (39.14, 70.39, 38.71, 61.55, 80.93), (736.36, 691.67, 402.06, 252.06, 116.30),
             (9645, 4831, 4473, 17122, 8947), 58.14),
        _row("Kernelized", None, (32.63, 69.86, 38.46, 60.02, 82.11), (862.32, 811.59, 496.48, 327.27, 144.83),
             (13013, 6515, 6084, 11720, 10699), 56.62),
        _row("Nystrom", "nystromformer", (38.94, 69.34, 37.95, 62.36, 80.89),
             (1251.28, 1125.08, 834.85, 1330.68, 496.48), (5941, 2980, 1186, 2043, 2011), 57.90),
        _row("Linformer", "linformer", (38.43, 65.39, 36.44, 57.29, 77.85), (1613.19, 1057.03, 528.52, 970.90, 424.18),
             (3471, 1745, 881, 1742, 1649), 55.08),
        _row("Informer", None, (37.86, 56.44, 37.05, 62.13, 79.35), (85.85, 299.94, 305.53, 521.16, 142.94),
             (5357, 2687, 2737, 5736, 3399), 54.57),
        _row("Skyformer", "skyformer", (40.77, 70.73, 38.69, 64.7, 82.06), (923.04, 748.98, 627.14, 949.80, 348.60),
             (8091, 4055, 1712, 3082, 2987), 59.39),
        _row("PoLaFormer", "polaformer", (42.15, 70.53, 37.35, 73.06, 80.5), (1340.89, 1065.63, 949.80, 876.74, 344.93),
             (4505, 2286, 1151, 1155, 1139), 60.72),
        _row("NaLaFormer", "nala", (42.54, 71.31, 38.21, 73.48, 80.42), (1314.03, 1292.93, 802.51, 521.49, 207.29),
             (4211, 2107, 2520, 2102, 2079), 61.19),
    ),
    notes="Accuracy in %. 'Kernelized' and 'Informer' have no attnbench mechanism. Throughput units and GPU are "
          "not given in the paper; the Softmax and Skyformer rows repeat Skyformer's own published numbers.",
)

REPORTED: tuple[ReportedTable, ...] = (NALAFORMER_TABLE14,)


def reported_for(setting: Optional[str] = None) -> list[ReportedTable]:
    """The reported tables (of ``setting`` if given)."""
    return [t for t in REPORTED if setting is None or t.setting == setting]
