"""Fixtures for end-to-end tests: the operator under test, on real nodes."""

import pytest

from tests.support.operator import operator_fixture  # noqa: F401  (the `operator` fixture)
from tests.support.realnodes import real_nodes  # noqa: F401  (a session fixture)
from tests.support.training import FOLLOWERS


@pytest.fixture(autouse=True)
def stop_following_logs():
    yield
    while FOLLOWERS:
        FOLLOWERS.pop().__exit__(None, None, None)
