"""`python -m rlnorm run params/quick.yaml`: see rlnorm/cli/__init__.py."""

from rlnorm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
