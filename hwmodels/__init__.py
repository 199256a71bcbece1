"""Hardware: GPU catalog, nodes, links, clusters, DVFS/power and op cost models."""
