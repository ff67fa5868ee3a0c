"""Red team, issue 36 item 7: a GGUF whose weights hold NaN must not serve `[0,0,...]` marked ok.
Writes small GGUF files with `metronome export-gguf` (and `quantize`), patches NaN into them at the
offsets `metronome info --json` gives, serves each on loopback and checks what a client sees:

  - token 7's embedding row NaN (F32): a session fed token 7 gets `session.ended` with reason
    `nonfinite_logits` and no frame.result; a session in the same steps with clean tokens keeps
    getting ok frames; /healthz answers; metronome_sessions_ended_total{reason="nonfinite_logits"}
    counts exactly the one session.
  - every weight NaN (Q8_0, whose activation quantiser would turn the NaN into finite zeros): every
    session ends with `nonfinite_logits`, the server stays healthy.

  nonfinite.py --bin METRONOME        exit status 1 if any check failed
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsclient import WsClient, http_request  # noqa: E402
from checks import check, failures  # noqa: E402

POISONED_TOKEN = 7


def run(binary, *args):
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout


def poison(path, offset, size):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * size)  # NaN in F32 and F16; a NaN fp16 scale in every Q8_0 block


def tensors(binary, path):
    info = json.loads(run(binary, "info", "--model", path, "--json"))
    return info, {t["name"]: t for t in info["tensors"]}


class Server:
    """`metronome serve` on a file, on loopback, stopped on exit."""

    def __init__(self, binary, model, tmp):
        port_file = os.path.join(tmp, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
             "--port-file", port_file, "--threads", "1", "--kv-blocks", "256", "--window", "64",
             "--admission", "static:16", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("serve did not start: " + self.proc.stderr.read().decode())
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ended_counter(port):
    status, _, body = http_request(port, "GET", "/metrics")
    if status != 200:
        return None
    for line in body.decode().splitlines():
        if line.startswith('metronome_sessions_ended_total{reason="nonfinite_logits"}'):
            return float(line.split()[-1])
    return 0.0


def until_ended(client, sid):
    """Every message for `sid` up to and including its session.ended."""
    messages = []
    for _ in range(200):
        m = client.read_json()
        if m.get("session") == sid:
            messages.append(m)
            if m.get("type") == "session.ended":
                return messages
    return messages


def one_poisoned_row(binary, tmp):
    path = os.path.join(tmp, "tiny.gguf")
    run(binary, "export-gguf", "--model", "synthetic:tiny", "--out", path, "--dtype", "f32")
    info, by_name = tensors(binary, path)
    dim = info["config"]["dim"]
    poison(path, by_name["token_embd.weight"]["file_offset"] + POISONED_TOKEN * dim * 4, dim * 4)
    with Server(binary, path, tmp) as srv:
        good, bad = WsClient(srv.port), WsClient(srv.port)
        try:
            good_sid, bad_sid = good.start(), bad.start()
            # Both frames due in the same steps: the poisoned one must not take the other along.
            bad.send_json({"type": "frame", "session": bad_sid, "index": 0,
                           "ids": [1, POISONED_TOKEN]})
            good.send_json({"type": "frame", "session": good_sid, "index": 0, "ids": [1, 2]})
            got = until_ended(bad, bad_sid)
            results = [m for m in got if m.get("type") == "frame.result"]
            ended = got[-1] if got else {}
            check("a NaN logits row ends its session with reason nonfinite_logits",
                  ended.get("type") == "session.ended"
                  and ended.get("reason") == "nonfinite_logits", json.dumps(ended))
            check("no frame.result of the poisoned session is sent", not results,
                  json.dumps(results))
            outcomes = []
            for i in range(5):
                if i > 0:
                    time.sleep(0.04)
                    good.send_json({"type": "frame", "session": good_sid, "index": i,
                                    "ids": [3, 4]})
                r = good.read_type("frame.result")
                outcomes.append(r.get("outcome"))
            check("the clean session in the same steps keeps its ok frames",
                  outcomes == ["ok"] * 5, str(outcomes))
            good.send_json({"type": "session.end", "session": good_sid})
            check("the clean session ends as the client asked",
                  good.read_type("session.ended").get("reason") == "client")
        finally:
            good.close_socket()
            bad.close_socket()
        status, _, _ = http_request(srv.port, "GET", "/healthz")
        check("/healthz still answers 200", status == 200, str(status))
        n = ended_counter(srv.port)
        check('metronome_sessions_ended_total{reason="nonfinite_logits"} counts the one session',
              n == 1.0, str(n))
    return path


def all_nan_q8(binary, tmp, f32_path):
    path = os.path.join(tmp, "q8.gguf")
    run(binary, "quantize", "--model", f32_path, "--out", path, "--type", "q8_0")
    _, by_name = tensors(binary, path)
    for t in by_name.values():
        poison(path, t["file_offset"], t["bytes"])
    with Server(binary, path, tmp) as srv:
        reasons = []
        for _ in range(3):
            c = WsClient(srv.port)
            try:
                sid = c.start()
                c.send_json({"type": "frame", "session": sid, "index": 0, "ids": [1, 2]})
                got = until_ended(c, sid)
                reasons.append(got[-1].get("reason") if got and not any(
                    m.get("type") == "frame.result" for m in got) else json.dumps(got))
            finally:
                c.close_socket()
        check("all-NaN Q8_0 file: every session ends with nonfinite_logits, no frame",
              reasons == ["nonfinite_logits"] * 3, str(reasons))
        status, _, _ = http_request(srv.port, "GET", "/healthz")
        check("all-NaN Q8_0 file: /healthz still answers 200", status == 200, str(status))
        n = ended_counter(srv.port)
        check("all-NaN Q8_0 file: the counter counts all three", n == 3.0, str(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = one_poisoned_row(args.bin, tmp)
        # The F32 file with its row poisoned is the quantiser's input: re-export a clean one.
        run(args.bin, "export-gguf", "--model", "synthetic:tiny", "--out", f32_path, "--dtype",
            "f32")
        all_nan_q8(args.bin, tmp, f32_path)
    print("nonfinite: all checks passed" if not failures else f"nonfinite: {len(failures)} FAILED",
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
