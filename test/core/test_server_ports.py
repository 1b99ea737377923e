"""The harness's answer to a port taken between its pick and the server's bind (SGLang's launcher logs uvicorn's
"address already in use" and keeps running, so a plain health wait hung for its whole timeout): the wait stops at
once, and a first start goes again on fresh ports. The server here is a stand-in that binds like SGLang's HTTP
front and answers /health; the harness under test is real."""

from __future__ import annotations

import socket
import textwrap
import time

import pytest

from harness.server_process import PortTaken, healthy_on_fresh_ports, post, start_server, wait_healthy

STAND_IN = textwrap.dedent("""
    import argparse, http.server, time
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def do_POST(self):
            body = str(self.server.server_address[1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"port": ' + body + b'}')
        def log_message(self, *a):
            pass

    try:
        server = http.server.HTTPServer(("127.0.0.1", args.port), Health)
    except OSError as exc:  # as SGLang's launcher: the error is logged, the process stays
        print(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
              f"('127.0.0.1', {args.port}): address already in use", flush=True)
        while True:
            time.sleep(1)
    server.serve_forever()
""")


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "stand_in_server.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def _taken() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_taken_port_stops_the_wait_at_once(stand_in):
    with _taken() as sock:
        server = start_server("null", stand_in, stand_in, module="stand_in_server", port=sock.getsockname()[1])
        try:
            start = time.monotonic()
            with pytest.raises(PortTaken, match=f"'127.0.0.1', {sock.getsockname()[1]}\\): address already in use"):
                wait_healthy(server, timeout_s=60)
            assert time.monotonic() - start < 30
        finally:
            server.stop()


def test_a_first_start_on_a_taken_port_goes_again_on_fresh_ports(stand_in):
    with _taken() as sock:
        taken = sock.getsockname()[1]
        first = start_server("prefill", stand_in, stand_in, module="stand_in_server", port=taken)
        server = healthy_on_fresh_ports(first, timeout_s=60)
        try:
            assert first.proc.poll() is not None  # the one that could not bind is stopped
            assert server.port != taken and server.bootstrap_port not in (None, first.bootstrap_port)
            assert server.args[server.args.index("--port") + 1] == str(server.port)
            assert post(server.url + "/generate", {}) == (200, {"port": server.port})
            assert server.log != first.log and server.log.exists()
        finally:
            server.stop()
