"""The red-team attacks of issue 11, replayed against a live `metronome serve` on loopback, and
the health checks after them. Driven by tests/redteam/redteam.sh (which starts and stops the
server); see that script for the server's flags these attacks assume.

  attacks.py --port P --pid PID --section edge|hog|squat|all [--short]   attacks, then health
  attacks.py --port P --shutdown-client READY_FILE                  holds a session through SIGTERM

Sections: `edge` (connection slots, handshake deadline, strict JSON, Sec-WebSocket-Key, HEAD,
Origin, the HTTP status codes of bad requests, abrupt disconnects), `hog` (issue 11 part A:
per-session leak, declared rate, text vs declared tokens_per_frame) and `squat` (issue 36, attack
4: idle sessions and session-less WebSockets holding every slot; needs the server's idle flags and
agent port from redteam.sh). Exit status 1 if any check failed.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsclient import Closed, WsClient, get_json, http_request  # noqa: E402
from checks import check, failures  # noqa: E402



def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def kv_used(port):
    return get_json(port, "/v1/stats")["kv"]["used_blocks"]


def legit_session(port, frames=3):
    """A well-behaved client: start, `frames` frames answered, end. True if all went as promised."""
    c = WsClient(port)
    try:
        sid = c.start()
        for i in range(frames):
            c.send_json({"type": "frame", "session": sid, "index": i, "ids": [1, 2]})
            r = c.read_type("frame.result")
            if r.get("session") != sid:
                return False
            time.sleep(0.04)
        c.send_json({"type": "session.end", "session": sid})
        return c.read_type("session.ended").get("reason") == "client"
    finally:
        c.close_socket()


def served_within(fn, seconds):
    """Seconds until fn() first returned True (retrying), or None if it never did in time."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if fn():
                return time.monotonic() - t0
        except (OSError, ConnectionError, Closed, RuntimeError):
            pass
        time.sleep(0.05)
    return None


# --- edge ---------------------------------------------------------------------------------------

def attack_slowloris(port, sockets, seconds):
    """More trickling half-header sockets than --max-connections, reconnecting when dropped; a
    legitimate /healthz and session must still be served (within 5 s: only a lockout fails)."""
    stop = threading.Event()
    reconnects = [0]

    def connect():
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        reconnects[0] += 1
        return s

    def run():
        socks = []
        for _ in range(sockets):
            try:
                socks.append(connect())
            except OSError:
                socks.append(None)
        while not stop.is_set():
            for i, s in enumerate(socks):
                try:
                    if s is None:
                        raise OSError("reconnect")
                    s.send(b"a")
                except OSError:
                    try:
                        if s is not None:
                            s.close()
                        socks[i] = connect()
                    except OSError:
                        socks[i] = None
            time.sleep(0.05)
        for s in socks:
            if s is not None:
                s.close()

    t = threading.Thread(target=run)
    t.start()
    try:
        time.sleep(1.0)  # the cap is full and cycling
        worst_health = 0.0
        worst_session = 0.0
        end = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < end or rounds == 0:
            rounds += 1
            h = served_within(lambda: http_request(port, "GET", "/healthz")[0] == 200, 5)
            s = served_within(lambda: legit_session(port, frames=1), 5)
            worst_health = max(worst_health, h if h is not None else 99)
            worst_session = max(worst_session, s if s is not None else 99)
        check("slowloris: /healthz still served", worst_health < 5,
              f"worst {worst_health:.2f} s over {rounds} rounds, {reconnects[0]} slow connects")
        check("slowloris: a session still works", worst_session < 5,
              f"worst {worst_session:.2f} s")
    finally:
        stop.set()
        t.join()


def attack_header_deadline(port, timeout_ms):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_ms / 1000 + 5)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")
    t0 = time.monotonic()
    try:
        data = s.recv(1)
        closed = data == b""
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    s.close()
    check("an unfinished request header is closed at the handshake deadline", closed,
          f"after {time.monotonic() - t0:.2f} s, deadline {timeout_ms} ms")


def attack_bad_json(port):
    c = WsClient(port)
    try:
        for name, payload in [("NUL then garbage", b'{"type":"ping"}\x00garbage'),
                              ("two values", b'{"type":"ping"}{"type":"ping"}'),
                              ("trailing junk", b'{"type":"ping"} x')]:
            c.send_text(payload)
            r = c.read_json()
            check(f"strict JSON: {name} is bad_json", r.get("code") == "bad_json", json.dumps(r))
        c.send_json({"type": "ping", "nonce": 5})
        check("strict JSON: the connection goes on", c.read_json().get("type") == "pong")
    finally:
        c.close_socket()


