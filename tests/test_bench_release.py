"""The pinned-release comparison's own logic (tools/bench_release.py): it refuses a checkout
that is not the pinned release, and reports every round with their geometric-mean ratio."""

from __future__ import annotations

import subprocess

import pytest

from tailwatch_dev.bench_release import PINNED_RELEASE, ReleaseError, Side, _lines, release_code


def test_a_checkout_of_another_commit_is_refused_with_the_way_to_make_one(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com",
                    "commit", "-q", "--allow-empty", "-m", "other"], check=True)
    with pytest.raises(ReleaseError) as err:
        release_code(tmp_path, None)
    assert PINNED_RELEASE[:7] in str(err.value) and "git worktree add" in str(err.value)


def test_every_round_is_reported_and_the_ratio_is_their_geometric_mean():
    before = Side("the release", rates=[100.0, 50.0], start_cpu_s=[2.0, 2.5])
    after = Side("this tree", rates=[200.0, 200.0], start_cpu_s=[1.0, 1.25])
    title, rates, start = _lines("trace dense", before, after)
    assert title == "trace dense: this tree/release 2.83× (geometric mean of the rounds)"  # √(2 × 4)
    assert rates == "  events/CPU-s: release 100 · 50; this tree 200 · 200"
    assert start == "  start-up CPU-s: release 2.00 · 2.50; this tree 1.00 · 1.25"
