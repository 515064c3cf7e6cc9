"""waitress's connections bounded in time and in number per visitor, so that no client holds the server.

waitress's own bounds are for a crowd, not for a hostile visitor: at most ``connection_limit`` connections (beyond
them it accepts none until some close), each closed after ``channel_timeout`` (120 s) in which it sent or took no
byte and asked for nothing. One visitor opening a hundred connections that send nothing, or that send a request a
byte every few seconds (never idle in that sense), held every other visitor out. Here:

* a request, once its first byte has come, must arrive whole within ``request_seconds``; then the main loop closes
  the connection, however many bytes it trickles (the app takes GET only, so a whole request is its header). A
  connection that asks for nothing (kept alive after an answer, or silent) is idle and held: closing idle connections
  after ``request_seconds`` made a botnet's keep-alive connections come back all at once every few seconds, and the
  server accepted and closed two thousand a second (bench/redteam/serve44); an idle connection costs a descriptor,
  and makes room when the server is full (below). An answer small enough to leave waitress whole, held by the
  system for a client that takes none of it, is cut after ``write_seconds`` as if it waited in waitress's buffer
  (`_kept_unread`);
* a writer waits at most ``write_seconds`` in which the client took no byte. waitress hands a response to the client
  from a buffer; when more than ``outbuf_high_watermark`` (16 MB) waits unsent, the thread writing it waits until
  the client takes some, for as long as the connection stays open. Eight clients that asked for a big table and read
  nothing once held every page thread. Here that wait ends: the main loop closes the connection (its socket and
  buffers go at once, however full), and the writer stops as for a client that left (waitress's
  ClientDisconnected), so the app's streaming code releases its lane. An answer the app has finished that still
  waits in the buffer (a spooled download: jobs.web.spool) for a client that takes none of it for ``write_seconds``
  is closed the same way, and so is one whose client, once it has had ``write_seconds``, has taken less than
  ``min_rate`` bytes a second on average since the answer was finished (a client reading a 1 GB answer at 1 KB/s
  would otherwise hold its spool file for twelve days). Such a connection is reset, not closed: the system would
  otherwise go on sending the client what it holds for it (a few megabytes), however slowly it reads;
* a connection that has sent nothing is not the server's to hold until it has sent something, or until
  ``first_byte_seconds`` have passed (`accept_on_first_byte`): the system keeps it meanwhile and the server never
  sees it. Visitors that open connections and send nothing (a botnet's idle connections, each opened again as
  soon as it is closed) once made the server accept and close about 1,250 connections a second, each accept and
  each close waiting for the interpreter's lock behind the page threads, and pages took 1.4 s at the 95th
  percentile (BENCHMARKS.md, "Everything at once");
* a connection from an address that already holds ``per_address`` connections is refused as it is accepted
  (`Admission`), so one visitor holds at most its share of ``connection_limit``;
* the listener takes up to `ACCEPT_BURST` connections from the kernel's queue at a turn of the main loop, not one;
* a connection accepted into a full server takes the place of the one that has waited longest for a request (kept
  alive after its answer, or sending one), so many visitors each within their share (a botnet) cannot fill the
  server for the others: waitress stops accepting once ``connection_limit`` are open, and a visitor's connection
  then waited in the kernel's queue behind every other one until some closed. A connection with a request being
  answered, or with an answer still to send, is never closed to make room; when every one has, the server is full
  and new connections wait in the kernel's queue as before. The listener goes on accepting while it is full and a
  connection waits for a request (`Admission.take`).

An answer the app is still writing, whose client keeps taking it, however slowly, is never cut by these bounds (the
app's downloads are finished before they are sent; the minimum rate bounds those).

This reaches into waitress 3's `HTTPChannel` (its wait for the buffer to drain, the readiness checks its main loop
makes of every connection on every turn, at least once a second, its queue of requests and of unsent bytes) and its
servers' ``channel_class`` (called with each accepted socket), their ``readable`` and their rule of accepting nothing
while their map holds ``connection_limit`` entries; tests/test_serve_bounds.py holds it to the behaviour.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from waitress.channel import HTTPChannel

try:  # POSIX only: elsewhere what the system holds for a client is not asked (`_unsent`)
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = termios = None  # type: ignore[assignment]

POLL_S = 0.25
"""How often a waiting writer looks at the clock (the main loop also wakes it whenever the client takes bytes)."""
TOLD_EVERY_S = 60.0
"""How often the server's stderr names an address it refuses connections from, or says it makes room (a refused
client may retry at once, many times a second)."""
FULL = ""
"""The key in `Admission.told` of the server making room (an address is never empty)."""
FULL_AND_BUSY = " "
"""The key in `Admission.told` of the server being full with no connection to close (every one busy)."""
ACCEPT_BURST = 64
"""Connections taken from the kernel's queue at one turn of the main loop. waitress takes one a turn, and each turn asks
every open connection whether it is readable: a flood of connections from many addresses (each within its share, each
opened again as soon as it is closed) kept the queue full at its 1,024, and the system dropped new visitors'
connections, which their systems sent again only 1, 3 or 7 s later (bench/redteam/serve44)."""


class BoundedChannel(HTTPChannel):
    """An HTTPChannel closed when its client takes `request_seconds` to send a request, or `write_seconds` to take
    any byte of an answer that waits for it."""

    request_seconds: float = 5.0
    write_seconds: float = 30.0
    min_rate: float = 0.0
    """Bytes a second the client must take of a finished answer, on average, once it has had `write_seconds`."""
    taken: int = 0
    """Bytes the client took since its answer was finished (or its connection opened)."""
    last_taken: float = 0.0
    """When the client last took bytes (waitress's own last_activity counts bytes it sent us too)."""
    stalled: bool = False
    """Set by a writer that waited `write_seconds` in vain; the main loop then closes the connection."""
    answered: float = 0.0
    """When the connection last had a request being answered (or opened): the clock of `write_seconds` for the rest
    of a finished answer."""
    waiting_since: float = 0.0
    """When the connection last had a request being answered or an answer waiting (or opened): which connection has
    waited longest for a request (`Admission.make_room`)."""
    unsent: int = 0
    """Bytes the system held for the client at the main loop's last look at an idle connection (`_kept_unread`)."""
    unsent_since: float = 0.0
    """When the client last took some of them (or they began to wait)."""
    begun: float = 0.0
    """When the request the client is sending began (while it sends none: the main loop's last look): the clock of
    `request_seconds`."""

    def __init__(self, server, sock, addr, adj, map=None) -> None:
        super().__init__(server, sock, addr, adj, map=map)
        self.waiting_since = self.answered = self.begun = self.creation_time

    def _flush_some(self, do_close: bool = True) -> bool:
        waiting = self.total_outbufs_len
        sent = super()._flush_some(do_close=do_close)
        if sent:
            self.last_taken = time.time()
            self.taken += max(waiting - self.total_outbufs_len, 0)
        return sent

    def _flush_outbufs_below_high_watermark(self) -> None:
        if self.total_outbufs_len <= self.adj.outbuf_high_watermark:
            return
        with self.outbuf_lock:
            _, exception = self._flush_exception(self._flush_some, do_close=False)
            if exception:  # as waitress does: the main loop decides what becomes of the socket
                self.server.pull_trigger()
                self.outbuf_lock.wait()
                return
            waiting_since = time.time()
            while self.connected and self.total_outbufs_len > self.adj.outbuf_high_watermark:
                if time.time() - max(waiting_since, self.last_taken) >= self.write_seconds:
                    self.stalled = True  # closed by the main loop; the writer then finds it gone and stops
                self.server.pull_trigger()
                self.outbuf_lock.wait(POLL_S)

    def service(self) -> None:
        """Answer the first waiting request, unless the client has hung up: then drop its requests and have the main
        loop close the connection. A connection with two requests waiting is not read (waitress reads one request
        ahead), so a pipelining client's leaving went unseen, and 4,000 connections that each sent four requests and
        left had every page made for nobody while the visitor's waited behind them (bench/redteam/serve45,
        burst_close). A client that only stops sending (a half-close) is taken as gone too, as nginx does."""
        if self.connected and _hung_up(self.socket):
            with self.requests_lock:
                for request in self.requests:
                    request.close()
                self.requests = []
                self.close_when_flushed = True
            self.server.pull_trigger()
            return
        super().service()

    def readable(self) -> bool:
        """Asked by the main loop of every connection on each turn: where an overdue one is closed. (A socket whose
        client reads nothing is never ready for writing, and one that trickles a request is always ready for
        reading, so neither would come to waitress's own checks in time.)"""
        if self.connected and self._overdue(time.time()):
            if self.stalled:  # the client takes too little: what the system still holds for it goes too (a reset)
                with contextlib.suppress(OSError):
                    self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.handle_close()
        return self.connected and super().readable()

    def writable(self) -> bool:
        return self.connected and super().writable()

    @property
    def waiting_for_request(self) -> bool:
        """Whether closing the connection now loses nothing but its wait: no request is being answered or waits for
        a thread, and no answer waits to be sent."""
        return self.connected and not self.requests and not self.total_outbufs_len and not self.stalled

    def _overdue(self, now: float) -> bool:
        """Whether the client has had its time: to take bytes of an answer, or to send a request."""
        if self.stalled:
            return True
        if self.requests:  # being answered: its writer keeps the time of what the client takes
            self.waiting_since = self.answered = now
            self.taken = self.unsent = 0
            return False
        if self.total_outbufs_len:  # the rest of a finished answer (a spooled download) waits for the client
            self.waiting_since = now
            had = now - self.answered
            self.stalled = (now - max(self.answered, self.last_taken) >= self.write_seconds
                            or (had >= self.write_seconds and self.taken < self.min_rate * had))
            return self.stalled
        if self.request is None:  # no request begun: idle, held until its room is needed (`Admission.make_room`)
            self.begun = now
            return self._kept_unread(now)
        return now - self.begun >= self.request_seconds

    def _kept_unread(self, now: float) -> bool:
        """Whether the system has held bytes of an answer for the client for `write_seconds` in which it took none. An
        answer that fits in the system's buffers (a few megabytes) leaves waitress at once, and the connection looks
        idle; a client that never reads it would hold that memory for as long as its connection is kept. The system
        is asked only while bytes waited at the last look or some were sent since: thousands of idle connections held
        cost the main loop no call each turn."""
        if not self.unsent and self.last_taken < self.unsent_since:
            return False
        queued = _unsent(self.socket)
        if queued == 0 or queued < self.unsent or not self.unsent:  # taken, some taken, or a new wait
            self.unsent, self.unsent_since = queued, now
            return False
        self.stalled = now - self.unsent_since >= self.write_seconds
        return self.stalled


def bounded_channel(request_seconds: float, write_seconds: float, min_rate: float = 0.0) -> type[BoundedChannel]:
    """The channel class of a server whose clients have ``request_seconds`` to send a request, ``write_seconds`` to
    take bytes of an answer, and must then take a finished answer at ``min_rate`` bytes a second on average."""
    return type("BoundedChannel", (BoundedChannel,), {"request_seconds": request_seconds,
                                                      "write_seconds": write_seconds, "min_rate": min_rate})


def accept_on_first_byte(listener: socket.socket, seconds: float) -> None:
    """Have the system hand the server a connection only once its client has sent a byte, or after ``seconds``
    (Linux's TCP_DEFER_ACCEPT; it rounds up to its retransmission steps of 1, 3, 7, 15 ... s).

    A connection the system keeps costs the server nothing: no accept, no channel, no close, no slot. A client that
    sends nothing is handed over when the time is up and is then bounded like any other (`request_seconds`, its
    share, making room). Elsewhere than Linux (no such option) and with ``seconds`` 0, every connection is accepted
    at once, as waitress does."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is not None and seconds > 0:
        listener.setsockopt(socket.IPPROTO_TCP, option, max(1, math.ceil(seconds)))


OPEN_FILES_KEPT = 256
"""File descriptors of the server that are not connections: the database, the lanes' pipes, spooled downloads."""


def room_for_connections(wanted: int) -> int:
    """How many connections the server can hold, up to ``wanted``: the process's limit of open files is raised as far
    as the system lets it (many systems start a process at 1,024), less `OPEN_FILES_KEPT`. Where the system has no
    such limit (not POSIX), ``wanted``."""
    try:
        import resource
    except ImportError:
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + OPEN_FILES_KEPT
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - OPEN_FILES_KEPT))


