"""Autoscale and rollout decisions (pure), for the signal API that serves them."""
