from pathlib import Path


def test_reversed():
    lines = Path("/app/input.txt").read_text().splitlines()
    assert Path("/app/output.txt").read_text().splitlines() == lines[::-1]


if __name__ == "__main__":
    test_reversed()
    print("1 passed")
