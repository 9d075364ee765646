#!/bin/bash
mkdir -p /logs/verifier
out=$(printf 'hello, world\n' | python3 /app/shout.py)
if [ "$out" = "HELLO, WORLD" ]; then
  echo '{"reward": 1.0}' > /logs/verifier/reward.json
else
  echo '{"reward": 0.0}' > /logs/verifier/reward.json
fi
