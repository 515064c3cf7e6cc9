"""`hubtrace serve`: the scan database as a read-only web app on this machine (jobs/web; docs/serve.md), served by
waitress until Ctrl-C. It holds the file open read-only, as `hubtrace query` does: other readers may share it, a
scan cannot start until the app stops."""

from __future__ import annotations

import ipaddress
import signal
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.refusals import CommandError
from jobs.web.limits import ServeLimits
from scanner.engine_limits import EngineLimits
from scanner.text_safety import terminal

PAGE_THREADS = 6
"""Requests answered at once besides the slow ones (each worker thread has its own read-only connection). The
server has one more thread for each SQL-box lane and each download lane, so pages keep answering whatever the
statements and downloads do."""


def serve_command(
    db: Annotated[Path, typer.Option("--db", help="The scan's DuckDB file.")],
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on. The default answers this machine only; another address lets anyone "
                       "who can reach it read the whole database.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port, printed).")] = 8000,
    query_seconds: Annotated[float, typer.Option(
        "--query-seconds", min=0.1, help="DuckDB time one SQL-box statement (or download) may take; then it is "
                                         "stopped.")] = ServeLimits.query_seconds,
    download_rows: Annotated[int, typer.Option(
        "--download-rows", min=1, help="Rows a SQL-box download carries at most.")] = ServeLimits.download_rows,
    download_mb: Annotated[int, typer.Option(
        "--download-mb", min=1, help="MiB a SQL-box download carries at most.")] = ServeLimits.download_bytes >> 20,
    sql_slots: Annotated[int, typer.Option(
        "--sql-slots", min=1, max=16, help="SQL-box statements run at once; more are asked to come back "
                                           "later.")] = ServeLimits.sql_slots,
    download_slots: Annotated[int, typer.Option(
        "--download-slots", min=1, max=16, help="Table downloads made at once; more are asked to come back later.")
    ] = ServeLimits.download_slots,
    write_seconds: Annotated[float, typer.Option(
        "--write-seconds", min=1, help="Seconds a response waits for a client that takes none of it; then the "
                                       "connection is closed.")] = ServeLimits.write_seconds,
    min_rate_kb: Annotated[int, typer.Option(
        "--min-rate-kb", min=0, help="KiB a second a client must take of an answer, on average, once it has had "
                                     "--write-seconds; a slower one is cut off.")] = ServeLimits.min_rate >> 10,
    spool_mb: Annotated[int, typer.Option(
        "--spool-mb", min=1, help="MiB of temporary disk the downloads written and waiting for their readers may "
                                  "hold together; a download that would pass it is asked to come back later.")
    ] = ServeLimits.spool_bytes >> 20,
    request_seconds: Annotated[float, typer.Option(
        "--request-seconds", min=0.5, help="Seconds a client may take to send a whole request, from when its "
                                           "connection opens or its last answer was sent; then the connection is "
                                           "closed.")] = ServeLimits.request_seconds,
    first_byte_seconds: Annotated[float, typer.Option(
        "--first-byte-seconds", min=0, help="Seconds the system keeps a new connection that has sent nothing from "
                                            "the server (Linux); then the server takes it, and --request-seconds "
                                            "counts. 0: connections are taken at once.")
    ] = ServeLimits.first_byte_seconds,
    connections: Annotated[int, typer.Option(
        "--connections", min=2, help="Connections open at once; a new one then closes the one that has waited "
                                     "longest for a request, or waits to be accepted while every one is being "
                                     "answered. The server raises its limit of open files to hold them; where the "
                                     "system allows fewer (ulimit -Hn), it holds fewer and says so.")
    ] = ServeLimits.connections,
    connections_per_address: Annotated[int, typer.Option(
        "--connections-per-address", min=1, help="Connections one client address may hold at once; more are "
                                                 "refused at once. Behind a reverse proxy every visitor has the "
                                                 "proxy's address: raise it to --connections and let the proxy "
                                                 "bound its clients.")] = ServeLimits.connections_per_address,
    memory_limit: Annotated[str, typer.Option(
        "--memory-limit", help="Memory DuckDB may use for the pages and table downloads together, and for each SQL-box "
                               "statement (e.g. 1GB, 500MB; a statement's DuckDB gets at most half of "
                               "--statement-mb).")
    ] = EngineLimits.memory,
    statement_mb: Annotated[int, typer.Option(
        "--statement-mb", min=512, help="MB of memory each SQL-box statement's process may hold, whatever the "
                                        "statement builds; a statement that needs more is refused.")
    ] = ServeLimits.statement_mb,
    threads: Annotated[int, typer.Option(
        "--threads", min=1, help="Threads DuckDB may use for all requests together.")] = EngineLimits.threads,
    spill: Annotated[str, typer.Option(
        "--spill", help="Temporary disk space DuckDB may use for all requests together (0GB: none).")
    ] = EngineLimits.spill,
) -> None:
    """Browse a scan database in a web browser: families, models, pair evidence, a read-only SQL box, downloads."""
    from waitress import create_server
    from waitress.server import BaseWSGIServer, MultiSocketServer

    from jobs.web.app import LOCAL_NAMES, create_app
    from jobs.web.bounds import DOWNLOADS, SQL
    from jobs.web.channel import Admission, accept_on_first_byte, bounded_channel, room_for_connections
    from jobs.web.database import EXTENSION
    from jobs.web.fair_queue import FairDispatcher

    local = _loopback(host)
    if (held := room_for_connections(connections)) < connections:
        typer.echo(f"hubtrace serve: warning: --connections {connections} lowered to {held}: the system lets this "
                   "process open too few files (ulimit -n)", err=True)
        connections = held
    limits = ServeLimits(query_seconds=query_seconds, download_rows=download_rows, download_bytes=download_mb << 20,
                         sql_slots=sql_slots, download_slots=download_slots, write_seconds=write_seconds,
                         request_seconds=request_seconds, first_byte_seconds=first_byte_seconds,
                         connections=connections, connections_per_address=connections_per_address,
                         statement_mb=statement_mb,
                         spool_bytes=spool_mb << 20, min_rate=min_rate_kb << 10,
                         engine=EngineLimits(memory_limit, threads, spill))
    # a missing, locked, outdated or newer database, or a limit DuckDB cannot read: a StoreError, one line
    app = create_app(db, host_names=LOCAL_NAMES | {host} if local else None, limits=limits)
    try:
        # a lookahead of one request keeps reading the socket while a request runs: how a gone client is seen;
        # poll() rather than select(), which fails past file descriptor 1023 (--connections may reach it)
        # requests answered in turns by client address (jobs.web.fair_queue), not in the order they came
        threads = PAGE_THREADS + sql_slots + download_slots
        dispatcher = FairDispatcher()
        dispatcher.set_thread_count(threads)
        server = create_server(app, host=host, port=port, threads=threads,
                               ident="hubtrace", channel_request_lookahead=1, connection_limit=connections,
                               asyncore_use_poll=True, _dispatcher=dispatcher)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    admission = Admission(bounded_channel(request_seconds, write_seconds, limits.min_rate), connections_per_address)
    for listener in server.map.values() if isinstance(server, MultiSocketServer) else [server]:  # one per address
        if isinstance(listener, BaseWSGIServer):
            admission.take(listener)
            accept_on_first_byte(listener.socket, first_byte_seconds)
    if not local:
        typer.echo(f"hubtrace: warning: listening on {host}: anyone who can reach this address can read the whole "
                   "database", err=True)
    listening = getattr(server, "effective_listen", None) or [(server.effective_host, server.effective_port)]
    for address, bound in listening:
        shown = f"[{address}]" if ":" in address else address
        typer.echo(terminal(f"hubtrace serve: http://{shown}:{bound}/ (read-only view of {db}; Ctrl-C stops)"))
    signal.signal(signal.SIGTERM, _stop)  # stopped as by Ctrl-C: the lanes' processes and private folders go too
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        for gate in (SQL, DOWNLOADS):
            app.extensions[gate].close()
        app.extensions[EXTENSION].close()


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _loopback(host: str) -> bool:
    """Whether host names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
