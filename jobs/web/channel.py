"""waitress's connection with a write timeout: a client that stops reading is cut off, and its thread freed.

waitress hands a response to the client from a buffer; when more than ``outbuf_high_watermark`` (16 MB) waits
unsent, the thread writing the response waits until the client takes some, for as long as the connection stays
open, and its idle timeout (``channel_timeout``) spares a connection with a request in progress. Eight clients that
asked for a big table and read nothing once held every page thread. Here that wait ends after ``write_seconds``
in which the client took no byte: the main loop closes the connection (its socket and buffers go at once, however
full), and the writer stops as for a client that left (waitress's ClientDisconnected), so the app's streaming code
releases its lane.

This reaches into waitress 3's `HTTPChannel` (its wait for the buffer to drain, and the readiness checks its main
loop makes of every connection); tests/test_serve_bounds.py holds it to the behaviour.
"""

from __future__ import annotations

import time

from waitress.channel import HTTPChannel

POLL_S = 0.25
"""How often a waiting writer looks at the clock (the main loop also wakes it whenever the client takes bytes)."""


class WriteTimeoutChannel(HTTPChannel):
    """An HTTPChannel whose writer waits at most `write_seconds` for a client that takes no bytes."""

    write_seconds: float = 30.0
    last_taken: float = 0.0
    """When the client last took bytes (waitress's own last_activity counts bytes it sent us too)."""
    stalled: bool = False
    """Set by a writer that waited `write_seconds` in vain; the main loop then closes the connection."""

    def _flush_some(self, do_close: bool = True) -> bool:
        sent = super()._flush_some(do_close=do_close)
        if sent:
            self.last_taken = time.time()
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

    def readable(self) -> bool:
        """Asked by the main loop of every connection on each turn: where a stalled one is closed. (A socket whose
        client reads nothing is never ready for writing, so waitress's own way, closing on the next write, would
        wait for the client.)"""
        if self.stalled and self.connected:
            self.handle_close()
        return self.connected and super().readable()

    def writable(self) -> bool:
        return self.connected and super().writable()


def write_timeout_channel(write_seconds: float) -> type[WriteTimeoutChannel]:
    """The channel class of a server whose writes wait at most ``write_seconds`` for the client."""
    return type("WriteTimeoutChannel", (WriteTimeoutChannel,), {"write_seconds": write_seconds})
