"""Grafana dashboards (grafanalib) over the metrics the worker exports."""
