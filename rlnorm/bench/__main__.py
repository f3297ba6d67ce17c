"""`python -m rlnorm.bench`, the same as `python -m rlnorm bench`: see rlnorm/bench/cli.py."""

from rlnorm.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
