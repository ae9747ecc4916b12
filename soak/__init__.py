"""The soak: the whole service on a private PostgreSQL under mixed load and random faults
(relay modes, killed workers, web and database restarts), then its invariants checked from
the database and the providers' own counters. `make soak`; see soak/run.py."""
