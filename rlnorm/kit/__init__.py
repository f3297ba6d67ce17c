"""The check kit: backends, the checks and contract gates, run parameters, records, the artifact, the run's steps."""
