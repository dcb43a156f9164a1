"""Synthetic LRA data, deterministic by seed, written in the release's layout so the readers in ``data`` load it.

- :func:`generate_listops`: the LRA ListOps algorithm (``lra_benchmarks/data/listops.py``), re-implemented on a
  local ``random.Random(seed)``; writes ``listops-1000/basic_{train,val,test}.tsv``.
- :func:`generate_pathfinder`: a contour-integration generator in the spirit of ``drewlinsley/pathfinder``
  (``snakes2.py``): two target contours of ``contour_length`` paddles, short distractor contours, single-paddle
  clutter and two circular markers; writes ``pathfinder{size}/curv_*/{imgs/<k>/sample_<i>.png, metadata/<k>.npy}``.

Nothing here touches global random state.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

PathLike = Union[str, "os.PathLike[str]"]

# ================================================================================================== ListOps

LISTOPS_OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")  # LRA: FIRST and LAST are defined but unused
LISTOPS_END = "]"
LISTOPS_VALUE_P = 0.25  # a node above max depth becomes an operator when U(0,1) <= VALUE_P, else a digit


class _TooLong(Exception):
    """Raised inside tree generation once a tree cannot satisfy ``length < max_length`` any more."""


def _listops_tree(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: list[int]):
    """One random ListOps (sub)tree -> ``(source string, value, length)``.

    ``length`` counts tokens without parentheses (operator + arguments + ``]``), like LRA's ``generate_tree``.
    ``budget[0]`` is how many more tokens the whole tree may take; generation stops early (``_TooLong``) when
    it is exhausted, which leaves the distribution of accepted trees unchanged (length only grows).
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > LISTOPS_VALUE_P:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLong
        v = rng.randrange(10)
        return str(v), v, 1
    budget[0] -= 2
    if budget[0] < 0:
        raise _TooLong
    n_args = rng.randint(2, max_args)
    strs, vals, length = [], [], 2
    for _ in range(n_args):
        s, v, n = _listops_tree(rng, depth + 1, max_depth, max_args, budget)
        strs.append(s)
        vals.append(v)
        length += n
    op = LISTOPS_OPERATORS[rng.randrange(len(LISTOPS_OPERATORS))]
    # LRA nests pairs: ((((op, v0), v1), ...), END), printed as "( a b )" for every pair.
    source = "( " * (n_args + 1) + op + " " + strs[0] + " )" + "".join(" " + s + " )" for s in strs[1:]) + " ] )"
    return source, listops_value(op, vals), length


