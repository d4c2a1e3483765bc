"""PARALLELISMS: ``spec.parallelism.strategy`` -> Plan class."""

from __future__ import annotations

from .base import Plan
from .data import DataParallel

PARALLELISMS: dict[str, type[Plan]] = {
    "data": DataParallel,
}
