"""Stops that look like stops: SIGTERM and Ctrl-C end `agentrl run` with one line on where it stands (issue 30).

Each test starts a real run with Ray up (two env runners), waits for its first checkpoint, stops it and reads what
it printed: one last line with the resume command, no traceback and no Ray C++ stack dump.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

STEPS = 50
RUN_ARGS = ["--env", "math", "--model", "tiny-qwen3", "--steps", str(STEPS), "--group-size", "2",
            "--prompts-per-step", "1", "--max-new-tokens", "4", "--runners", "2", "--save-every", "1"]
NOISE = ("logging.cc", "@ 0x", "Traceback", "SIGTERM received")


def _start(out: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli", "run", *RUN_ARGS, "--output", str(out)], **kw)


def _wait_for_checkpoint(proc: subprocess.Popen, out: Path, timeout: float = 120) -> None:
    """Until metrics.jsonl has a line and a checkpoint is complete, so the stop has a step to name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended by itself (rc {proc.returncode})"
        metrics = out / "metrics.jsonl"
        if metrics.exists() and metrics.read_text().strip() and (out / "checkpoint" / "trainer_state.json").exists():
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no checkpoint in {out} after {timeout} s")


def _check_last_words(text: str, out: Path, stopped_by: str) -> None:
    for noise in NOISE:
        assert noise not in text, f"{noise!r} in the output:\n{text[-3000:]}"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # colours: the terminal shows nothing for them
    lines = [line for line in plain.replace("\r", "\n").splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith(f"stopped by {stopped_by}; {out} keeps the checkpoint of step "), last
    assert last.endswith(f"continue with `agentrl run --resume {out} --steps {STEPS}`"), last


def test_sigterm_stops_with_one_line(tmp_path):
    out = tmp_path / "RUN"
    proc = _start(out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for_checkpoint(proc, out)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, text.decode()[-3000:])
    _check_last_words(text.decode(errors="replace"), out, "SIGTERM")


def test_ctrl_c_through_a_terminal_stops_with_one_line(tmp_path):
    out = tmp_path / "RUN"
    master, slave = pty.openpty()
    # A session of its own with the terminal as its controlling one: Ctrl-C reaches its foreground group, as in a
    # shell (a background job would ignore SIGINT).
    proc = _start(out, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=_take_terminal)
    os.close(slave)
    reader = _Drain(master)
    try:
        _wait_for_checkpoint(proc, out)
        os.write(master, b"\x03")  # ^C typed: the terminal sends SIGINT to its foreground process group
        text = reader.finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 130, text[-3000:]
    _check_last_words(text, out, "Ctrl-C")


def _take_terminal() -> None:
    """In the child, after setsid: make stdin (the pseudo-terminal) its controlling terminal, as a login shell's.

    SIGINT goes back to its default too, as a shell's foreground job has it: an ignored disposition survives exec, and
    Python keeps SIGINT ignored when it starts ignored. A suite started as a background job of a non-interactive shell
    (`pytest &`) ignores SIGINT, and so did the run under test: it ran on past the Ctrl-C and exited 0.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Drain:
    """Reads the pseudo-terminal in a thread, so a full terminal buffer never blocks the run."""

    def __init__(self, fd: int) -> None:
        import threading

        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, args=(fd,), daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every writer is gone
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def finish(self, proc: subprocess.Popen, timeout: float) -> str:
        proc.wait(timeout=timeout)
        self._thread.join(timeout=10)
        return b"".join(self._chunks).decode(errors="replace")
