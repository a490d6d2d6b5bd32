"""The record stage: result.json (one Result type), MLflow, the run's summary table, and sync."""