@dataclass
class Admission:
    """A listener's ``channel_class``: accepts a connection as a `channel` unless its client's address already holds
    ``per_address`` connections, and then closes it at once with a reset (the client sees its connection refused;
    the server keeps nothing of it, not even a closing socket). A connection that fills the server closes the one
    that has waited longest for a request, so the server goes on accepting (`make_room`).

    An address is a visitor only where visitors connect directly: behind a reverse proxy every connection comes from
    the proxy's address, and the proxy has to bound its clients (docs/serve.md)."""

    channel: type[BoundedChannel]
    per_address: int
    told: dict[str, float] = field(default_factory=dict)
    """When the server last said it refuses an address's connections (or, under `FULL`, that it is full)."""
    made_room: int = 0
    """Connections closed to make room since the server last said so."""

    def take(self, listener) -> None:
        """Have waitress's ``listener`` accept through this admission, and go on accepting while it is full but a
        connection waits for a request: waitress stops accepting once ``connection_limit`` are open, and would then
        make no room until one closed by itself (a burst of new connections can fill the server in one turn of the
        main loop, before any of them can be closed to make room)."""
        listener.channel_class = self
        listener.logger.addFilter(_not_waitress_overflow)
        waitress_readable = listener.readable

        def readable() -> bool:
            if waitress_readable():  # (it also runs waitress's maintenance: call it every turn)
                return True
            if not listener.accepting:
                return False
            if any(isinstance(channel, BoundedChannel) and channel.waiting_for_request
                   for channel in listener._map.values()):
                return True
            self._tell(FULL_AND_BUSY, "every connection taken (--connections) and each busy with a request or its "
                                      "answer: new connections wait in the system's queue until one is answered")
            return False

        listener.readable = readable

    def __call__(self, server, sock: socket.socket, addr, adj, map) -> BoundedChannel | None:
        """The connection waitress accepted, then more of the kernel's queue (`ACCEPT_BURST`); the connections
        closed to make room for them go last, so that no connection accepted in this turn of the main loop takes
        the descriptor of one closed in it (the loop would hand it that one's events)."""
        channels = [channel for channel in map.values() if isinstance(channel, BoundedChannel)]
        waiting = [channel for channel in channels if channel.waiting_for_request]
        held = Counter(channel.addr[0] for channel in channels)
        first = self._admit(sock, addr, server, adj, map, held)
        rooms = int(first is not None and len(map) >= adj.connection_limit)
        for _ in range(ACCEPT_BURST - 1):
            if rooms >= len(waiting) and len(map) >= adj.connection_limit:
                break  # no room can be made for another
            taken = _next_connection(server)
            if taken is None:
                break
            if self._admit(*taken, server, adj, map, held) is not None and len(map) >= adj.connection_limit:
                rooms += 1
        for _ in range(rooms):  # waitress would accept no more until one closes
            if not self.make_room(waiting):
                break
        return first

    def _admit(self, sock: socket.socket, addr, server, adj, map, held: Counter[str]) -> BoundedChannel | None:
        """One accepted connection: refused with a reset, or a channel. ``held``: connections of each address."""
        address = addr[0]
        if held[address] >= self.per_address:
            _reset(sock)
            self._tell(address, f"refusing connections from {address}: it holds {self.per_address} "
                                "(--connections-per-address)")
            return None
        held[address] += 1
        return self.channel(server, sock, addr, adj, map=map)

    def make_room(self, waiting: list[BoundedChannel]) -> bool:
        """Close, of the ``waiting`` connections (each waiting for a request, opened before this turn), the one that
        has waited longest; whether there was one. (The newest waits least: it is usually a visitor who has just sent
        one, not yet read.)"""
        if not waiting:
            return False
        victim = min(waiting, key=lambda channel: channel.waiting_since)
        victim.handle_close()
        waiting.remove(victim)
        self.made_room += 1
        if self._tell(FULL, "every connection taken (--connections): closing those that waited longest for a "
                            f"request to make room for new ones ({self.made_room} since this was last said)"):
            self.made_room = 0
        return True

    def _tell(self, key: str, message: str) -> bool:
        """Say ``message`` on stderr unless the server said it of ``key`` within `TOLD_EVERY_S`; whether it did."""
        now = time.monotonic()
        if now - self.told.get(key, -TOLD_EVERY_S) < TOLD_EVERY_S:
            return False
        self.told = {seen: at for seen, at in self.told.items() if now - at < TOLD_EVERY_S}
        self.told[key] = now
        sys.stderr.write(f"hubtrace serve: {message}\n")
        return True


