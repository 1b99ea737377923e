"""Test and demo harness: start, watch and stop real server and router processes. The product never imports it."""
