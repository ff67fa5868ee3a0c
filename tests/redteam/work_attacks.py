"""Issue 36's admission attacks, replayed against `metronome serve` with its default admission
(aimd in units of work, a start-up calibration that prices every session), on loopback. Driven by
tests/redteam/redteam.sh (`--only work`), which starts the server with its serving defaults and
`--max-sessions` (the hint attack fills it).

  work_attacks.py --port P --max-sessions N [--short]

Each attack has an honest victim session running beside it (a 40 ms period, one token in and one
out, deadline 40 ms); the checks are the issue's "done when": honest sessions keep p99 <= 0.5 D and
are admitted, and the budget stays >= 0.8 of its value before the attack. Exit status 1 if any
check failed.
"""

import argparse
import os
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsclient import WsClient, get_json  # noqa: E402
from checks import check, failures  # noqa: E402

VICTIM_PERIOD_MS = 40.0
# How long a churn client waits for the answer to a frame that carries an 8192-token prompt.
PROMPT_READ_TIMEOUT_S = 30.0


def start_reply(c, **fields):
    """session.start (an 80 ms period unless `fields` says otherwise, the server's defaults for
    the rest); the answer."""
    msg = {"type": "session.start", "period_ms": 80}
    msg.update(fields)
    c.send_json(msg)
    while True:
        reply = c.read_json()
        if reply.get("type") in ("session.started", "session.rejected", "error"):
            return reply


def read_result_or_end(c, sid):
    """Reads until the answer to the session's frame (frame.result, or an error: the frame was
    dropped) or the session's end; returns the type."""
    while True:
        msg = c.read_json()
        if msg.get("type") in ("frame.result", "error", "session.ended") and (
                msg.get("session") == sid):
            return msg["type"]


def limit(port):
    return get_json(port, "/v1/stats")["admission"]["limit"]


class Victim:
    """An honest session sending one token every period from its own thread; collects the
    server's latency_ms of every result."""

    def __init__(self, port):
        self.c = WsClient(port)
        reply = start_reply(self.c, period_ms=VICTIM_PERIOD_MS, deadline_ms=VICTIM_PERIOD_MS,
                            tokens_per_frame=1, output_tokens_per_frame=1)
        if reply["type"] != "session.started":
            raise RuntimeError(f"the victim was refused: {reply}")
        self.sid = reply["session"]
        self.latencies = []
        self.sent = 0
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.writer = threading.Thread(target=self._write, daemon=True)
        self.reader.start()
        self.writer.start()

    def _write(self):
        t0 = time.monotonic()
        while not self.stop.is_set():
            self.c.send_json({"type": "frame", "session": self.sid, "ids": [self.sent % 200 + 1]})
            self.sent += 1
            next_t = t0 + self.sent * VICTIM_PERIOD_MS / 1000.0
            time.sleep(max(0.0, next_t - time.monotonic()))

    def _read(self):
        try:
            while True:
                msg = self.c.read_json()
                if msg.get("type") == "frame.result":
                    self.latencies.append(msg["latency_ms"])
                elif msg.get("type") == "session.ended":
                    return
        except Exception:  # the socket closed under us at the end
            return

    def finish(self):
        self.stop.set()
        self.writer.join()
        time.sleep(0.2)  # the last results
        self.c.send_json({"type": "session.end", "session": self.sid})
        self.reader.join(timeout=5)
        self.c.close_socket()
        lat = sorted(self.latencies)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("inf")
        return p99, len(lat), self.sent


def check_victim(name, victim):
    p99, got, sent = victim.finish()
    worst = ", ".join(f"{x:.1f}" for x in sorted(victim.latencies)[-4:])
    check(f"{name}: the honest session keeps p99 <= 0.5 D", p99 <= 0.5 * VICTIM_PERIOD_MS,
          f"p99 {p99:.2f} ms of D {VICTIM_PERIOD_MS:g} ms; worst {worst} ms")
    check(f"{name}: the honest session's frames come back", got >= 0.95 * sent,
          f"{got} of {sent}")


