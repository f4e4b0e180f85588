"""Benchmarks of zktasks: `python bench/run.py` (see bench/README.md)."""
