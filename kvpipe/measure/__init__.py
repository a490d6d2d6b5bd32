"""The measurement stage: timers, memory probes, the roofline, quality, and the job's metrics."""