def attack_impossible_deadline(port):
    """1: a session declaring a deadline no frame can meet must not collapse everyone's
    admission (it was accepted, the shared p99/D signal jumped and the limit fell to 1)."""
    victim = Victim(port)
    before = limit(port)
    c = WsClient(port)
    for deadline in (1e-4, 1e-300):
        reply = start_reply(c, deadline_ms=deadline, tokens_per_frame=1, output_tokens_per_frame=1)
        check(f"deadline: {deadline:g} ms is refused at the door with its reason",
              reply.get("type") == "session.rejected" and reply.get("reason") == "deadline",
              str(reply))
        check(f"deadline: {deadline:g} ms gets no retry hint (change the request)",
              reply.get("retry_after_ms") == 0, str(reply.get("retry_after_ms")))
    time.sleep(2.0)
    stats = get_json(port, "/v1/stats")
    check("deadline: /v1/stats' tightest deadline is an honest one",
          stats["deadline_ms"] is None or stats["deadline_ms"] >= 1.0, str(stats["deadline_ms"]))
    admitted = 0
    honest = []
    for _ in range(10):
        h = WsClient(port)
        reply = start_reply(h, tokens_per_frame=1, output_tokens_per_frame=1)
        admitted += reply.get("type") == "session.started"
        honest.append(h)
    check("deadline: the 10 honest starts after it are admitted", admitted == 10, f"{admitted}")
    for h in honest:
        h.close_socket()
    after = limit(port)
    check("deadline: the budget stays >= 0.8 of its value before", after >= 0.8 * before,
          f"{before} -> {after}")
    c.close_socket()
    check_victim("deadline", victim)


def attack_heavy_session(port, seconds):
    """2: a session priced as one session could cost a whole engine. Now each is priced by what
    it declares: one heavier than a session may be is refused at the door, and an admitted heavy
    one takes its share of the budget and cannot push the victim past its deadline."""
    c = WsClient(port)
    reply = start_reply(c, period_ms=10, deadline_ms=10, tokens_per_frame=4096,
                        output_tokens_per_frame=1)
    check("heavy: 4096 tokens every 10 ms is refused at the door",
          reply.get("type") == "session.rejected"
          and reply.get("reason") in ("period", "work", "deadline"), str(reply))
    victim = Victim(port)
    before = limit(port)
    # 64 tokens a frame attending to a full window, at a period its frame allows: tens of
    # reference sessions' work in one session, within the budget.
    period_ms = 200
    tokens = 64
    reply = start_reply(c, period_ms=period_ms, deadline_ms=period_ms, tokens_per_frame=tokens,
                        output_tokens_per_frame=1)
    if reply.get("type") == "session.started":
        sid = reply["session"]
        row = [s for s in get_json(port, "/v1/stats")["sessions"]["list"] if s["id"] == sid]
        work = row[0].get("work", 0) if row else 0
        check("heavy: 64 tokens a frame is priced as many reference sessions", work > 5.0,
              f"work {work}")
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < seconds:
            c.send_json({"type": "frame", "session": sid,
                         "ids": [(n + k) % 200 + 1 for k in range(tokens)]})
            n += 1
            time.sleep(max(0.0, t0 + n * period_ms / 1000.0 - time.monotonic()))
        c.send_json({"type": "session.end", "session": sid})
    else:
        check("heavy: 64 tokens a frame is admitted at a period its frame allows", False,
              str(reply))
        time.sleep(seconds)
    c.close_socket()
    check_victim("heavy", victim)
    after = limit(port)
    check("heavy: the budget stays >= 0.8 of its value before", after >= 0.8 * before,
          f"{before} -> {after}")


