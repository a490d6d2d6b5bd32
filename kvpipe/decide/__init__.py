"""The decision stage: recorded runs read back (runs), compared (compare, plots), a recommendation
under limits (recommend), and the KV bytes a config would need before anything runs (plan)."""
