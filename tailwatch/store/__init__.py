"""The DuckDB store, one module per concern: its tables and migrations (store/schema.py),
opening the file (store/connection.py), the worker's checkpointed state
(store/checkpoint.py), and read queries over the buckets (store/queries.py).
"""
