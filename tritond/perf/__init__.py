"""`tritond perf`: a perf_analyzer-compatible load generator (request building and sending,
measurement windows, perf_analyzer's CSV), also the measuring half of `tritond analyze`."""
