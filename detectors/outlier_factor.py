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
"""

from __future__ import annotations

import numpy as np


class LocalOutlierFactor:
    """Fitted on the rows of normal slice-minutes; `score_samples` is lower for odder rows
    and grows without bound with the distance from them (see `anomaly.fit_model`)."""

    def __init__(self, n_neighbors: int = 20):
        self.n_neighbors = n_neighbors

    def fit(self, rows: np.ndarray) -> LocalOutlierFactor:
        from scipy.spatial import cKDTree  # imported on first fit, off the loop

        fitted = np.asarray(rows, dtype=np.float64)
        self.k_ = max(1, min(self.n_neighbors, len(fitted) - 1))
        self.tree_ = cKDTree(fitted)
        dist, ind = self.tree_.query(fitted, k=self.k_ + 1)
        # Each row is not its own neighbour; with more duplicates than neighbours the row
        # may not be among its k + 1, and then the nearest is dropped (as scikit-learn does).
        keep = ind != np.arange(len(fitted))[:, None]
        keep[keep.all(axis=1), 0] = False
        dist = dist[keep].reshape(len(fitted), self.k_)
        ind = ind[keep].reshape(len(fitted), self.k_)
        self.k_distance_ = dist[:, -1]
        self.lrd_ = self._reachability_density(dist, ind)
        return self

    def _reachability_density(self, dist: np.ndarray, ind: np.ndarray) -> np.ndarray:
        reach = np.maximum(dist, self.k_distance_[ind])
        return 1.0 / (reach.mean(axis=1) + 1e-10)

    def score_samples(self, rows: np.ndarray) -> np.ndarray:
        dist, ind = self.tree_.query(np.asarray(rows, dtype=np.float64), k=self.k_)
        if self.k_ == 1:  # cKDTree drops the neighbour axis for k=1
            dist, ind = dist[:, None], ind[:, None]
        return -(self.lrd_[ind] / self._reachability_density(dist, ind)[:, None]).mean(axis=1)
