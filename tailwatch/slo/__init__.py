"""SLO math over buckets: histograms, SLIs, budgets, burn rates (pure; no I/O, no clock)."""