def attack_handshake(port):
    for key in ["x", "dGhlIHNhbXBsZSBub25jZR==", "not base64 at all!!!!!!!"]:
        try:
            WsClient(port, key=key)
            status = 101
        except ConnectionError as e:
            status = int(str(e).split()[-1]) if "refused" in str(e) else -1
        check(f"Sec-WebSocket-Key {key!r} refused", status == 400, f"status {status}")
    status, hdrs, body = http_request(port, "HEAD", "/healthz")
    check("HEAD /healthz answered like GET without a body",
          status == 200 and body == b"" and hdrs.get("content-length") == "2",
          f"{status} {hdrs.get('content-length')}")
    try:
        WsClient(port, headers={"Origin": "https://evil.example"})
        status = 101
    except ConnectionError as e:
        status = int(str(e).split()[-1]) if "refused" in str(e) else -1
    check("a cross-site Origin may not upgrade (no token set)", status == 403, f"status {status}")
    c = WsClient(port, headers={"Origin": "http://localhost:3000"})
    c.close_socket()
    check("a loopback Origin may upgrade", c.status == 101)


def raw_status(port, request):
    """The status code of the answer to raw request bytes, or None when the server closed (or
    reset) without one."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    finally:
        s.close()
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None


def attack_http_statuses(port):
    """A request the server cannot serve as sent is answered with HTTP's status for it, not a
    silent close or a 404."""
    cases = [("malformed request line", b"GARBAGE\r\n\r\n", 400),
             ("header too large", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16384
              + b"\r\n\r\n", 431),
             ("HTTP/2.0 start line", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505),
             ("GET /v1/realtime without the upgrade",
              b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 426)]
    for name, request, want in cases:
        got = raw_status(port, request)
        check(f"HTTP: {name} is {want}", got == want, f"status {got}")


def continuity(port):
    return get_json(port, "/v1/stats")["continuity"]


def no_session_left(port, resume_window_s):
    """Waits out the resume window of dropped sessions; True once none is left and no block used."""
    return served_within(lambda: get_json(port, "/v1/stats")["sessions"]["active"] == 0
                         and kv_used(port) == 0, resume_window_s + 5) is not None


def attack_abrupt_disconnects(port, n, max_detached, resume_window_s):
    """Sessions opened, fed and dropped without a close frame: they wait for session.resume, at
    most max_detached of them from this address, and every block comes back after the window."""
    most = 0
    for _ in range(n):
        c = WsClient(port)
        sid = c.start(kv={"policy": "full"})
        for i in range(3):
            c.send_json({"type": "frame", "session": sid, "index": i, "ids": [1, 2]})
        c.close_socket()
        most = max(most, continuity(port)["detached"])
    time.sleep(0.2)
    most = max(most, continuity(port)["detached"])
    check("abrupt: one address keeps at most --max-detached-per-address sessions waiting",
          0 < most <= max_detached, f"at most {most} waiting of {n} dropped, cap {max_detached}")
    check("abrupt: after the resume window every session ended and every block came back",
          no_session_left(port, resume_window_s),
          f"{get_json(port, '/v1/stats')['sessions']['active']} sessions, {kv_used(port)} blocks")


def attack_resume(port, max_sessions_per_connection):
    """Hostile session.resume: a flood of garbage tokens, an oversized one, a forged origin (this
    server has no cluster secret: refused before any request leaves it), a token resumed twice,
    and a resume into a connection already at its session cap."""
    c = WsClient(port)
    reasons = set()
    for i in range(300):
        c.send_json({"type": "session.resume", "resume_token": f"mtr1.x.{i}.{'0' * 32}.bQ"})
        reasons.add(c.read_type("session.rejected").get("reason"))
    check("resume: 300 garbage tokens are each refused as resume_token", reasons == {"resume_token"},
          str(reasons))
    c.send_json({"type": "ping"})
    check("resume: the connection goes on after them", c.read_type("pong").get("type") == "pong")
    c.send_json({"type": "session.resume", "resume_token": "mtr1." + "A" * 60000})
    reply = c.read_json()
    check("resume: a 60 kB token is refused as a bad field, named",
          reply.get("code") == "bad_field" and "resume_token" in reply.get("message", ""),
          str(reply)[:200])
    owner = WsClient(port)
    owner.start()
    token = owner.last_started["resume_token"]
    parts = token.split(".")
    # The same session and secret, but another origin: a client cannot point the server at an
    # address of its choosing.
    forged = ".".join(["mtr1", "aHR0cDovLzEyNy4wLjAuMTox"] + parts[2:])  # http://127.0.0.1:1
    c.send_json({"type": "session.resume", "resume_token": forged})
    reply = c.read_json()
    check("resume: a forged origin is refused without a fetch", reply.get("reason") in
          ("resume_origin", "resume_token"), str(reply)[:200])
    c.send_json({"type": "session.resume", "resume_token": token})
    first = c.read_type("session.resumed")
    c.send_json({"type": "session.resume", "resume_token": token})
    reply = c.read_json()
    check("resume: a spent token is refused", first.get("type") == "session.resumed"
          and reply.get("reason") == "resume_unknown", f"{first} then {reply}"[:300])
    for _ in range(max_sessions_per_connection - 1):
        c.start()
    c.send_json({"type": "session.resume", "resume_token": first["resume_token"]})
    reply = c.read_json()
    check("resume: a resume into a full connection is too_many_sessions",
          reply.get("code") == "too_many_sessions", str(reply)[:200])
    owner.close_socket()
    c.close_socket()


# --- hog (part A) -------------------------------------------------------------------------------

def attack_churn_leak(port, pid, sessions):
    """Per-session leak: RSS after `sessions` start/end cycles with prompts must stay flat."""
    c = WsClient(port)
    def cycle(count):
        for _ in range(count):
            sid = c.start(prompt={"ids": [1] * 256})
            c.send_json({"type": "session.end", "session": sid})
            c.read_type("session.ended")
    cycle(sessions // 4)  # warm the allocator
    before = rss_kb(pid)
    cycle(sessions)
    after = rss_kb(pid)
    c.close_socket()
    per_session = (after - before) * 1024 / sessions
    check("churn: RSS flat across session churn", per_session < 100,
          f"{before} -> {after} kB over {sessions} sessions, {per_session:.0f} B each")


def attack_rate_hog(port, seconds):
    """A full-KV session declaring period 10000 ms and 1 token per frame, sending back to back:
    its KV must stay within what admission budgeted (or it is told and ended)."""
    total = get_json(port, "/v1/stats")["kv"]["total_blocks"]
    c = WsClient(port)
    sid = c.start(period_ms=10000, tokens_per_frame=1, kv={"policy": "full"})
    end = time.monotonic() + seconds
    refused = 0
    c.sock.settimeout(0.001)
    while time.monotonic() < end:
        try:
            c.send_json({"type": "frame", "session": sid, "ids": [1]})
            while True:
                msg = c.read_json()
                if msg.get("type") == "error":
                    refused += 1
                if msg.get("type") == "session.ended":
                    end = 0
                    break
        except (socket.timeout, BlockingIOError):
            pass
        except Closed:
            break
    c.sock.settimeout(5)
    used = kv_used(port)
    c.close_socket()
    check("rate hog: one session cannot take the pool", used < total // 4,
          f"{used} of {total} blocks used, {refused} frames refused")


def attack_text_hog(port):
    """Text frames must respect the declared tokens_per_frame, as id frames do."""
    c = WsClient(port)
    try:
        sid = c.start(tokens_per_frame=1)
        c.send_json({"type": "frame", "session": sid, "text": "hello world " * 200})
        r = c.read_json()
        check("text hog: a text over tokens_per_frame is over_cap", r.get("code") == "over_cap",
              json.dumps(r)[:200])
    finally:
        c.close_socket()


# --- squat (issue 36, attack 4) -------------------------------------------------------------------

def agent_line(agent_port):
    s = socket.create_connection(("127.0.0.1", agent_port), timeout=5)
    data = b""
    try:
        while True:
            chunk = s.recv(1024)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    return data.decode()


def probe_status(port, path):
    """GET path's status, or None when the connection was refused, reset or left unanswered."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def wait_closed(client, seconds):
    """(what ended the connection: 'close CODE REASON' or 'dropped', seconds waited), or (None,
    seconds) if it stayed open."""
    t0 = time.monotonic()
    client.sock.settimeout(seconds)
    try:
        while True:
            client.read_frame()
    except Closed as e:
        return (f"close {e.code} {e.reason}" if e.code else "dropped"), time.monotonic() - t0
    except (socket.timeout, OSError):
        return None, time.monotonic() - t0


