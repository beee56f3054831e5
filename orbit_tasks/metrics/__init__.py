"""The Prometheus exporter `orbit metrics serve` (SPEC §12, docs/metrics.md)."""
