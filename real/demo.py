"""real.demo — placeholder until its issue lands."""

import sys


def main(argv=None) -> int:
    print("real-demo: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