def attack_squat(port, agent_port, max_connections, idle_max_ms, connection_idle_ms, limit):
    """Every WebSocket slot held: first by connections with no session, then by squatters, each
    holding one idle session (period 10 s) and sending nothing. Probes are answered throughout,
    the agent and /readyz say when no slot is free, a newcomer's upgrade gets 503 (not a reset);
    the squatters' sessions end with reason idle within the idle timeout and their connections
    close; a session-less connection closes within its timeout."""
    probes = {"/healthz": [0, 0], "/readyz": [0, 0], "/metrics": [0, 0]}  # path: [asked, unanswered]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            for path, counts in probes.items():
                counts[0] += 1
                if probe_status(port, path) is None:
                    counts[1] += 1
            time.sleep(0.1)

    bare_count = 4
    bare = [WsClient(port) for _ in range(bare_count)]
    poller = threading.Thread(target=poll)
    poller.start()
    squatters = []
    try:
        t_start = time.monotonic()
        for _ in range(max_connections - bare_count):
            c = WsClient(port)
            c.start(period_ms=10000, deadline_ms=10000, tokens_per_frame=1)
            squatters.append(c)
        free = bare_count
        cap = min(limit, len(squatters) + free)
        want = f"up ready {-(-100 * free // cap)}% maxconn:{cap}\n"
        # Published after the engine thread's next turn: wait for it, briefly.
        served_within(lambda: agent_line(agent_port) == want, 2)
        line = agent_line(agent_port)
        check("squat: the agent counts the free slots", line == want, f"{line!r}, want {want!r}")
        # The last slots: the session-less connections make room for squatters.
        for _ in range(bare_count):
            c = WsClient(port)
            c.start(period_ms=10000, deadline_ms=10000, tokens_per_frame=1)
            squatters.append(c)
        evicted = [wait_closed(b, 2)[0] for b in bare]
        check("squat: session-less connections make room for sessions",
              all(e is not None for e in evicted), str(evicted))
        want = f"up drain maxconn:{max_connections}\n"
        served_within(lambda: agent_line(agent_port) == want, 2)
        line = agent_line(agent_port)
        check("squat: every slot held: the agent drains", line == want, f"{line!r}, want {want!r}")
        status = probe_status(port, "/readyz")
        check("squat: every slot held: /readyz 503", status == 503, f"status {status}")
        try:
            WsClient(port)
            status = 101
        except ConnectionError as e:
            status = int(str(e).split()[-1]) if "refused" in str(e) else str(e)
        except OSError as e:
            status = str(e)
        check("squat: every slot held: an upgrade gets 503, not a reset", status == 503,
              f"{status}")
        # The squatters' sessions end as idle, then their connections close.
        reasons = []
        late = 0.0
        for c in squatters:
            c.sock.settimeout(max(0.1, idle_max_ms / 1000 + 3 - (time.monotonic() - t_start)))
            try:
                msg = c.read_type("session.ended")
                reasons.append(msg.get("reason"))
            except (Closed, OSError, RuntimeError) as e:
                reasons.append(f"none ({type(e).__name__})")
            late = max(late, time.monotonic() - t_start)
        check("squat: every idle session ends with reason idle", reasons == ["idle"] * len(reasons),
              f"{reasons}")
        check("squat: within the idle timeout (+ slack)", late < idle_max_ms / 1000 + 3,
              f"last after {late:.2f} s, timeout {idle_max_ms} ms")
        deadline = time.monotonic() + connection_idle_ms / 1000 + 3
        closes = [wait_closed(c, max(0.1, deadline - time.monotonic())) for c in squatters]
        check("squat: their connections close once they hold no session",
              all(what is not None and what.startswith("close 1000 idle") for what, _ in closes),
              f"{[what for what, _ in closes][:3]}, slowest {max(t for _, t in closes):.2f} s")
        try:
            lone = WsClient(port)
            what, waited = wait_closed(lone, connection_idle_ms / 1000 + 3)
            lone.close_socket()
        except (ConnectionError, OSError) as e:
            what, waited = f"no upgrade: {e}", 0.0
        check("squat: a connection that never starts a session is closed",
              what is not None and what.startswith("close 1000 idle"),
              f"{what} after {waited:.2f} s, timeout {connection_idle_ms} ms")
    finally:
        stop.set()
        poller.join()
        for c in bare + squatters:
            c.close_socket()
    unanswered = {path: counts[1] for path, counts in probes.items()}
    asked = sum(counts[0] for counts in probes.values())
    check("squat: /healthz, /readyz and /metrics answered throughout",
          asked > 0 and all(n == 0 for n in unanswered.values()),
          f"{asked} probes, unanswered {unanswered}")
    status = served_within(lambda: probe_status(port, "/readyz") == 200, 5)
    check("squat: /readyz 200 once the squatters are gone", status is not None)


