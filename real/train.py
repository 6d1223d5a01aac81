"""real.train — placeholder until its issue lands."""

import sys


def main(argv=None) -> int:
    print("real-train: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
