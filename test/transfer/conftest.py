import pytest
from transfer_cases import AgentPair


@pytest.fixture(scope="session")
def pair():
    agents = AgentPair()
    yield agents
    agents.stop()
