"""Capacity, cost and compute planning over what the store measured: GPU prices, cost
attribution and unit costs, replicas with zone headroom, KV-cache memory, and the planner
of workers per phase of a cascaded pipeline (pure; no I/O beyond reading a config file, no clock)."""
