"""A TCP forwarder that loses answers: after it passes a client's bytes on, it may reset the
connection before the server's answer comes back (the request was served, its answer is
lost), as a flaky network or a dying middlebox does. Works for any protocol on TCP (gRPC's
HTTP/2 and Kafka's binary protocol alike): the client sees a reset connection and every
call in flight on it fails.

``target`` may be set after the proxy starts (a broker advertises the proxy's address, so
the proxy must exist first). Resets close both sockets with SO_LINGER 0, so each side
gets an RST, not a clean FIN. ``reset_probability`` applies per chunk the client sends;
the reset comes ``reset_delay_s`` (a random range) later, long enough for the server to
have served the request, usually before its answer arrives. Thread-based; ``close()``
stops everything.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time

_LINGER_RESET = struct.pack("ii", 1, 0)


class FaultProxy:
    """See the module docstring."""

    def __init__(self, *, reset_probability: float = 0.0, reset_delay_s: tuple[float, float] = (0.005, 0.05)) -> None:
        self.target: tuple[str, int] | None = None
        self.reset_probability = reset_probability
        self.reset_delay_s = reset_delay_s
        self.resets = 0
        self.accepted = 0
        self._rng = random.Random(20)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy-accept").start()

    def forward_to(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.target is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, upstream)
            with self._lock:
                self._pairs.append(pair)
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair, False), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket], from_client: bool
    ) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if from_client and self.reset_probability and self._rng.random() < self.reset_probability:
                    delay = self._rng.uniform(*self.reset_delay_s)
                    threading.Timer(delay, self._reset, args=(pair,)).start()
        except OSError:
            pass
        self._reset(pair, count=False)

    def _reset(self, pair: tuple[socket.socket, socket.socket], count: bool = True) -> None:
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.remove(pair)
            if count:
                self.resets += 1
        for s in pair:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                s.shutdown(socket.SHUT_RD)  # wakes the pump blocked in recv, sends nothing
            except OSError:
                pass
            s.close()  # with SO_LINGER 0: an RST

    def reset_all(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._reset(pair)

    def close(self) -> None:
        self.reset_probability = 0.0
        self._server.close()
        self.reset_all()
        time.sleep(0.01)
