"""The job stage: one job, measured round by round under one cache strategy: a workload's batches one
after another, or its requests served under a load."""
