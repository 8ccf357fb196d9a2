"""Benchmarks (`kvdeck bench ...`). Benchmarks are not tests: they print figures in hardware
units and as ratios against a peer measured in the same run (docs/ENGINE.md § Measuring)."""
