"""Synchronisation algorithms (``spec.sync.algorithm``): how replicas agree on parameters."""
