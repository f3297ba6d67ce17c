"""Kept for the report's imports until they name `rlnorm.kit.process` and `rlnorm.kit.worker`: remove then."""

from rlnorm.kit.process import child_env, describe_exit
from rlnorm.kit.worker import run_backend, run_batch

__all__ = ["child_env", "describe_exit", "run_backend", "run_batch"]
