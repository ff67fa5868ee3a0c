#!/usr/bin/env python3
"""A minimal Metronome client: start one session, send a few frames, print what comes back.

Usage: python3 examples/client.py ws://127.0.0.1:PORT/v1/realtime [FRAMES]
Needs the `websockets` package (Debian 12: python3-websockets, which scripts/setup.sh installs).
Every message is described in docs/protocol.md.
"""
import asyncio
import json
import sys

import websockets

PERIOD_MS = 40  # the session's declared frame period; the server refuses frames sent faster


async def receive(ws, *types):
    """The next message of one of `types`; other messages (alarms, new kinds) are skipped."""
    while True:
        message = json.loads(await ws.recv())
        if message["type"] in types:
            return message


async def main(url, frames):
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.start", "period_ms": PERIOD_MS,
                                  "tokens_per_frame": 1, "output_tokens_per_frame": 1}))
        started = await receive(ws, "session.started", "session.rejected", "error")
        if started["type"] != "session.started":
            sys.exit(f"no session: {started}")
        session = started["session"]
        print(f"session {session} started, kv {started['kv']['policy']}")
        for index in range(frames):
            await ws.send(json.dumps({"type": "frame", "session": session, "index": index,
                                      "ids": [index + 1]}))
            result = await receive(ws, "frame.result", "error")
            if result["type"] == "error":
                sys.exit(f"frame {index} refused: {result['message']}")
            print(f"frame {result['frame']}: {result['outcome']}, ids {result['ids']}, "
                  f"{result['latency_ms']:.2f} ms")
            await asyncio.sleep(PERIOD_MS / 1000)
        await ws.send(json.dumps({"type": "session.end", "session": session}))
        ended = await receive(ws, "session.ended")
        print(f"session {session} ended: {ended['reason']}, {ended['frames']} frames")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 5))
