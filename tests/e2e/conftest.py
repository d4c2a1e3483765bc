"""Fixtures for end-to-end tests: the operator under test and process nodes."""

from tests.support.operator import operator_fixture  # noqa: F401  (the `operator` fixture)
from tests.support.processnodes import process_nodes  # noqa: F401  (a session fixture)
