"""The spawned P/D agent pair shared by the transfer tests (one pair per session: engines busy-spin)."""

import pytest
from transfer_cases import AgentPair


@pytest.fixture(scope="session")
def pair():
    agents = AgentPair()
    yield agents
    agents.stop()