def attack_prompt_churn(port, seconds):
    """3: sessions declaring one token a frame but carrying the longest prompt the server takes,
    started and ended in a loop over two connections: a prompt delays its own start only."""
    max_prompt = get_json(port, "/v1/stats")["caps"]["max_prompt_tokens"] or 8192
    prompt = [(k % 200) + 1 for k in range(min(8192, max_prompt))]
    victim = Victim(port)
    before = limit(port)
    started = [0]
    errors = []
    stop = threading.Event()

    def churn():
        c = WsClient(port)
        # A session's first frame carries its prompt, so its answer waits for the prompt's
        # prefill (in what the victim's frames leave): seconds on a slow CPU, past the client's
        # default read timeout.
        c.sock.settimeout(PROMPT_READ_TIMEOUT_S)
        sid = None
        try:
            while not stop.is_set():
                reply = start_reply(c, tokens_per_frame=1, output_tokens_per_frame=1,
                                    prompt={"ids": prompt})
                if reply.get("type") == "session.started":
                    started[0] += 1
                    sid = reply["session"]
                    c.send_json({"type": "frame", "session": sid, "ids": [1]})
                    # The server may end the session before answering (its idle or deadline
                    # rules on a loaded machine): then there is no frame.result to wait for.
                    if read_result_or_end(c, sid) != "session.ended":
                        c.send_json({"type": "session.end", "session": sid})
                        c.read_type("session.ended")
                    sid = None
                else:
                    time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 (printed as a note below)
            errors.append(repr(e))
            if sid is not None:  # end it: a dropped connection would keep it for a resume
                try:
                    c.send_json({"type": "session.end", "session": sid})
                except OSError:
                    pass  # the connection is gone already
        finally:
            c.close_socket()

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=PROMPT_READ_TIMEOUT_S + 10)
    check("prompt: the churn ran (sessions with the longest prompt started and ended)",
          started[0] >= 2, f"{started[0]} sessions of {len(prompt)} prompt tokens")
    # A churn client's own failure (a dropped connection on a loaded machine) is reported, not
    # judged: the attack's checks are the victim's and the budget's.
    if errors:
        print(f"NOTE: prompt: churn client errors: {errors}", flush=True)
    check_victim("prompt", victim)
    after = limit(port)
    check("prompt: the budget stays >= 0.8 of its value before", after >= 0.8 * before,
          f"{before} -> {after}")


def attack_retry_hints(port, max_sessions):
    """5: with the server full, a client that obeys every hint exactly is told to wait longer
    each time (hints grow with its rejections in a row) and never less than a period."""
    holders = []
    for _ in range(max_sessions):
        h = WsClient(port)
        reply = start_reply(h, period_ms=1000, deadline_ms=1000, tokens_per_frame=1,
                            output_tokens_per_frame=1)
        if reply.get("type") != "session.started":
            break
        holders.append(h)
    c = WsClient(port)
    hints = []
    for _ in range(3):
        reply = start_reply(c, period_ms=40, deadline_ms=40, tokens_per_frame=1,
                            output_tokens_per_frame=1)
        if reply.get("type") != "session.rejected":
            break
        hints.append(reply["retry_after_ms"])
        time.sleep(min(reply["retry_after_ms"], 2000) / 1000.0)
    check("hints: a full server rejects every retry", len(hints) == 3, str(hints))
    check("hints: no hint is shorter than the period", all(h >= 40 for h in hints), str(hints))
    check("hints: each hint is longer than the last (they grow with the client's rejections)",
          all(b > a or b >= 30000 for a, b in zip(hints, hints[1:])), str(hints))
    check("hints: jittered, not the period exactly", any(h != 40.0 for h in hints), str(hints))
    c.close_socket()
    for h in holders:
        h.close_socket()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-sessions", type=int, required=True)
    ap.add_argument("--short", action="store_true")
    a = ap.parse_args()
    seconds = 3.0 if a.short else 10.0
    attack_impossible_deadline(a.port)
    attack_heavy_session(a.port, seconds)
    attack_prompt_churn(a.port, seconds)
    attack_retry_hints(a.port, a.max_sessions)
    print(f"work attacks: {len(failures)} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
