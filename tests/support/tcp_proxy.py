"""A real TCP proxy for fault tests (tests only): forward bytes to an upstream server, or hang.

``freeze()`` stops forwarding in both directions while keeping every socket open, and new
connections are accepted but never answered: to the client the server looks hung (a stopped
host, a black-holed network), which is what a time bound must survive. ``thaw()`` resumes;
``blackhole_existing()`` resumes for new connections only, while the connections open so far stay
silent forever (a route that died without a reset: only a client-side timeout gets out of it);
``close()`` drops every connection and stops listening (connection refused from then on).
``delay_seconds`` holds every chunk the upstream answers for that long before it is forwarded
(a slow network or a busy server: each request/response round trip takes that much longer).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._running = threading.Event()
        self._running.set()  # cleared while frozen
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._generation = 0  # connections of an older generation are black-holed
        self.connections = 0
        self.delay_seconds = 0.0
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def blackhole_existing(self) -> None:
        with self._lock:
            self._generation += 1
        self._running.set()

    def close(self) -> None:
        self._closed.set()
        self._running.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            self._sockets.clear()
        self._thread.join(timeout=5)

    def _passes(self, generation: int) -> bool:
        return self._running.is_set() and generation == self._generation

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
                self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            generation = self._generation
        # A frozen proxy does not even dial the upstream: the handshake never arrives.
        while not self._passes(generation):
            if self._closed.is_set():
                return
            time.sleep(0.1)
        if self._closed.is_set():
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.append(upstream)
        peers = {client: upstream, upstream: client}
        sel = selectors.DefaultSelector()
        for sock in peers:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        try:
            while not self._closed.is_set():
                if not self._passes(generation):
                    time.sleep(0.1)
                    continue
                for key, _ in sel.select(timeout=0.1):
                    src = key.fileobj
                    assert isinstance(src, socket.socket)
                    try:
                        data = src.recv(65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        return
                    if src is upstream and self.delay_seconds:
                        time.sleep(self.delay_seconds)
                    peers[src].setblocking(True)
                    peers[src].sendall(data)
                    peers[src].setblocking(False)
        except OSError:
            return
        finally:
            sel.close()
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()


@contextmanager
def tcp_proxy(upstream_host: str, upstream_port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(upstream_host, upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()
