"""The job stage: a workload's batches, generated under one cache strategy, measured call by call."""
