"""The code env's sandboxes: the back-end contract over bwrap and subprocess, the pool, and hostile episodes.

Every hostile test shows three things: the attack was contained, the host is unchanged, and the sandbox (and its
back-end) still serves the next call. The subprocess back-end isolates nothing by design, so only its resource limits
are tested, and that it refuses to exist without the user's consent. `backend_contract` and the fixtures are written
to be reused over other back-ends (parametrise `backend`).
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.envs.code.sandbox import (
    WORKDIR,
    BwrapBackend,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    SandboxUnavailable,
    SubprocessBackend,
    make_backend,
)
from agentrl.envs.code.sandbox import bwrap as bwrap_module

REPO = Path(__file__).resolve().parents[1]
BWRAP_REASON = BwrapBackend.unavailable_reason()
LIMITS = SandboxLimits(wall_s=5, cpu_s=5)


def bubblewrap_itself_works() -> bool:
    """Whether plain bubblewrap makes namespaces here, whatever the back-end's own command line does."""
    if shutil.which("bwrap") is None:
        return False
    cmd = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
           "--symlink", "usr/lib64", "/lib64", "--", "/usr/bin/true"]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# ---- fixtures and host-side checks ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bwrap_backend():
    if BWRAP_REASON is not None:
        if bubblewrap_itself_works():  # then the back-end broke, not the machine: never hide that as a skip
            pytest.fail(f"bubblewrap works here but the bwrap back-end does not: {BWRAP_REASON}")
        pytest.skip(f"bwrap back-end unavailable: {BWRAP_REASON}")
    backend = BwrapBackend()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def subprocess_backend():
    backend = SubprocessBackend(unsafe=True)
    yield backend
    backend.close()


