"""Detectors: pure streaming code over closed buckets and GPU samples that says why users hurt.

State in, events out, no I/O, event time only. `core` (Detection, open/close tracking, the
per-minute view of closed buckets), one module per detector (`retry_storm`, `queue_age`,
`utilisation`: busy/idle but slow, `kv_cache`: KV pressure and prompt growth, `cold_start`,
`cost`, `anomaly`), `config` (the YAML settings, `defaults.yaml`) and `evaluation`
(scoring detections against labelled incidents). The worker wiring is
`streams/detector_stage.py`.
"""
