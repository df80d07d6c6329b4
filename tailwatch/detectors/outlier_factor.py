"""Local outlier factor in novelty mode: the anomaly detector's default model.

The same model as scikit-learn's `LocalOutlierFactor(novelty=True)` (Breunig et al. 2000:
how much sparser a row's neighbourhood is than its neighbours' own), scored the same way
(`score_samples`: minus the mean ratio of the neighbours' local reachability density to
the row's), over the same neighbours: scipy's `cKDTree` gives the same exact Euclidean
distances as scikit-learn's KD-tree (`tests/test_detectors.py` checks the scores against
scikit-learn's). It is a few lines of our own because of what the library costs where
this runs, measured on a day of the Mooncake trace: scikit-learn's `score_samples` spends
about 0.5 ms a call in input validation and parallel dispatch for the handful of slices
scored each minute (half of the detector stage), and importing scikit-learn (scipy.stats
underneath) costs about 0.75 CPU-seconds more than scipy.spatial alone, 10% of that day's
replay. scikit-learn remains the `isolation_forest` model and the test's oracle.

Neighbours are found as scikit-learn finds them (`algorithm="auto"`): by brute force over
few rows, through a KD-tree over many. A model fitted on one model's four hours (a few
hundred rows, the common case) then never imports scipy.spatial, which cost 0.24 to 0.39
CPU-seconds of a Mooncake day's replay (5 to 7%) for a search numpy does in microseconds.
The brute-force distances are summed in the KD-tree's order, so both give the same scores.
"""

from __future__ import annotations

import numpy as np


# Above this many training rows the neighbours come from a KD-tree: a brute-force fit costs
# rows² (measured: 1.6 ms at 240 rows, 6.6 at 500, 25 at 1,000; the tree's 1, 6 and 7).
BRUTE_FORCE_MAX_ROWS = 512
_BRUTE_FORCE_CELLS = 1 << 20  # query rows × training rows per chunk (8 MiB of distances)


def _brute_force_nearest(queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k nearest rows, nearest first, ties by row: squares summed feature by
    feature in the order the KD-tree sums them, so the distances are the same to the bit."""
    d = np.zeros((len(queries), len(rows)))
    for f in range(rows.shape[1]):
        diff = np.subtract.outer(queries[:, f], rows[:, f])
        diff *= diff
        d += diff
    np.sqrt(d, out=d)
    near = np.argpartition(d, k - 1, axis=1)[:, :k] if k < len(rows) else np.tile(np.arange(len(rows)), (len(d), 1))
    # Indexed by (row, column) arrays: what take_along_axis does, without its checks (this
    # runs each minute for the few slices scored).
    each = np.arange(len(d))[:, None]
    near_d = d[each, near]
    order = np.lexsort((near, near_d), axis=1)
    return near_d[each, order], near[each, order]


class LocalOutlierFactor:
    """Fitted on the rows of normal slice-minutes; `score_samples` is lower for odder rows
    and grows without bound with the distance from them (see `anomaly.fit_model`)."""

    def __init__(self, n_neighbors: int = 20):
        self.n_neighbors = n_neighbors

    def fit(self, rows: np.ndarray) -> LocalOutlierFactor:
        fitted = np.asarray(rows, dtype=np.float64)
        self.k_ = max(1, min(self.n_neighbors, len(fitted) - 1))
        if len(fitted) <= BRUTE_FORCE_MAX_ROWS:
            self.tree_, self.rows_ = None, fitted
        else:
            from scipy.spatial import cKDTree  # imported on first large fit, off the loop

            self.tree_ = cKDTree(fitted)
        dist, ind = self._nearest(fitted, self.k_ + 1)
        # Each row is not its own neighbour; with more duplicates than neighbours the row
        # may not be among its k + 1, and then the nearest is dropped (as scikit-learn does).
        keep = ind != np.arange(len(fitted))[:, None]
        keep[keep.all(axis=1), 0] = False
        dist = dist[keep].reshape(len(fitted), self.k_)
        ind = ind[keep].reshape(len(fitted), self.k_)
        self.k_distance_ = dist[:, -1]
        self.lrd_ = self._reachability_density(dist, ind)
        return self

    def _nearest(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Distances and indices of each query's k nearest training rows, nearest first."""
        if self.tree_ is not None:
            dist, ind = self.tree_.query(queries, k=k)
            if k == 1:  # cKDTree drops the neighbour axis for k=1
                dist, ind = dist[:, None], ind[:, None]
            return dist, ind
        step = max(1, _BRUTE_FORCE_CELLS // len(self.rows_))
        if len(queries) <= step:  # the minute's few slices: one chunk, nothing to join
            return _brute_force_nearest(queries, self.rows_, k)
        chunks = [_brute_force_nearest(queries[i:i + step], self.rows_, k) for i in range(0, len(queries), step)]
        return np.concatenate([d for d, _ in chunks]), np.concatenate([n for _, n in chunks])

    def _reachability_density(self, dist: np.ndarray, ind: np.ndarray) -> np.ndarray:
        reach = np.maximum(dist, self.k_distance_[ind])
        return 1.0 / (reach.mean(axis=1) + 1e-10)

    def score_samples(self, rows: np.ndarray) -> np.ndarray:
        dist, ind = self._nearest(np.asarray(rows, dtype=np.float64), self.k_)
        return -(self.lrd_[ind] / self._reachability_density(dist, ind)[:, None]).mean(axis=1)
