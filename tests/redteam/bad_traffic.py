"""One round of the bad traffic scripts/soak.sh sends every 30 s, traffic loadgen never sends:
  1. malformed messages (not JSON, an unknown type, a bad session.start, frames and an end for
     sessions that do not exist, a binary frame cut short), then a real session with three frames
     and one with an out-of-vocabulary id, dropped with a TCP reset (no close frame);
  2. a live session, then a message over the 1 MiB limit: the server closes with 1009;
  3. half an HTTP request, then gone.
Prints one line: the error codes the server sent back, whether the session started, whether the
over-size message got its 1009. Exit status 0 when the round ran (what the server answered is the
soak's to judge: it checks the server's health afterwards), 1 on a connection failure.
Usage: python3 tests/redteam/bad_traffic.py PORT"""

import json
import socket
import struct
import sys
import time

from wsclient import Closed, WsClient


def messages_for(client, seconds):
    """The (opcode, payload) messages the server sends within `seconds`, until quiet or closed;
    a close frame is returned as (8, code as 2 bytes)."""
    out = []
    end = time.time() + seconds
    while True:
        left = end - time.time()
        if left <= 0:
            return out
        client.sock.settimeout(left)
        try:
            out.append(client.read_frame())
        except Closed as c:
            if c.code is not None:
                out.append((8, struct.pack("!H", c.code)))
            return out
        except (socket.timeout, OSError):
            return out


def error_codes(messages):
    codes = []
    for opcode, payload in messages:
        if opcode == 1:
            msg = json.loads(payload)
            if msg.get("type") == "error":
                codes.append(msg.get("code"))
    return codes


def main():
    port = int(sys.argv[1])
    codes, started, close_1009 = [], 0, False

    # 1. Malformed messages, then a session dropped with a TCP reset.
    c = WsClient(port)
    for m in ["not json", '{"type":"nope"}',
              '{"type":"session.start","period_ms":-5,"tokens_per_frame":1}',
              '{"type":"frame","session":999999,"ids":[1]}',
              '{"type":"session.end","session":12345}']:
        c.send_text(m)
    c.send_binary(b"M\x01\0\0")  # a binary frame cut short
    c.send_text('{"type":"session.start","period_ms":40,"tokens_per_frame":1}')
    msgs = messages_for(c, 1.0)
    codes += error_codes(msgs)
    sid = None
    for opcode, payload in msgs:
        if opcode == 1 and json.loads(payload).get("type") == "session.started":
            sid = json.loads(payload)["session"]
            started += 1
    if sid is not None:
        for k in range(3):
            c.send_json({"type": "frame", "session": sid, "index": k, "ids": [1]})
            time.sleep(0.04)
        c.send_json({"type": "frame", "session": sid, "index": 3, "ids": [1 << 30]})
        codes += error_codes(messages_for(c, 0.3))
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close_socket()

    # 2. A live session, then a message over the 1 MiB limit: the server closes with 1009.
    c = WsClient(port)
    c.send_text('{"type":"session.start","period_ms":40,"tokens_per_frame":1}')
    messages_for(c, 0.5)
    try:
        c.send_text('{"type":"ping","pad":"' + "x" * (1 << 20) + '"}')
    except OSError:
        pass  # the server may close before the whole message is sent; its 1009 can still be read
    for opcode, payload in messages_for(c, 2.0):
        if opcode == 8 and len(payload) >= 2 and struct.unpack("!H", payload[:2])[0] == 1009:
            close_1009 = True
    c.close_socket()

    # 3. Half an HTTP request, then gone.
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /v1/sta")
    s.close()

    print(f"round: errors {','.join(sorted(set(x for x in codes if x)))} ({len(codes)}); "
          f"session started then reset: {started}; over-size message closed with 1009: "
          f"{'yes' if close_1009 else 'no (connection reset first)'}")


if __name__ == "__main__":
    try:
        main()
    except (ConnectionError, OSError, RuntimeError) as e:
        print(f"round failed: {e}", file=sys.stderr)
        sys.exit(1)