@pytest.fixture(params=["bwrap", "subprocess"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
def sandbox(backend):
    made = backend.create(LIMITS)
    yield made
    made.close()


@pytest.fixture
def box(bwrap_backend):
    """A bwrap sandbox for the hostile episodes."""
    made = bwrap_backend.create(LIMITS)
    yield made
    made.close()


def sh(sandbox, script: str, **kwargs):
    return sandbox.run(["sh", "-c", script], **kwargs)


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line holds `marker` (the test's own process excluded)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


def host_pids_of_uid(uid: int) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        if str(uid) in uids:
            found.append(int(pid))
    return found


def wait_until(check, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def assert_serves(sandbox) -> None:
    result = sandbox.run(["sh", "-c", "echo still-serving > probe && cat probe && rm probe"])
    assert result.ok and result.stdout == b"still-serving\n", result


# ---- the back-end contract (bwrap and subprocess) -------------------------------------------------------------------


def test_run_streams_and_exit_codes(sandbox):
    result = sh(sandbox, "echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.ok and not result.timed_out and not result.output_truncated
    assert sandbox.run(["true"]).ok
    killed = sandbox.run(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert killed.exit_code == -signal.SIGTERM
    missing = sandbox.run(["no-such-program-here"])
    assert missing.exit_code == 127 and not missing.ok


def test_stdin_is_fed_while_output_is_read(sandbox):
    data = os.urandom(3 * 1024 * 1024)  # far past a pipe's buffer: needs writing and reading at once
    result = sandbox.run(["sh", "-c", "wc -c; echo done >&2"], stdin=data)
    assert result.ok and result.stdout.strip() == str(len(data)).encode() and result.stderr == b"done\n"
    assert sandbox.run(["cat"], stdin=b"\x00\xffbytes").stdout == b"\x00\xffbytes"
    assert sandbox.run(["true"], stdin=data).ok  # a command that never reads stdin is not an error


def test_environment_is_clean_plus_what_is_given(sandbox, monkeypatch):
    monkeypatch.setenv("AGENTRL_HOST_SECRET", "must-not-leak")
    result = sandbox.run(["env"], env={"TASK_SEED": "17"})
    names = dict(line.split("=", 1) for line in result.text().splitlines())
    assert names["TASK_SEED"] == "17" and "AGENTRL_HOST_SECRET" not in names
    assert names["PATH"] == "/usr/bin:/bin" and "HOME" in names


def test_wall_limit_kills_a_sleeper(sandbox):
    result = sandbox.run(["sleep", "30"], limits=SandboxLimits(wall_s=1))
    assert result.timed_out and result.exit_code is None and not result.ok
    assert 0.9 < result.seconds < 4
    assert_serves(sandbox)


def test_output_is_cut_per_stream(sandbox):
    limits = SandboxLimits(output_bytes=1000)
    result = sh(sandbox, "python3 -c \"import sys; sys.stdout.write('a' * 5000); sys.stderr.write('b' * 3000)\"",
                limits=limits)
    assert result.ok and result.output_truncated
    assert result.stdout == b"a" * 1000 and result.stderr == b"b" * 1000
    assert not sh(sandbox, "echo short", limits=limits).output_truncated


def test_files_round_trip(sandbox):
    data = bytes(range(256)) * 60  # under the 16 KiB output limit: read_file is cut like any call
    assert sandbox.write_file("deep/er/file.bin", data).ok
    assert sandbox.read_file("deep/er/file.bin").stdout == data
    assert sh(sandbox, "cat deep/er/file.bin | wc -c").stdout.strip() == b"15360"
    assert not sandbox.read_file("absent.txt").ok


def test_export_import_tree(backend, sandbox):
    sandbox.write_file("pkg/mod.py", b"VALUE = 41\n")
    sandbox.write_file("notes.txt", b"hello")
    sh(sandbox, "ln -s pkg/mod.py link.py && mkdir empty")
    tar = sandbox.export_tree()
    names = {member.name.lstrip("./") for member in tarfile.open(fileobj=io.BytesIO(tar))}
    assert {"pkg/mod.py", "notes.txt", "link.py", "empty"} <= names
    fresh = backend.create(LIMITS)
    try:
        assert fresh.import_tree(tar).ok
        assert fresh.read_file("notes.txt").stdout == b"hello"
        assert sh(fresh, "readlink link.py; python3 -c 'import pkg.mod as m; print(m.VALUE + 1)'").stdout \
            == b"pkg/mod.py\n42\n"
    finally:
        fresh.close()


def test_reset_empties_even_a_hostile_tree(sandbox):
    # A folder without rights, a link to the host's root, a 300-deep chain (past the emptier's depth bound).
    script = "mkdir locked && echo y > locked/f && chmod 000 locked && ln -s / root-link && echo z > .hidden"
    assert sh(sandbox, script).ok
    # The chain is made from the host, owned as the sandbox's own files are: made inside, it is a depth bomb the disk
    # watchdog may stop mid-call (it did on a loaded machine), which would leave a shallower, less hostile tree.
    owner = os.stat(os.path.join(sandbox.host_path, ".hidden"))
    path = sandbox.host_path
    for _ in range(300):
        path = os.path.join(path, "d")
        os.mkdir(path)
        os.chown(path, owner.st_uid, owner.st_gid)
    with open(os.path.join(path, "leaf"), "w") as f:
        f.write("x")
    sandbox.reset()
    assert sh(sandbox, "ls -A").stdout == b""
    assert os.listdir(sandbox.host_path) == []
    assert Path("/usr/bin/sh").exists()  # the link to / was removed as a link
    assert_serves(sandbox)


def test_close_removes_and_is_idempotent(backend):
    made = backend.create(LIMITS)
    made.write_file("a.txt", b"a")
    folder = made.host_path
    assert os.path.isdir(folder)
    made.close()
    made.close()
    assert not os.path.exists(folder)
    with pytest.raises(SandboxError, match="closed"):
        made.run(["true"])


def test_concurrent_sandboxes_from_threads(backend):
    sandboxes = [backend.create(LIMITS) for _ in range(6)]

    def work(index: int) -> bytes:
        sandbox = sandboxes[index]
        sandbox.write_file("token", f"token-{index}".encode())
        return sh(sandbox, "sleep 0.5; cat token").stdout

    try:
        start = time.monotonic()
        with ThreadPoolExecutor(6) as pool:
            outputs = list(pool.map(work, range(6)))
        elapsed = time.monotonic() - start
        assert outputs == [f"token-{i}".encode() for i in range(6)]
        assert elapsed < 6 * 0.5  # the calls overlapped
        assert len({sandbox.host_path for sandbox in sandboxes}) == 6
    finally:
        for sandbox in sandboxes:
            sandbox.close()


def test_workspace_over_its_limit_is_emptied(sandbox):
    limits = SandboxLimits(workspace_bytes=1024 * 1024)
    result = sh(sandbox, "head -c 700000 /dev/zero > a && head -c 700000 /dev/zero > b", limits=limits)
    assert result.workspace_overflow
    assert sh(sandbox, "ls -A").stdout == b""
    kept = sh(sandbox, "head -c 700000 /dev/zero > a && ln -s /usr big-link", limits=limits)
    assert not kept.workspace_overflow  # a link counts as itself, never its target
    assert_serves(sandbox)


def test_bad_input_is_a_clear_value_error(sandbox):
    with pytest.raises(ValueError, match="argv is empty"):
        sandbox.run([])
    with pytest.raises(ValueError, match="list of strings"):
        sandbox.run("ls -l")
    with pytest.raises(ValueError, match="not a valid variable name"):
        sandbox.run(["true"], env={"1BAD": "x"})
    with pytest.raises(ValueError, match="stdin must be bytes"):
        sandbox.run(["cat"], stdin="text")
    with pytest.raises(ValueError, match="wall_s must be a positive number"):
        sandbox.run(["true"], limits=SandboxLimits(wall_s=0))


# ---- resource limits (bwrap and subprocess) --------------------------------------------------------------------------


def test_memory_bomb_gets_memory_error(sandbox):
    result = sandbox.run(["python3", "-c", "blocks = []\nwhile True: blocks.append(bytearray(50 * 1024 * 1024))"],
                         limits=SandboxLimits(memory_mb=256))
    assert result.exit_code == 1 and b"MemoryError" in result.stderr and not result.timed_out
    assert_serves(sandbox)


def test_busy_loop_stops_at_the_cpu_limit(sandbox):
    result = sandbox.run(["python3", "-c", "while True: pass"], limits=SandboxLimits(cpu_s=1, wall_s=10))
    assert result.exit_code == -signal.SIGXCPU and not result.timed_out and result.seconds < 5
    assert_serves(sandbox)


def test_busy_loop_stops_at_the_wall_limit(sandbox):
    result = sandbox.run(["python3", "-c", "while True: pass"], limits=SandboxLimits(cpu_s=100, wall_s=1))
    assert result.timed_out and result.exit_code is None and result.seconds < 4
    assert_serves(sandbox)


def test_huge_output_is_cut_quickly_in_bounded_memory(sandbox):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result = sh(sandbox, "head -c 100000000 /dev/zero >&2 & head -c 100000000 /dev/zero; wait")
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.ok and result.output_truncated and result.seconds < 10
    assert len(result.stdout) == len(result.stderr) == LIMITS.output_bytes
    assert grew_mib < 50, f"reading 200 MB of output grew this process by {grew_mib:.0f} MiB"
    assert_serves(sandbox)


def test_huge_file_stops_at_the_file_size_limit(sandbox):
    limits = SandboxLimits(file_bytes=1024 * 1024)
    result = sh(sandbox, "head -c 20000000 /dev/zero > big", limits=limits)
    assert not result.ok and b"File size limit exceeded" in result.stderr
    assert sh(sandbox, "stat -c %s big").stdout.strip() == b"1048576"
    assert_serves(sandbox)


def test_background_processes_do_not_outlive_the_call(sandbox):
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    script = f"nohup python3 -c 'import time; time.sleep(1000)' {marker} > /dev/null 2>&1 & echo started"
    result = sh(sandbox, script)
    assert result.ok and result.stdout == b"started\n" and result.seconds < 3
    assert wait_until(lambda: not host_pids_with(marker)), host_pids_with(marker)
    assert_serves(sandbox)


# ---- hostile episodes (bwrap) ---------------------------------------------------------------------------------------


def test_network_is_unreachable(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        probe = ("import socket\n"
                 f"for host, port in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('10.0.0.1', 80)]:\n"
                 "    s = socket.socket(); s.settimeout(2)\n"
                 "    try: s.connect((host, port)); print('CONNECTED', host)\n"
                 "    except OSError as e: print('blocked', host, e.errno)\n"
                 "try: socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
                 "except OSError: print('no dns')\n")
        result = box.run(["python3", "-c", probe])
        assert result.ok and b"CONNECTED" not in result.stdout and b"RESOLVED" not in result.stdout
        assert result.stdout.count(b"blocked") == 3
        with pytest.raises(BlockingIOError):
            listener.accept()  # the host's listener saw nothing
    finally:
        listener.close()
    assert_serves(box)


def test_host_files_are_out_of_sight(bwrap_backend, box):
    other = bwrap_backend.create(LIMITS)
    try:
        other.write_file("secret.txt", b"other-sandbox-secret")
        backend_root = os.path.dirname(other.host_path)
        for target in ["/etc/shadow", "/etc/passwd", "/root", "/home", str(REPO), str(REPO / "pyproject.toml"),
                       other.host_path, f"{other.host_path}/secret.txt", backend_root]:
            result = sh(box, f"ls -la '{target}' || cat '{target}'")
            assert not result.ok and result.stdout == b"", (target, result)
        assert sh(box, "ls /").stdout.split() == [b"bin", b"dev", b"lib", b"lib64", b"proc", b"sbin", b"tmp",
                                                   b"usr", b"workspace"]
        assert other.read_file("secret.txt").stdout == b"other-sandbox-secret"  # the other one is untouched
    finally:
        other.close()
    assert_serves(box)


def test_writes_outside_the_workspace_do_not_reach_the_host(box):
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    for target in ["/usr/x", f"/{marker}", f"{REPO}/{marker}", "/dev/x", "/proc/x"]:
        assert not sh(box, f"echo x > '{target}'").ok, target
    inside = sh(box, f"echo x > /tmp/{marker} && echo x > /dev/shm/{marker} && ls /tmp /dev/shm")
    assert inside.ok and inside.stdout.count(marker.encode()) == 2
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
    assert not (REPO / marker).exists() and not Path(f"/{marker}").exists()
    assert sh(box, "ls -A /tmp").stdout == b""  # each call gets a fresh /tmp
    small = SandboxLimits(workspace_bytes=2 * 1024 * 1024)
    flood = sh(box, "for i in 1 2 3 4; do head -c 1000000 /dev/zero > /tmp/$i || exit 9; done", limits=small)
    assert flood.exit_code == 9 and b"No space left" in flood.stderr  # /tmp lives in host memory: bounded
    assert_serves(box)


def test_symlink_escape_gives_nothing_from_the_host(bwrap_backend, box, tmp_path):
    other = bwrap_backend.create(LIMITS)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("host data")
    try:
        other.write_file("secret.txt", b"other-sandbox-secret")
        links = {"passwd": "/etc/passwd", "repo": str(REPO / "pyproject.toml"),
                 "other": f"{other.host_path}/secret.txt", "victim": str(victim),
                 "victim-file": str(victim / "keep.txt")}
        script = " && ".join(f"ln -s '{target}' '{name}'" for name, target in links.items())
        assert sh(box, script).ok
        for name in links:
            result = box.read_file(name)
            assert not result.ok and result.stdout == b"", (name, result)
        tar = box.export_tree()
        members = {m.name.lstrip("./"): m for m in tarfile.open(fileobj=io.BytesIO(tar)) if m.name not in (".", "./")}
        assert set(members) == set(links) and all(m.issym() for m in members.values())
        for leaked in [b"root:x:0:0", b"[build-system]", b"other-sandbox-secret", b"host data"]:
            assert leaked not in tar
        box.reset()
        assert (victim / "keep.txt").read_text() == "host data"  # removed as links, targets untouched
        assert other.read_file("secret.txt").stdout == b"other-sandbox-secret"
    finally:
        other.close()
    assert_serves(box)


def test_fork_bomb_is_contained(bwrap_backend, box):
    neighbour = bwrap_backend.create(LIMITS)
    try:
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(sh, neighbour, "sleep 1; echo neighbour-fine")
            result = sh(box, "bomb() { bomb | bomb & }; bomb; sleep 10", limits=SandboxLimits(wall_s=3))
            assert beside.result().stdout == b"neighbour-fine\n"
        # Stopped at the wall limit, or sooner where a pids cgroup makes the shell's own next fork fail.
        assert (result.timed_out or b"Cannot fork" in result.stderr) and result.seconds < 8, result
        if os.geteuid() == 0:
            uid = os.stat(box.host_path).st_uid
            assert wait_until(lambda: not host_pids_of_uid(uid)), host_pids_of_uid(uid)
        assert_serves(box)
        assert_serves(neighbour)
    finally:
        neighbour.close()


def test_killing_everything_inside_spares_the_host(bwrap_backend, box):
    host_child = subprocess.Popen(["sleep", "30"])
    neighbour = bwrap_backend.create(LIMITS)
    try:
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(sh, neighbour, "sleep 1; echo neighbour-fine")
            everything = sh(box, "kill -9 -1; sleep 1; echo survived")
            parent = sh(box, "kill -9 $PPID; sleep 1; echo survived")
            assert beside.result().stdout == b"neighbour-fine\n"
        for result in (everything, parent):
            assert result.exit_code == -signal.SIGKILL and result.seconds < 3
        assert host_child.poll() is None  # a host process of the test, alive
        os.kill(os.getpid(), 0)  # and so is the test process
        assert_serves(box)
        assert_serves(neighbour)
    finally:
        host_child.kill()
        host_child.wait()
        neighbour.close()


def test_setsid_background_process_dies_with_the_call(box):
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    script = (f"setsid nohup python3 -c 'import time; time.sleep(1000)' {marker} > /dev/null 2>&1 & "
              "sleep 0.3; echo started")
    assert sh(box, script).stdout == b"started\n"
    assert wait_until(lambda: not host_pids_with(marker)), host_pids_with(marker)
    assert_serves(box)


def test_sandboxes_run_as_distinct_unprivileged_uids(bwrap_backend, box):
    if os.geteuid() != 0:
        pytest.skip("not root: sandboxes run as this user's own uid")
    other = bwrap_backend.create(LIMITS)
    try:
        uids = {os.stat(box.host_path).st_uid, os.stat(other.host_path).st_uid}
        assert len(uids) == 2 and 0 not in uids
        assert sh(box, "id -u").stdout == b"1000\n"  # the same inside, whatever the host uid
        assert sh(box, "grep NoNewPrivs /proc/self/status").stdout.split()[-1] == b"1"
        assert sh(box, "grep CapEff /proc/self/status").stdout.split()[-1] == b"0000000000000000"
    finally:
        other.close()


def test_command_line_keeps_the_host_out(bwrap_backend):
    cmd = bwrap_backend.command("/x/ws", None, SandboxLimits(), 9, {}, ["true"])
    for flag in ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"]:
        assert flag in cmd
    binds = [cmd[i + 1] for i, arg in enumerate(cmd) if arg in ("--bind", "--ro-bind")]
    assert binds == ["/usr", "/x/ws"]  # nothing of the host but /usr and the workspace
    assert cmd[cmd.index("--bind") + 2] == WORKDIR


# ---- the subprocess back-end's consent ------------------------------------------------------------------------------


def test_subprocess_refuses_without_consent():
    with pytest.raises(ValueError, match="unsafe_subprocess=True"):
        SubprocessBackend()
    with pytest.raises(ValueError, match="no isolation"):
        make_backend("subprocess")
    backend = make_backend("subprocess", unsafe_subprocess=True)
    try:
        assert isinstance(backend, SubprocessBackend)
    finally:
        backend.close()


def test_subprocess_reset_kills_what_left_the_group(subprocess_backend):
    sandbox = subprocess_backend.create(LIMITS)
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    try:
        script = f"setsid python3 -c 'import time; time.sleep(1000)' {marker} > /dev/null 2>&1 & sleep 0.3"
        assert sh(sandbox, script).ok
        sandbox.reset()
        assert wait_until(lambda: not host_pids_with(marker)), host_pids_with(marker)
    finally:
        sandbox.close()


# ---- make_backend ----------------------------------------------------------------------------------------------------


def test_make_backend_by_name(monkeypatch):
    with pytest.raises(ValueError, match="unknown sandbox back-end 'docker'"):
        make_backend("docker")
    if BWRAP_REASON is None:
        backend = make_backend("auto")
        assert isinstance(backend, BwrapBackend)
        backend.close()
        with pytest.raises(ValueError, match="does not take"):
            make_backend("bwrap", image="x")
    monkeypatch.setattr(BwrapBackend, "unavailable_reason", classmethod(lambda cls: "bwrap is missing (test)"))
    with pytest.raises(SandboxUnavailable) as caught:
        make_backend("auto", unsafe_subprocess=True)  # consent to subprocess still never means a silent fallback
    assert all(word in str(caught.value) for word in ["bwrap is missing", "podman", "unsafe_subprocess=True"])
    with pytest.raises(SandboxUnavailable, match="bwrap is missing"):
        make_backend("bwrap")


def test_make_backend_podman_is_lazy():
    try:
        backend = make_backend("podman")
    except SandboxUnavailable as exc:
        assert "podman" in str(exc)
    else:
        assert backend.name == "podman"
        backend.close()


def test_unavailable_reason_names_the_fix(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, **kw: None if name == "bwrap" else real_which(name, **kw))
    reason = bwrap_module._probe.__wrapped__()
    assert "not installed" in reason and "apt-get install bubblewrap" in reason
    assert "unprivileged_userns_clone" in reason and "max_user_namespaces" in reason


# ---- the pool --------------------------------------------------------------------------------------------------------


@pytest.fixture
def pool_backend():
    backend = BwrapBackend() if BWRAP_REASON is None else SubprocessBackend(unsafe=True)
    yield backend
    backend.close()


def test_pool_reuses_emptied_sandboxes(pool_backend):
    pool = SandboxPool(pool_backend, LIMITS, size=2)
    try:
        first = pool.acquire()
        first.write_file("left-over.txt", b"x")
        pool.release(first)
        again = pool.acquire()
        assert again is first and sh(again, "ls -A").stdout == b""
        stats = pool.stats()
        assert (stats.cold, stats.warm, stats.in_use, stats.idle) == (1, 1, 1, 0)
        pool.release(again)
        with pytest.raises(ValueError, match="has not lent"):
            pool.release(again)
        stranger = pool_backend.create(LIMITS)
        with pytest.raises(ValueError, match="has not lent"):
            pool.release(stranger)
        stranger.close()
    finally:
        pool.close()


def test_pool_keeps_at_most_size_and_prefills(pool_backend):
    pool = SandboxPool(pool_backend, LIMITS, size=1, prefill=1)
    try:
        a, b = pool.acquire(), pool.acquire()
        assert pool.stats().warm == 1 and pool.stats().cold == 1
        pool.release(a)
        pool.release(b)
        assert pool.stats().idle == 1 and pool.stats().discarded == 1
        assert os.path.isdir(a.host_path) != os.path.isdir(b.host_path)  # one kept, one closed
    finally:
        pool.close()
    with pytest.raises(ValueError, match="prefill"):
        SandboxPool(pool_backend, LIMITS, size=1, prefill=2)


def test_pool_discards_a_sandbox_that_cannot_be_reset(pool_backend):
    pool = SandboxPool(pool_backend, LIMITS, size=2)
    try:
        broken = pool.acquire()
        os.rmdir(broken.host_path)  # its workspace vanished: it must not serve another episode
        pool.release(broken)
        assert pool.stats().discarded == 1 and pool.stats().idle == 0
        assert pool.acquire() is not broken
    finally:
        pool.close()


def test_pool_close_reaps_everything(pool_backend):
    pool = SandboxPool(pool_backend, LIMITS, size=4)
    lent = pool.acquire()
    kept = pool.acquire()
    pool.release(kept)
    folders = [lent.host_path, kept.host_path]
    pool.close()
    pool.close()
    assert not any(os.path.exists(folder) for folder in folders)
    with pytest.raises(SandboxError, match="closed"):
        pool.acquire()
    pool.release(lent)  # an episode ending after the pool was reaped: nothing left to do
    with pytest.raises(SandboxError, match="closed"):
        lent.run(["true"])


def test_pool_is_thread_safe(pool_backend):
    pool = SandboxPool(pool_backend, LIMITS, size=8)
    in_use: set[int] = set()
    guard = threading.Lock()
    clashes = []

    def episode(_: int) -> None:
        sandbox = pool.acquire()
        with guard:
            if id(sandbox) in in_use:
                clashes.append(sandbox)
            in_use.add(id(sandbox))
        assert sandbox.run(["true"]).ok
        with guard:
            in_use.discard(id(sandbox))
        pool.release(sandbox)

    try:
        with ThreadPoolExecutor(8) as workers:
            list(workers.map(episode, range(96)))
        stats = pool.stats()
        assert not clashes and stats.cold + stats.warm == 96 and stats.cold <= 8 and stats.in_use == 0
    finally:
        pool.close()


# ---- host safety after review (issue 43) -----------------------------------------------------------------------------


def test_disk_watchdog_kills_a_call_that_fills_the_workspace(sandbox):
    # Many files, each under the per-file limit: only a measurement during the call stops this before it ends.
    limits = SandboxLimits(workspace_bytes=8 * 2**20, file_bytes=2 * 2**20, wall_s=20)
    script = ("i=0; while [ $i -lt 400 ]; do head -c 1000000 /dev/zero > f$i || exit 9; i=$((i+1)); done; "
              "sleep 8; echo finished")
    result = sh(sandbox, script, limits=limits)
    assert result.workspace_overflow and not result.timed_out and result.exit_code is None, result
    assert b"finished" not in result.stdout and result.seconds < 5, result
    assert sh(sandbox, "ls -A").stdout == b""
    assert_serves(sandbox)


def test_disk_watchdog_leaves_a_call_within_its_limit_alone(sandbox):
    limits = SandboxLimits(workspace_bytes=8 * 2**20, wall_s=20)
    result = sh(sandbox, "for i in 1 2 3; do head -c 1000000 /dev/zero > f$i; sleep 0.2; done; echo finished",
                limits=limits)
    assert result.ok and result.stdout == b"finished\n" and not result.workspace_overflow


def test_backend_refuses_a_disk_below_the_free_space_floor(monkeypatch, tmp_path):
    from agentrl.envs.code.sandbox import _workspace

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=100 * 2**20))
    with pytest.raises(SandboxUnavailable) as caught:
        BwrapBackend()
    message = str(caught.value)
    assert "100 MiB free" in message and "256 MiB" in message and "workspace_bytes" in message and "TMPDIR" in message
    with pytest.raises(SandboxUnavailable, match="TMPDIR"):
        _workspace.require_free_space(str(tmp_path), 40 * 2**20, "subprocess")
    _workspace.require_free_space(str(tmp_path), 20 * 2**20, "subprocess")  # 80 MiB needed: room enough


def test_cgroups_bound_the_call_as_a_whole(bwrap_backend):
    if not bwrap_backend.resource_control.startswith("cgroup"):
        pytest.skip(f"calls are bounded by {bwrap_backend.resource_control}")
    box = bwrap_backend.create(LIMITS)
    # Four processes of 120 MiB each: every one within its own 300 MiB address space, together past 300 MiB.
    fill = ("import os, time\npids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        x = bytearray(120 * 2**20)\n        x[::4096] = b'1' * len(x[::4096])\n        time.sleep(1)\n"
            "        os._exit(0)\n    pids.append(pid)\n"
            "print(sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))")
    try:
        result = box.run(["python3", "-c", fill], limits=SandboxLimits(memory_mb=300, wall_s=20, cpu_s=10))
        assert result.exit_code == 0 and "-9" in result.text(), result  # the OOM killer took a child, in the call
        within = box.run(["python3", "-c", fill.replace("range(4)", "range(2)")],
                         limits=SandboxLimits(memory_mb=300, wall_s=20, cpu_s=10))
        assert within.ok and within.text() == "[0, 0]\n", within
        parents = bwrap_backend.cgroups._parents
        seen: dict[str, str] = {}

        def look() -> None:
            time.sleep(0.5)
            for parent in parents:
                for child in Path(parent).glob("call-*"):
                    for name in ("memory.limit_in_bytes", "memory.max", "pids.max"):
                        if (child / name).exists():
                            seen[name] = (child / name).read_text().strip()

        looker = threading.Thread(target=look)
        looker.start()
        box.run(["sleep", "1.5"], limits=SandboxLimits(memory_mb=200, max_processes=7))
        looker.join()
        assert seen.get("pids.max") == str(7 + 3)
        assert seen.get("memory.limit_in_bytes", seen.get("memory.max")) == str(200 * 2**20)
        assert not [c for parent in parents for c in Path(parent).glob("call-*")]  # removed after each call
    finally:
        box.close()


_RUNNER = """
import os, signal, sys, threading, time
from agentrl.envs.code.sandbox import BwrapBackend, SandboxLimits
how = sys.argv[1]
if how == "handled":  # a runner that turns SIGTERM into an exception, as `agentrl run` does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
backend = BwrapBackend()
box = backend.create(SandboxLimits(wall_s=60))
box.write_file("left.txt", b"x")
threading.Thread(target=box.run, args=(["sleep", "50"],), daemon=True).start()
time.sleep(0.5)
print(os.path.dirname(box.host_path), flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["kill", "term", "handled"])
def test_a_killed_runners_leftovers_are_reaped(bwrap_backend, how):
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, how], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        root = runner.stdout.readline().strip()
        assert root and os.path.isdir(root)
        if how != "kill":
            runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    if how == "handled":
        assert runner.returncode == 3 and not os.path.exists(root)  # its own clean-up ran
        return
    assert os.path.isdir(root)  # nothing in the dead runner could remove it
    pid = os.path.basename(root).split("-")[2]
    after = BwrapBackend()
    try:
        assert root in after.reaped and not os.path.exists(root)
        assert os.path.isdir(after._root)  # the new back-end's own folder
        assert not any(f"agentrl-bwrap-{pid}-" in name for name in os.listdir(Path(root).parent))
        if after.resource_control.startswith("cgroup"):  # the dead runner's cgroups (one per controller) went too
            dead = [parent for parent in after.cgroups.reaped if f"/agentrl-bwrap-{pid}-" in parent]
            assert len(dead) == len(after.cgroups._parents)
            for parent in after.cgroups._parents:
                assert not list(Path(parent).parent.glob(f"agentrl-bwrap-{pid}-*"))
    finally:
        after.close()
    assert os.path.isdir(bwrap_backend._root)  # a live owner's folder stays


def test_emptying_as_root_changes_no_mode_and_repair_never_follows_a_link(monkeypatch, tmp_path):
    from agentrl.envs.code.sandbox import _workspace

    tree = tmp_path / "ws"
    (tree / "locked" / "inner").mkdir(parents=True)
    (tree / "locked" / "inner" / "f").write_text("x")
    (tree / "locked").chmod(0)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (tree / "link").symlink_to(outside)
    chmods = []
    real_chmod = os.chmod
    monkeypatch.setattr(os, "chmod", lambda *a, **kw: (chmods.append(a), real_chmod(*a, **kw)))
    if os.geteuid() == 0:
        _workspace.empty_folder(str(tree))
        assert chmods == [] and os.listdir(tree) == []
    # Not root: the repair goes through a descriptor of the directory itself, and refuses a link in its place.
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    outside.chmod(0o755)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "swapped").symlink_to(outside)
        with pytest.raises(OSError):
            _workspace._let_in(fd, "swapped")
        assert (outside.stat().st_mode & 0o777) == 0o755
        (tmp_path / "real").mkdir(mode=0)
        _workspace._let_in(fd, "real")
        assert ((tmp_path / "real").stat().st_mode & 0o777) == 0o700
    finally:
        os.close(fd)
