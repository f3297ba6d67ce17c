"""The speed benchmark, outside the package: `python -m benchmarks.run --help` (docs/benchmarking.md).

`runner` times every backend and rlnorm variant against a same-run `torch.add`, `variants` parses
`--variant`, `base` times another commit's kernel in the same run, `merge` merges runs of separate
processes, `results` appends rows to benchmarks/results.csv, `table` formats.
"""
