"""Benchmarks of the product's claims, measured side by side in one run."""