def listops_value(op: str, args: list[int]) -> int:
    """LRA's evaluation: MIN, MAX, MED = ``int(median)`` (mean of the middle two, truncated), SM = sum % 10."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s = sorted(args)
        m = len(s) // 2
        return s[m] if len(s) % 2 else int((s[m - 1] + s[m]) / 2)
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {LISTOPS_OPERATORS}")


def _listops_max_length(max_depth: int, max_args: int) -> int:
    """The longest tree the grammar can produce (root at depth 1, leaves forced at max_depth)."""
    n = 1
    for _ in range(max_depth - 1):
        n = 2 + max_args * n
        if n > 10**9:
            break
    return n


def generate_listops_examples(n: int, *, seed: int, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
                              max_length: int = 2000, max_tries: Optional[int] = None) -> list[tuple[str, int]]:
    """``n`` distinct ``(source, target)`` pairs with ``min_length < length < max_length`` (LRA's strict bounds)."""
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got max_depth={max_depth}, max_args={max_args}")
    if max_length - min_length < 2:
        raise ValueError(f"no length satisfies {min_length} < length < {max_length}: widen the bounds")
    if min_length + 1 > _listops_max_length(max_depth, max_args):
        raise ValueError(f"max_depth={max_depth}, max_args={max_args} cannot reach length > {min_length}")
    rng = random.Random(seed)
    max_tries = max_tries if max_tries is not None else 20_000 * n + 100_000
    seen: dict[str, int] = {}  # insertion-ordered: deterministic, unlike LRA's set
    tries = 0
    while len(seen) < n:
        tries += 1
        if tries > max_tries:
            raise RuntimeError(f"ListOps: only {len(seen)} of {n} distinct trees with {min_length} < length < "
                               f"{max_length} after {max_tries} draws; widen the bounds or raise max_depth")
        budget = [max_length - 1]  # accept length <= max_length - 1
        try:
            source, value, length = _listops_tree(rng, 1, max_depth, max_args, budget)
        except _TooLong:
            continue
        if min_length < length < max_length and source not in seen:
            seen[source] = value
    return list(seen.items())


def write_listops_tsv(path: PathLike, rows: list[tuple[str, int]]) -> None:
    """``Source\\tTarget`` header then one row per example (``csv.writer``, as LRA's ``write_to_file``)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["Source", "Target"])
        w.writerows(rows)


def generate_listops(out_dir: PathLike, *, n_train: int, n_val: int, n_test: int, seed: int, max_depth: int = 10,
                     max_args: int = 10, min_length: int = 500, max_length: int = 2000,
                     task: str = "basic") -> dict[str, Path]:
    """Write ``out_dir/listops-1000/{task}_{train,val,test}.tsv``; returns the three paths by split.

    LRA's defaults are 96,000 / 2,000 / 2,000 examples with 500 < length < 2000. Trees are distinct across all
    splits; the first ``n_train`` go to train, the next ``n_val`` to val, the rest to test.
    """
    for name, v in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    rows = generate_listops_examples(n_train + n_val + n_test, seed=seed, max_depth=max_depth, max_args=max_args,
                                     min_length=min_length, max_length=max_length)
    d = Path(out_dir) / "listops-1000"
    d.mkdir(parents=True, exist_ok=True)
    parts = {"train": rows[:n_train], "val": rows[n_train:n_train + n_val], "test": rows[n_train + n_val:]}
    paths = {}
    for split, part in parts.items():
        paths[split] = d / f"{task}_{split}.tsv"
        write_listops_tsv(paths[split], part)
    return paths


# =============================================================================================== Pathfinder


@dataclass(frozen=True)
class PathfinderParams:
    """Geometry of one Pathfinder image, in pixels of the output image (``size`` x ``size``).

    Defaults are LRA's 32x32 settings (``data/pathfinder.py::Pathfinder32``): paddles of length 2 separated by
    ``2 * paddle_margin`` (the gap where a contour may bend), thickness 0.5, contrast 2 x 0.75, marker radius 1.5,
    seeds 7 px apart, continuity 1.0 (bends up to 90 degrees, cos^2-weighted), ``contour_length // 3``-paddle
    distractors, ``20 // distractor_length`` of them, then single-paddle clutter. Orientations live on a lattice
    of ``angle_step_deg``; ``clearance`` (default ``1.5 * paddle_margin``) is the least distance between the centre
    lines of different contours.
    """

    size: int = 32
    contour_length: int = 14
    paddle_length: float = 2.0
    paddle_margin: float = 1.0
    paddle_thickness: float = 0.5
    contrast: float = 1.5
    marker_radius: float = 1.5
    seed_distance: float = 7.0
    continuity: float = 1.0
    padding: float = 1.0
    distractor_length: Optional[int] = None  # default max(1, contour_length // 3)
    num_distractor_snakes: Optional[int] = None  # default distractor_budget // distractor_length
    distractor_budget: int = 20
    single_paddles: int = 150  # placement attempts for single-paddle clutter (0: none)
    clearance: Optional[float] = None
    antialias_scale: int = 4
    angle_step_deg: float = 10.0

    def __post_init__(self) -> None:
        if self.size < 8 or self.contour_length < 1:
            raise ValueError(f"need size >= 8 and contour_length >= 1, got size={self.size}, "
                             f"contour_length={self.contour_length}")
        if min(self.paddle_length, self.paddle_margin, self.paddle_thickness, self.marker_radius) <= 0:
            raise ValueError("paddle_length, paddle_margin, paddle_thickness and marker_radius must be > 0")
        steps = 360.0 / self.angle_step_deg
        if abs(steps - round(steps)) > 1e-9 or self.angle_step_deg > 90:
            raise ValueError(f"angle_step_deg must divide 360 and be <= 90, got {self.angle_step_deg}")

    @property
    def n_distractor_paddles(self) -> int:
        return self.distractor_length if self.distractor_length is not None else max(1, self.contour_length // 3)

    @property
    def n_distractors(self) -> int:
        if self.num_distractor_snakes is not None:
            return self.num_distractor_snakes
        return self.distractor_budget // self.n_distractor_paddles

    @property
    def min_gap(self) -> float:
        return self.clearance if self.clearance is not None else 1.5 * self.paddle_margin


#: Per-resolution defaults after LRA's builder docstrings (paddle length 5 where the original used its default).
PATHFINDER_PRESETS = {
    32: dict(),
    64: dict(size=64, paddle_length=5.0, paddle_margin=1.0, paddle_thickness=1.0, contrast=0.8, marker_radius=2.5,
             seed_distance=12.0, continuity=1.8, distractor_budget=22),
    128: dict(size=128, paddle_length=5.0, paddle_margin=2.5, paddle_thickness=1.5, contrast=0.9, marker_radius=3.0,
              seed_distance=20.0, continuity=1.8, distractor_budget=35),
}


@dataclass
class PathfinderSample:
    """One generated image and the record of how it was drawn.

    ``contours[j]`` is the centre line of contour ``j`` as a polyline ``[n_vertices, 2]`` (x, y) in image pixels:
    ``tail_0, head_0, pivot_1, tail_1, head_1, ...`` -- paddles are ``tail_i -> head_i``, the rest is the gap.
    Contours 0 and 1 are the targets; the markers sit on ``marker_contours`` (the same contour twice iff label
    1): marker 0 on the first tail of one target, marker 1 on the last head of the same or the other one.
    """

    image: np.ndarray  # [size, size] uint8
    label: int
    contours: list[np.ndarray] = field(repr=False)
    kinds: list[str] = field(repr=False)  # "target" | "distractor" | "paddle"
    markers: np.ndarray = field(repr=False)  # [2, 2] (x, y) of the two marker centres
    marker_contours: tuple[int, int] = (0, 0)


FREE, SHARED, WALL = -1, -2, -3  # cell owners besides contour ids
NOBODY = -100  # asks ``free`` about a contour that owns nothing yet
_STEP = 0.5  # px between the sample points that stand for a centre line when checking room


def _linspace(length: float, first: bool = True) -> np.ndarray:
    s = np.linspace(0.0, length, max(2, int(math.ceil(length / _STEP)) + 1))
    return s if first else s[1:]


class _Geometry:
    """Everything about a growth step that does not depend on where the contour is, precomputed per params.

    Occupancy is tracked on cells of ``1/res`` px, in a flat array with a border so that offsets never wrap.
    For every orientation ``a`` (lattice index) and candidate bend ``k`` it holds the sample points of the gap
    and the next paddle (float offsets from the current head and their cell offsets) and the "tube" of cells
    within ``min_gap`` of them, so one step is a handful of array lookups.
    """

    def __init__(self, p: PathfinderParams, res: int = 4):
        self.p, self.res = p, res
        self._disks: dict[float, np.ndarray] = {}
        self.na = na = int(round(360.0 / p.angle_step_deg))
        ang = np.arange(na) * (2 * math.pi / na)
        self.dirs = np.stack([np.cos(ang), np.sin(ang)], axis=1)  # [A, 2]
        kmax = int(math.floor(90.0 / p.angle_step_deg + 1e-9))
        turns = np.arange(-kmax, kmax + 1)
        w = np.cos(np.minimum(np.abs(np.deg2rad(turns * p.angle_step_deg)) * p.continuity, math.pi / 2)) ** 2
        self.turns, self.weights = turns[w > 1e-9], w[w > 1e-9]  # [K] lattice steps, cos^2(continuity * bend)
        m, L, gap = p.paddle_margin, p.paddle_length, p.min_gap
        self.n = p.size * res
        reach = L + 2 * m + p.marker_radius + gap + 1.0
        self.border = int(math.ceil(reach * res))
        self.width = self.n + 2 * self.border
        s_gap, s_new, s_seed = _linspace(m, first=False), _linspace(m + L), _linspace(L)
        K = len(self.turns)
        self.new_a = (np.arange(na)[:, None] + self.turns[None, :]) % na  # [A, K]
        d = self.dirs[:, None, :]  # [A, 1, 2]
        u = self.dirs[self.new_a]  # [A, K, 2]
        self.pivot_off = m * self.dirs  # [A, 2]
        self.tail_off = m * d + m * u  # [A, K, 2]
        self.head_off = m * d + (m + L) * u  # [A, K, 2]
        gap_pts = np.broadcast_to(s_gap[None, None, :, None] * d[:, :, None, :], (na, K, len(s_gap), 2))
        new_pts = m * d[:, :, None, :] + s_new[None, None, :, None] * u[:, :, None, :]
        self.pts_off = np.concatenate([gap_pts, new_pts], axis=2)  # [A, K, P, 2]
        self.pts_cells = self.cell_offsets(self.pts_off)  # [A, K, P]
        self.tubes = [[self.tube(np.concatenate([[[0.0, 0.0]], self.pts_off[a, k]]), gap) for k in range(K)]
                      for a in range(na)]
        seed = s_seed[None, :, None] * self.dirs[:, None, :]  # [A, P0, 2] from the tail
        self.seed_cells = self.cell_offsets(seed)  # [A, P0]
        # a target's last head carries a marker: its disk must be clear, its halo is claimed
        head_cells = self.cell_offsets(self.head_off)  # [A, K]
        self.end_disk = head_cells[..., None] + self.disk(p.marker_radius)  # [A, K, D]
        self.end_halo = head_cells[..., None] + self.disk(p.marker_radius + gap)  # [A, K, H]
        self.seed_tubes = [self.tube(seed[a], gap) for a in range(na)]

    def cell_offsets(self, off: np.ndarray) -> np.ndarray:
        """Float offsets (px) from a point at a cell centre -> flat cell offsets."""
        c = np.floor(0.5 + off * self.res).astype(np.int64)
        return c[..., 1] * self.width + c[..., 0]

    def tube(self, pts: np.ndarray, radius: float) -> np.ndarray:
        """Flat offsets of the cells whose centres lie within ``radius`` of the polyline ``pts [V, 2]``."""
        r = self.res
        lo = np.floor((pts.min(axis=0) - radius) * r).astype(int) - 1
        hi = np.ceil((pts.max(axis=0) + radius) * r).astype(int) + 1
        dx, dy = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1))
        cx, cy = dx / r, dy / r  # cell centres relative to the anchor
        d2 = (cx - pts[0, 0]) ** 2 + (cy - pts[0, 1]) ** 2
        for a, b in zip(pts[:-1], pts[1:]):
            ux, uy = b - a
            den = ux * ux + uy * uy
            if den == 0:
                continue
            t = np.clip(((cx - a[0]) * ux + (cy - a[1]) * uy) / den, 0.0, 1.0)
            d2 = np.minimum(d2, (cx - a[0] - t * ux) ** 2 + (cy - a[1] - t * uy) ** 2)
        keep = d2 <= radius * radius
        return dy[keep] * self.width + dx[keep]

    def disk(self, radius: float) -> np.ndarray:
        if radius not in self._disks:
            self._disks[radius] = self.tube(np.zeros((1, 2)), radius)
        return self._disks[radius]


_GEOMETRY_CACHE: dict[PathfinderParams, _Geometry] = {}


def _geometry(p: PathfinderParams) -> _Geometry:
    if p not in _GEOMETRY_CACHE:
        if len(_GEOMETRY_CACHE) > 16:
            _GEOMETRY_CACHE.clear()
        _GEOMETRY_CACHE[p] = _Geometry(p)
    return _GEOMETRY_CACHE[p]


class _Canvas:
    """Who owns each cell: a contour id (with the oldest of its paddles there), ``FREE``, ``SHARED`` or ``WALL``.

    Drawing a piece of contour claims the cells within ``min_gap`` of it; a cell claimed by two contours becomes
    ``SHARED``; cells whose centres lie outside the padded frame are ``WALL``. A new paddle may only cross free
    cells and cells of its own previous paddle, so contours stay in the frame, different contours (and
    non-adjacent parts of one) keep about ``min_gap`` apart and never touch. Every stamp is logged, so
    ``restore(snapshot())`` undoes later ones cheaply.
    """

    def __init__(self, g: _Geometry):
        self.g = g
        w = g.width
        centre = (np.arange(w) - g.border + 0.5) / g.res  # [W] cell centres in px
        out = (centre < g.p.padding) | (centre > g.p.size - g.p.padding)
        self.owner = np.where(out[:, None] | out[None, :], WALL, FREE).astype(np.int16).ravel()  # [W*W]
        self.step = np.zeros(w * w, dtype=np.int16)  # [W*W]
        self.lo, self.hi = g.p.padding, g.p.size - g.p.padding
        self._log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def base(self, xy: np.ndarray) -> int:
        g = self.g
        return (int(xy[1] * g.res) + g.border) * g.width + int(xy[0] * g.res) + g.border

    def snapshot(self) -> int:
        return len(self._log)

    def restore(self, snap: int) -> None:
        while len(self._log) > snap:
            cells, own, stp = self._log.pop()
            self.owner[cells] = own
            self.step[cells] = stp

    def free(self, cells: np.ndarray, cid: int, paddle: int) -> np.ndarray:
        """``cells [K, P]`` -> ``[K]``: every cell free or owned by paddle >= ``paddle - 1`` of ``cid``."""
        own = self.owner[cells]
        return ((own == FREE) | ((own == cid) & (self.step[cells] >= paddle - 1))).all(axis=-1)

    def stamp(self, cells: np.ndarray, cid: int, paddle: int) -> None:
        """Claim ``cells`` (distinct flat indices) for paddle ``paddle`` of contour ``cid``."""
        own, stp = self.owner[cells], self.step[cells]
        self._log.append((cells, own, stp))
        new = own == FREE
        self.owner[cells] = np.where(new | (own == cid), cid, np.where(own == WALL, WALL, SHARED))
        self.step[cells] = np.where(new, paddle, np.minimum(stp, paddle))  # the oldest paddle of this contour

    def owners_near(self, xy: np.ndarray, radius: float) -> set[int]:
        """Owners (contour ids or ``SHARED``) of the cells within ``radius`` of the point ``xy``."""
        return set(np.unique(self.owner[self.base(xy) + self.g.disk(radius)]).tolist()) - {FREE}

    def inside(self, pts: np.ndarray) -> np.ndarray:
        """``pts [K, P, 2]`` (or ``[K, 2]`` bounds) all within the padded frame -> ``[K]``."""
        return ((pts >= self.lo) & (pts <= self.hi)).reshape(len(pts), -1).all(axis=1)


class _Snake:
    """A contour grown paddle by paddle (see :class:`PathfinderSample` for the vertex layout)."""

    def __init__(self, cid: int, tail: np.ndarray, a: int, g: _Geometry):
        self.cid, self.g, self.a0, self.a = cid, g, a, a
        self.verts = [tail, tail + g.p.paddle_length * g.dirs[a]]
        self.n = 1

    @property
    def tail(self) -> np.ndarray:
        return self.verts[0]

    @property
    def head(self) -> np.ndarray:
        return self.verts[-1]

    def seed_ok(self, canvas: _Canvas) -> bool:
        if not canvas.inside(np.stack(self.verts[:2])[None])[0]:
            return False
        return bool(canvas.free((canvas.base(self.tail) + self.g.seed_cells[self.a0])[None], self.cid, 0)[0])

    def stamp_seed(self, canvas: _Canvas) -> None:
        canvas.stamp(canvas.base(self.tail) + self.g.seed_tubes[self.a0], self.cid, 0)

    def extend(self, canvas: _Canvas, rng: np.random.Generator, marker: bool = False) -> bool:
        """Add one paddle, bending in the gap by a cos^2(continuity * bend)-weighted lattice angle among the
        candidates that stay in the frame and off other contours. ``marker``: the new head will carry a marker,
        so no other contour may come within ``marker_radius + min_gap`` of it (now or later)."""
        g, a, head = self.g, self.a, self.verts[-1]
        base = canvas.base(head)
        ok = canvas.free(base + g.pts_cells[a], self.cid, self.n)  # [K] (walls keep it in the frame)
        if marker:
            own = canvas.owner[base + g.end_disk[a]]  # [K, D]
            ok &= ((own == FREE) | (own == WALL) | (own == self.cid)).all(axis=1)
        cdf = np.cumsum(np.where(ok, g.weights, 0.0))  # [K]
        if cdf[-1] <= 0:
            return False
        j = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
        self.verts += [head + g.pivot_off[a], head + g.tail_off[a, j], head + g.head_off[a, j]]
        self.a = int(g.new_a[a, j])
        canvas.stamp(base + g.tubes[a][j], self.cid, self.n)
        if marker:
            canvas.stamp(base + g.end_halo[a, j], self.cid, self.n)
        self.n += 1
        return True

    def state(self):
        return (len(self.verts), self.a, self.n)

    def set_state(self, state) -> None:
        nv, self.a, self.n = state
        del self.verts[nv:]

    def polyline(self) -> np.ndarray:
        return np.stack(self.verts)  # [V, 2]

    def paddles(self) -> np.ndarray:
        v = self.polyline()
        return np.stack([v[0::3], v[1::3]], axis=1)  # [n_paddles, 2 (tail, head), 2]


def _grow(snakes: list[_Snake], length: int, canvas: _Canvas, rng: np.random.Generator,
          max_backtracks: int = 60, markers: bool = False) -> bool:
    """Grow all ``snakes`` to ``length`` paddles, one paddle each per round (``markers``: room for a marker
    at every last head).

    A round that dead-ends (no free bend for some snake) is undone together with 0-2 earlier rounds and
    redrawn; after ``max_backtracks`` such undos the attempt fails (the caller starts over).
    """
    history = []  # state at the start of every round: (canvas snapshot, snake states)
    backtracks = 0
    while snakes[0].n < length:
        history.append((canvas.snapshot(), [sn.state() for sn in snakes]))
        last = markers and snakes[0].n == length - 1
        if all(sn.extend(canvas, rng, last) for sn in snakes):
            continue
        backtracks += 1
        if backtracks > max_backtracks:
            return False
        back = min(len(history), int(rng.integers(1, 4)))
        snap, states = history[-back]
        del history[-back:]
        canvas.restore(snap)
        for sn, st in zip(snakes, states):
            sn.set_state(st)
    return True


def _targets(rng: np.random.Generator, g: _Geometry, max_tries: int = 500):
    """Two target contours seeded ``seed_distance`` apart near the centre, with room for markers at all 4 ends."""
    p = g.p
    halo = g.disk(p.marker_radius + p.min_gap)
    for _ in range(max_tries):
        canvas = _Canvas(g)
        lo, hi = 2 * p.seed_distance, p.size - 2 * p.seed_distance
        if hi <= lo:
            lo, hi = p.size / 2 - 1, p.size / 2 + 1
        t0 = rng.uniform(lo, hi, size=2)
        phi = rng.uniform(-math.pi, math.pi)
        t1 = t0 + p.seed_distance * np.array([math.cos(phi), math.sin(phi)])
        a = _Snake(0, t0, int(rng.integers(g.na)), g)
        b = _Snake(1, t1, int(rng.integers(g.na)), g)
        if not canvas.inside(np.stack([t0, t1])[None])[0]:
            continue
        # marker halos around both origin tips, owned by their contour's first paddle
        canvas.stamp(canvas.base(t0) + halo, 0, 0)
        canvas.stamp(canvas.base(t1) + halo, 1, 0)
        if not (a.seed_ok(canvas) and b.seed_ok(canvas)):
            continue
        a.stamp_seed(canvas)
        b.stamp_seed(canvas)
        if p.contour_length == 1:  # the seeds are the whole contours: their heads need marker room too
            if canvas.owners_near(a.head, p.marker_radius) - {0, WALL} or \
                    canvas.owners_near(b.head, p.marker_radius) - {1, WALL}:
                continue
            canvas.stamp(canvas.base(a.head) + halo, 0, 1)
            canvas.stamp(canvas.base(b.head) + halo, 1, 1)
        elif not _grow([a, b], p.contour_length, canvas, rng, markers=True):
            continue
        return canvas, [a, b]
    raise RuntimeError(f"Pathfinder: could not place two contours of {p.contour_length} paddles in "
                       f"{max_tries} tries; shorten contour_length, enlarge size or check seed_distance")


def _place_distractors(canvas: _Canvas, snakes: list[_Snake], kinds: list[str], rng: np.random.Generator) -> None:
    """Short distractor contours, then single-paddle clutter; whatever does not fit is left out."""
    g, p = canvas.g, canvas.g.p
    for _ in range(p.n_distractors):
        for _attempt in range(5):
            s = None
            for _try in range(20):
                cand = _Snake(len(snakes), rng.uniform(p.padding, p.size - p.padding, size=2),
                              int(rng.integers(g.na)), g)
                if cand.seed_ok(canvas):
                    s = cand
                    break
            if s is None:
                break
            snap = canvas.snapshot()
            s.stamp_seed(canvas)
            if _grow([s], p.n_distractor_paddles, canvas, rng, max_backtracks=5):
                snakes.append(s)
                kinds.append("distractor")
                break
            canvas.restore(snap)
    if p.single_paddles > 0:
        k = p.single_paddles
        tails = rng.uniform(p.padding, p.size - p.padding, size=(k, 2))  # [k, 2]
        a = rng.integers(g.na, size=k)  # [k]
        heads = tails + p.paddle_length * g.dirs[a]
        base = ((tails[:, 1] * g.res).astype(np.int64) + g.border) * g.width \
            + (tails[:, 0] * g.res).astype(np.int64) + g.border  # [k]
        ok = canvas.inside(np.stack([tails, heads], axis=1)) & canvas.free(base[:, None] + g.seed_cells[a], NOBODY, 0)
        for i in np.flatnonzero(ok):
            s = _Snake(len(snakes), tails[i], int(a[i]), g)
            if s.seed_ok(canvas):  # still free after the ones just placed
                s.stamp_seed(canvas)
                snakes.append(s)
                kinds.append("paddle")


def _render(p: PathfinderParams, snakes: list[_Snake], markers: np.ndarray) -> np.ndarray:
    """Anti-aliased grey image ``[size, size]`` uint8: paddles drawn at ``contrast`` (the pixel mean is clipped
    to 1, so a thin paddle at contrast 1.5 reads about 0.75), markers at 1 on top."""
    from PIL import Image, ImageDraw

    s = p.antialias_scale
    n = p.size * s
    im = Image.new("F", (n, n), 0.0)
    draw = ImageDraw.Draw(im)
    width = max(1, int(round(p.paddle_thickness * s)))
    ink = float(p.contrast)  # may exceed 1: the anti-aliased mean is clipped afterwards
    for sn in snakes:
        for tail, head in sn.paddles() * s:
            draw.line([(tail[0], tail[1]), (head[0], head[1])], fill=ink, width=width)
    r = p.marker_radius * s
    for x, y in markers * s:
        draw.ellipse([x - r, y - r, x + r, y + r], fill=1.0)
    a = np.asarray(im, dtype=np.float32).reshape(p.size, s, p.size, s).mean(axis=(1, 3))  # [size, size]
    return np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8)


def sample_pathfinder(rng: np.random.Generator, params: PathfinderParams, label: int) -> PathfinderSample:
    """Draw one image with the given ``label`` (1: both markers on the ends of one target contour).

    The contours are drawn first and the markers chosen last, so nothing but the markers depends on the label.
    """
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    g = _geometry(params)
    canvas, targets = _targets(rng, g)
    snakes, kinds = list(targets), ["target", "target"]
    _place_distractors(canvas, snakes, kinds, rng)
    first = int(rng.integers(2))
    second = first if label == 1 else 1 - first
    markers = np.stack([targets[first].tail, targets[second].head])  # [2, 2]
    image = _render(params, snakes, markers)
    return PathfinderSample(image=image, label=label, contours=[s.polyline() for s in snakes], kinds=kinds,
                            markers=markers, marker_contours=(first, second))


def pathfinder_dirname(contour_length: int) -> str:
    """6 -> ``curv_baseline``, else ``curv_contour_length_<L>`` (the release's directory names)."""
    return "curv_baseline" if contour_length == 6 else f"curv_contour_length_{contour_length}"


def pathfinder_params(size: int = 32, contour_length: int = 14, **overrides) -> PathfinderParams:
    """``PATHFINDER_PRESETS[size]`` (if any) with ``contour_length`` and ``overrides`` applied."""
    base = dict(PATHFINDER_PRESETS.get(size, {}))
    base.update(overrides)
    base.update(size=size, contour_length=contour_length)
    return PathfinderParams(**base)


def generate_pathfinder(out_dir: PathLike, *, n: int, seed: int, contour_length: int = 14, size: int = 32,
                        images_per_dir: int = 1000, **params) -> Path:
    """Write ``n`` images (labels exactly balanced per directory) to ``out_dir/pathfinder{size}/<dirname>``.

    Layout as the release: ``imgs/<k>/sample_<i>.png`` (grey, ``size`` x ``size``) and ``metadata/<k>.npy``, a
    TEXT file with one line per image: ``imgs/<k> sample_<i>.png <i> <label> <continuity> <contour_length>
    <distractor_length> <paddle_length> <paddle_thickness> <paddle_margin> 1`` (the columns of the original
    ``snakes2.accumulate_meta``). Directory ``k`` draws from its own stream ``SeedSequence([seed, k])``, so the
    output depends only on the arguments. ``params`` override :class:`PathfinderParams` fields. Returns the
    ``curv_*`` directory.
    """
    from PIL import Image

    if n < 1 or images_per_dir < 1:
        raise ValueError(f"need n >= 1 and images_per_dir >= 1, got n={n}, images_per_dir={images_per_dir}")
    p = pathfinder_params(size, contour_length, **params)
    root = Path(out_dir) / f"pathfinder{size}" / pathfinder_dirname(contour_length)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, n, images_per_dir)):
        count = min(images_per_dir, n - start)
        rng = np.random.default_rng(np.random.SeedSequence([seed, k]))
        labels = rng.permutation(np.arange(count) % 2)  # balanced within every directory
        sub = f"imgs/{k}"
        (root / sub).mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(count):
            smp = sample_pathfinder(rng, p, int(labels[i]))
            fname = f"sample_{i}.png"
            Image.fromarray(smp.image, mode="L").save(root / sub / fname)
            lines.append(f"{sub} {fname} {i} {smp.label} {p.continuity:g} {p.contour_length} "
                         f"{p.n_distractor_paddles} {p.paddle_length:g} {p.paddle_thickness:g} "
                         f"{p.paddle_margin:g} 1\n")
        (root / "metadata" / f"{k}.npy").write_text("".join(lines))
    return root
