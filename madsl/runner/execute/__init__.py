"""Where and how runs execute: the jobs, the local executors and the coordinator that
records their events, and Ray."""
