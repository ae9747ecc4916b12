"""A loopback TCP proxy a test can cut and restore: a database outage without touching the
database server (other suites use the shared PostgreSQL at the same time).

    with TcpProxy("127.0.0.1", 5432) as proxy:
        ...                 # point a process's DATABASES at 127.0.0.1:proxy.port
        proxy.cut()         # every open connection dropped, new ones refused
        proxy.restore()     # the same port accepts again

While cut, the listening socket is closed, so a connect is refused at once (as when the
server is down) rather than hanging. Both sides of every relayed connection are shut down,
so the server ends those sessions too. Threads are daemons; every wait is bounded.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT_SECONDS = 5.0
ACCEPT_POLL_SECONDS = 0.1
BUFFER = 65536


class TcpProxy:
    """Relays loopback connections on ``port`` to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, int(upstream_port))
        self.port = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._listening = threading.Event()
        self._listen()

    # -- control -------------------------------------------------------------------------

    @property
    def cut_now(self) -> bool:
        return self._listener is None

    def cut(self) -> None:
        """Refuse new connections and drop every open one, both sides."""
        self._close_listener()
        with self._lock:
            open_sockets, self._sockets = self._sockets, set()
        for sock in open_sockets:
            _shut(sock)

    def restore(self) -> None:
        """Accept again, on the same port."""
        if self._listener is None:
            self._listen()

    def stop(self) -> None:
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- relaying --------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # The same port again right after a cut, despite connections in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self.port))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_SECONDS)
        self.port = listener.getsockname()[1]
        self._listener = listener
        stopped = threading.Event()
        self._listening = stopped
        threading.Thread(target=self._accept_loop, args=(listener, stopped), daemon=True).start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        # The accept loop sees the flag within one poll; closing now refuses new connects.
        self._listening.set()
        listener.close()

    def _accept_loop(self, listener: socket.socket, stopped: threading.Event) -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut()
            try:
                upstream = socket.create_connection(self.upstream, timeout=CONNECT_TIMEOUT_SECONDS)
            except OSError:
                _shut(client)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                if stopped.is_set():
                    _shut(client)
                    _shut(upstream)
                    return
                self._sockets.update((client, upstream))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        # Ends when either side closes or cut() shuts both down (recv then returns b"").
        try:
            while chunk := source.recv(BUFFER):
                sink.sendall(chunk)
        except OSError:
            pass
        with self._lock:
            self._sockets.discard(source)
            self._sockets.discard(sink)
        _shut(source)
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
