"""Predicting: what a configuration will cost, from its config and the hardware, without running it
(bytes and FLOPs, floors on named hardware, fits calibrated on this machine's runs, plan)."""
