"""The running tiers: the batch consumer (decode, validate, dedupe, window, store) and the exporter."""
