"""Detectors: pure streaming code over closed buckets and GPU samples that says why users hurt."""
