"""Device meshes, logical-axis sharding rules, multi-host helpers and batch padding: what every job runs on."""