# --- after the attacks --------------------------------------------------------------------------

def health(port, pid, baseline_fds, baseline_rss_kb):
    status = http_request(port, "GET", "/healthz")[0]
    check("after: /healthz 200", status == 200, f"status {status}")
    check("after: a legitimate session works", served_within(lambda: legit_session(port), 5)
          is not None)
    fds_ok = served_within(lambda: fd_count(pid) <= baseline_fds, 5)
    check("after: open fds back to baseline", fds_ok is not None,
          f"{fd_count(pid)} now, {baseline_fds} before")
    kv_ok = served_within(lambda: kv_used(port) == 0, 5)
    check("after: 0 KV blocks used", kv_ok is not None, f"{kv_used(port)} used")
    rss = rss_kb(pid)
    print(f"after: RSS {baseline_rss_kb} kB before the attacks, {rss} kB after", flush=True)
    check("after: RSS grew less than 64 MiB", rss - baseline_rss_kb < 64 * 1024)


def shutdown_client(port, ready_file):
    """Holds a session until the server goes down; exit 0 iff it saw session.ended with reason
    server_shutdown and a 1001 close frame."""
    c = WsClient(port)
    # A long period: the idle timeout (redteam.sh's, 2 s for it) is far beyond the shutdown.
    sid = c.start(period_ms=10000, deadline_ms=10000)
    with open(ready_file, "w") as f:
        f.write(str(sid))
    c.sock.settimeout(30)
    reason = None
    code = None
    try:
        while True:
            msg = c.read_json()
            if msg.get("type") == "session.ended":
                reason = msg.get("reason")
    except Closed as e:
        code = e.code
    ok = reason == "server_shutdown" and code == 1001
    print(f"shutdown client: session.ended reason {reason}, close code {code}", flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int)
    p.add_argument("--section", choices=["edge", "hog", "squat", "all"], default="all")
    p.add_argument("--short", action="store_true")
    p.add_argument("--max-connections", type=int, default=16)
    p.add_argument("--handshake-timeout-ms", type=int, default=1000)
    p.add_argument("--agent-port", type=int)
    p.add_argument("--idle-max-ms", type=int, default=2000)
    p.add_argument("--connection-idle-ms", type=int, default=2000)
    p.add_argument("--limit", type=int, default=64, help="the server's static admission limit")
    p.add_argument("--resume-window-s", type=float, default=2.0)
    p.add_argument("--max-detached-per-address", type=int, default=8)
    p.add_argument("--max-sessions-per-connection", type=int, default=4)
    p.add_argument("--shutdown-client")
    a = p.parse_args()
    if a.shutdown_client:
        return shutdown_client(a.port, a.shutdown_client)
    time.sleep(0.2)
    baseline_fds = fd_count(a.pid)
    baseline_rss = rss_kb(a.pid)
    if a.section in ("edge", "all"):
        attack_header_deadline(a.port, a.handshake_timeout_ms)
        attack_bad_json(a.port)
        attack_handshake(a.port)
        attack_http_statuses(a.port)
        attack_abrupt_disconnects(a.port, 20 if a.short else 200, a.max_detached_per_address,
                                  a.resume_window_s)
        attack_resume(a.port, a.max_sessions_per_connection)
        attack_slowloris(a.port, a.max_connections + 10, 3 if a.short else 30)
    if a.section in ("hog", "all"):
        attack_text_hog(a.port)
        attack_rate_hog(a.port, 3 if a.short else 20)
        attack_churn_leak(a.port, a.pid, 2000 if a.short else 20000)
    if a.section in ("squat", "all"):
        # The hog attacks' dropped sessions wait out their resume window first: the squat counts
        # every slot.
        check("squat: no session left from before", no_session_left(a.port, a.resume_window_s))
        attack_squat(a.port, a.agent_port, a.max_connections, a.idle_max_ms,
                     a.connection_idle_ms, a.limit)
    health(a.port, a.pid, baseline_fds, baseline_rss)
    print(f"redteam: {len(failures)} failed" + (": " + ", ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
