"""The red team's verdict lines: one PASS/FAIL line a check, and the failures kept for the exit
status (shared by attacks.py, work_attacks.py and nonfinite.py)."""

failures = []


def check(name, ok, detail=""):
    print(("PASS: " if ok else "FAIL: ") + name + (f" ({detail})" if detail else ""), flush=True)
    if not ok:
        failures.append(name)
