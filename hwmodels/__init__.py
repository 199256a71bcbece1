"""Hardware: GPU catalog, nodes, links, clusters (incl. heterogeneous), DVFS/power and op cost.

Modules: `gpus` (GpuSpec, get_gpu, list_gpus), `nodes` (node types, NICs, prices), `topology`
(Link and intra-node routing), `cluster` (Cluster, parse_cluster), `power` (DVFS power model),
`opcost` (RooflineCostModel), `comm_sm` (the SMs a running collective holds). Kept
import-free so `sim --help` stays fast.
"""
