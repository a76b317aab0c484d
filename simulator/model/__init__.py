"""Model architectures (from config.json) and the step cost model."""