def _not_waitress_overflow(record: logging.LogRecord) -> bool:
    """Leave out waitress's "no longer accepting new connections" (and "listening again"): a full server goes on
    accepting while it can make room (`Admission.take`), and says itself when it makes room or cannot."""
    return not record.getMessage().startswith("total open connections")


def _next_connection(server) -> tuple[socket.socket, object] | None:
    """The next connection waiting in the listener's queue, as waitress's own accept prepares it; None when none."""
    try:
        taken = server.accept()
    except OSError:
        return None
    if taken is None:
        return None
    sock, addr = taken
    try:
        server.set_socket_options(sock)
    except OSError:  # the client has already gone (as waitress: nothing to keep)
        sock.close()
        return None
    return sock, server.fix_addr(addr)


def _unsent(sock: socket.socket) -> int:
    """Bytes the system holds for the client, not yet taken (Linux's TIOCOUTQ); 0 where it cannot say."""
    if fcntl is None or not hasattr(termios, "TIOCOUTQ"):
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):  # closed meanwhile
        return 0


def _hung_up(sock: socket.socket) -> bool:
    """Whether the client has closed its side of the connection (Linux's POLLRDHUP, or a reset or error); False where
    the system cannot say without reading."""
    hang_up = getattr(select, "POLLRDHUP", 0)
    if not hang_up:
        return False
    poller = select.poll()
    try:
        poller.register(sock, hang_up | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))
    except (OSError, ValueError, TypeError):  # closed meanwhile (the main loop sets a closed channel's socket to None)
        return True


def _reset(sock: socket.socket) -> None:
    """Close with a reset: the client sees its connection refused, and the system keeps nothing of it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
