"""A shard that accepts ``Shard.Session`` and then stops reading at the HTTP/2 level.

Run as a process: ``python tests/shard/stalled_h2_shard.py WINDOW``. It prints its port, accepts
connections, answers the request headers (200, application/grpc) and keeps reading the socket
(PINGs and SETTINGS are answered), but never acknowledges received DATA: with a stream window of
``WINDOW`` bytes the client can write that much of the request body and then waits for a
WINDOW_UPDATE that never comes -- a shard whose HTTP/2 window is full (a ``window full`` line
with the UTC time goes to stderr then). Used by
``test_send_timeout_at_the_wire.py`` and for the detection-time figure in FAULTS.md.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings


def serve(window: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    conns: dict[socket.socket, h2.connection.H2Connection] = {}
    received: dict[socket.socket, int] = {}
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                client, _ = listener.accept()
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
                conn.initiate_connection()
                conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
                client.sendall(conn.data_to_send())
                conns[client] = conn
                sel.register(client, selectors.EVENT_READ)
                continue
            conn = conns[sock]
            data = sock.recv(65536)
            if not data:
                sel.unregister(sock)
                del conns[sock]
                sock.close()
                continue
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    conn.send_headers(
                        event.stream_id, [(":status", "200"), ("content-type", "application/grpc")]
                    )
                # DataReceived: never acknowledged, so the window is never granted back.
                if isinstance(event, h2.events.DataReceived):
                    received[sock] = received.get(sock, 0) + event.flow_controlled_length
                    if received[sock] >= window:
                        now = time.time()
                        stamp = time.strftime("%H:%M:%S", time.gmtime(now)) + f"{now % 1:.3f}"[1:]
                        print(f"{stamp} window full: {received[sock]} bytes", file=sys.stderr)
                        sys.stderr.flush()
            sock.sendall(conn.data_to_send())


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
