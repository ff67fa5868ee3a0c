#!/usr/bin/env python3
"""Hostile clients of issue 11 (items 2 and 3) against a live `metronome serve`, beside a victim.

Usage: hog_attacks.py --url ws://127.0.0.1:PORT --attack kv|text [--hogs N] [--seconds S]
Runs N hog connections for S seconds and prints one JSON line: what the hogs sent, how many of
their frames were answered and refused (by error code), how their sessions ended, and the largest
KV occupancy seen in /v1/stats. The victim is a separate `metronome loadgen` run (see
hog_attacks.sh). Standard library only: a minimal RFC 6455 client (masked text frames out,
unfragmented frames in).

  kv:   full-KV sessions declaring period 10000 ms and 1 token per frame, sending frames back to
        back (item 2: they used to fill the pool and starve an earlier window session).
  text: sessions declaring period 40 ms and 1 token per frame, sending ~4000-token texts every
        40 ms (item 3: text used to bypass the declared count).
"""
import argparse
import base64
import collections
import json
import os
import socket
import struct
import threading
import time
import urllib.request


class Ws:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.lock = threading.Lock()

    def send(self, obj):
        data = json.dumps(obj).encode()
        n = len(data)
        header = bytes([0x81])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        with self.lock:
            self.sock.sendall(header + mask + masked)

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def recv(self):
        """The next text message as a dict; None for a close frame."""
        while True:
            self._need(2)
            opcode = self.buf[0] & 0x0F
            n = self.buf[1] & 0x7F
            off = 2
            if n == 126:
                self._need(4)
                n = struct.unpack(">H", self.buf[2:4])[0]
                off = 4
            elif n == 127:
                self._need(10)
                n = struct.unpack(">Q", self.buf[2:10])[0]
                off = 10
            self._need(off + n)
            payload, self.buf = self.buf[off:off + n], self.buf[off + n:]
            if opcode == 0x8:
                return None
            if opcode == 0x1:
                return json.loads(payload)


def stats(http):
    with urllib.request.urlopen(http + "/v1/stats", timeout=5) as r:
        return json.load(r)


def hog(host, port, attack, seconds, tally):
    ws = Ws(host, port)
    if attack == "kv":
        start = {"type": "session.start", "period_ms": 10000, "tokens_per_frame": 1,
                 "output_tokens_per_frame": 1, "kv": {"policy": "full"}}
    else:
        start = {"type": "session.start", "period_ms": 40, "tokens_per_frame": 1,
                 "output_tokens_per_frame": 1}
    session = None
    deadline = time.monotonic() + seconds
    while session is None and time.monotonic() < deadline:
        ws.send(start)
        m = ws.recv()
        if m and m.get("type") == "session.started":
            session = m["session"]
        else:
            with tally.lock:
                tally.counts["start_" + (m or {}).get("type", "closed")] += 1
            time.sleep(0.2)
    if session is None:
        return
    done = threading.Event()

    def reader():
        try:
            while True:
                m = ws.recv()
                if m is None:
                    break
                kind = m.get("type")
                if kind == "error":
                    kind += ":" + m.get("code", "")
                elif kind == "session.ended":
                    kind += ":" + m.get("reason", "")
                with tally.lock:
                    tally.counts[kind] += 1
                if m.get("type") == "session.ended":
                    break
        except (ConnectionError, OSError):
            pass
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    text = " ".join(["word"] * 4000)
    i = 0
    while time.monotonic() < deadline and not done.is_set():
        frame = {"type": "frame", "session": session, "index": i}
        if attack == "kv":
            frame["ids"] = [1]
        else:
            frame["text"] = text
        try:
            ws.send(frame)
        except OSError:
            break
        with tally.lock:
            tally.counts["sent"] += 1
        i += 1
        if attack == "text":
            time.sleep(0.04)
        elif i % 50 == 0:
            time.sleep(0.001)  # back to back, yielding now and then to the reader thread
    try:
        ws.send({"type": "session.end", "session": session})
    except OSError:
        pass
    done.wait(2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--attack", choices=["kv", "text"], required=True)
    ap.add_argument("--hogs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    host, port = a.url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    http = f"http://{host}:{port}"

    class Tally:
        lock = threading.Lock()
        counts = collections.Counter()

    tally = Tally()
    threads = [threading.Thread(target=hog, args=(host, port, a.attack, a.seconds, tally))
               for _ in range(a.hogs)]
    for t in threads:
        t.start()
    peak = 0.0
    total = 0
    while any(t.is_alive() for t in threads):
        s = stats(http)
        total = s["kv"]["total_blocks"]
        peak = max(peak, s["kv"]["used_blocks"])
        time.sleep(0.2)
    for t in threads:
        t.join()
    print(json.dumps({"attack": a.attack, "hogs": a.hogs, "kv_peak_blocks": peak,
                      "kv_total_blocks": total, **dict(tally.counts)}))


if __name__ == "__main__":
    main()
