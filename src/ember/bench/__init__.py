"""Benchmarks of the seed workloads (``ember bench``) and their verification."""
