"""tailwatch: streaming SLO analytics for GPU inference fleets (the wiring lives here)."""

__version__ = "0.1.0"
