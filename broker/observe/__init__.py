"""What the broker reports: statistics, metrics snapshots, traces."""
