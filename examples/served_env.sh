#!/usr/bin/env bash
# An env served over HTTP by one process and trained on from another: `agentrl env serve` starts in the
# background, `agentrl run --env http://...` trains one step against it, and the server stops on the way out, also
# when a step fails or the script is interrupted. From the repository root:
#
#   bash examples/served_env.sh
#
# PORT (default 8765) is where the server listens and OUT (default runs/served-smoke) the run folder. The env is
# examples/guess_number.py's; the server could run on another machine or in a container (README.md, "Envs served
# over the network"). tiny-qwen3 is a random model: this shows the plumbing in about 15 s on a CPU, not learning
# (on the HF engine, named: vLLM's CPU build does not serve tiny-qwen3, and `auto` would spend seconds finding out).
set -euo pipefail

PORT=${PORT:-8765}
OUT=${OUT:-runs/served-smoke}
URL="http://127.0.0.1:$PORT/GuessNumber"

agentrl env serve --env "$(dirname "$0")/guess_number.py:GuessNumber" --port "$PORT" &
server=$!
stop_server() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true # it exits by the SIGTERM it was sent: not a failure of this script
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Ready once /health answers; a server that died (a port in use, a broken env file) fails here, not in the run.
python3 - "$URL/health" "$server" <<'PY'
import os, sys, time, urllib.request

url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            print("env server ready:", answer.read().decode())
            break
    except OSError as e:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit(f"the env server exited before it answered {url} (see its message above)")
        if time.monotonic() > deadline:
            sys.exit(f"the env server did not answer {url} within 60 s: {e}")
        time.sleep(0.2)
PY

agentrl run --env "$URL" --model tiny-qwen3 --engine hf --steps 1 --prompts-per-step 2 --group-size 2 --max-turns 2 \
  --max-new-tokens 8 --output "$OUT" --overwrite

# Sessions open now: 0 when the run closed every session it opened.
python3 - "$URL/health" <<'PY'
import sys, urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as answer:
        print("env server after the run:", answer.read().decode())
except OSError as e:
    sys.exit(f"the env server stopped answering {sys.argv[1]} during the run: {e}")
PY
