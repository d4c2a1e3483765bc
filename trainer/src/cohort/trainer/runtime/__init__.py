"""Distributed runtime: membership (the world), process groups, elastic recovery."""
