"""Parallelism strategies (``spec.parallelism.strategy``), applied per world."""
