from pathlib import Path

expected = sum("ERROR" in line for line in Path("/app/server.log").read_text().splitlines())
answer = Path("/app/error_count.txt")
assert answer.is_file(), "/app/error_count.txt is missing"
assert answer.read_text().strip() == str(expected), f"expected {expected}, got {answer.read_text().strip()!r}"
print("ok")
