"""Forward TCP connections from 127.0.0.1:PORT here to 127.0.0.1:TARGET in a network namespace.

    python relay.py PORT NETNS TARGET_PORT

The listening socket is made in this process's own namespace; the process then joins
NETNS (``os.setns``, Python >= 3.12), so every socket it connects afterwards lives there.
Only loopback addresses on both sides. Runs until killed (the harness kills it by PID).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listener: socket.socket, target_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main() -> None:
    port, netns, target_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    with open(f"/var/run/netns/{netns}") as ns:
        os.setns(ns.fileno(), os.CLONE_NEWNET)
    asyncio.run(_serve(listener, target_port))


if __name__ == "__main__":
    main()
