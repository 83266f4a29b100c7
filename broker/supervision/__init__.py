"""Worker processes: spawning them (directly or from warm templates), watching their exits
and heartbeats, restarting them."""
