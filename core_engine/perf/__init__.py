"""Measurement: the roofline model, device peaks, telemetry and the metrics folded from snapshots."""
