"""Benchmarks of nexo_django: `make bench` (bench/run.py). They print figures; they never fail on a number."""
