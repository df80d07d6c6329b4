"""Cost and goodput reports for finance and product, read from the store."""
