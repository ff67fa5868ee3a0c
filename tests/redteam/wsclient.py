"""A minimal WebSocket client (RFC 6455) and HTTP helpers on the Python 3 standard library, for
the red-team script (tests/redteam/redteam.sh). Client side only: masked frames out, text,
binary, ping and close frames in; no extensions, no fragmentation on send. Loopback use only:
every socket has a timeout, so nothing here can hang a test."""

import base64
import json
import os
import socket
import struct

TIMEOUT_S = 5.0


class Closed(Exception):
    """The server sent a close frame (code, reason) or dropped the connection (code None)."""

    def __init__(self, code, reason=""):
        super().__init__(f"closed: {code} {reason}")
        self.code = code
        self.reason = reason


def http_request(port, method, path, headers=None, body=b"", host="127.0.0.1"):
    """One HTTP/1.1 request on a fresh connection; returns (status, headers dict, body bytes).
    HEAD responses are read without a body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        if body:
            lines.append(f"Content-Length: {len(body)}")
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response header")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        hdrs = {}
        for line in header_lines:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if method == "HEAD" or status in (101, 204, 304):
            return status, hdrs, b""
        length = int(hdrs.get("content-length", "0"))
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, hdrs, rest[:length]
    finally:
        s.close()


def get_json(port, path):
    status, _, body = http_request(port, "GET", path)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status}")
    return json.loads(body)


class WsClient:
    def __init__(self, port, path="/v1/realtime", headers=None, key=None, host="127.0.0.1"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.buf = b""
        key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ")[1])
        if self.status != 101:
            self.sock.close()
            raise ConnectionError(f"upgrade refused: {self.status}")

    def close_socket(self):
        self.sock.close()

    def _send_frame(self, opcode, payload):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send_text(self, text):
        self._send_frame(0x1, text.encode() if isinstance(text, str) else text)

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def send_binary(self, payload):
        self._send_frame(0x2, payload)

    def _read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise Closed(None, "connection dropped")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self):
        """(opcode, payload) of the next complete message; answers pings; raises Closed."""
        while True:
            b0, b1 = self._read_exact(2)
            opcode = b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read_exact(8))[0]
            payload = self._read_exact(n)
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                try:
                    self._send_frame(0x8, payload[:2])
                except OSError:
                    pass
                raise Closed(code, payload[2:].decode(errors="replace"))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            return opcode, payload

    def read_json(self):
        _, payload = self.read_frame()
        return json.loads(payload)

    def read_type(self, type_, limit=200):
        for _ in range(limit):
            msg = self.read_json()
            if msg.get("type") == type_:
                return msg
        raise RuntimeError(f"no {type_} in {limit} messages")

    def start(self, **fields):
        msg = {"type": "session.start", "period_ms": 40, "deadline_ms": 1000,
               "tokens_per_frame": 2, "output_tokens_per_frame": 1,
               "kv": {"window": 32, "sinks": 4}}
        msg.update(fields)
        self.send_json(msg)
        reply = self.read_json()
        if reply.get("type") != "session.started":
            raise RuntimeError(f"session.start refused: {reply}")
        self.last_started = reply  # its resume_token, for session.resume
        return reply["session"]
