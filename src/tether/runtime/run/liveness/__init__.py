"""Whether a run is alive: the heartbeat that renews its lease, and the probe that asks
a silent round whether it still works."""
