#!/bin/bash
cat > /app/shout.py <<'PY'
import sys

print(sys.stdin.read().upper(), end="")
PY
