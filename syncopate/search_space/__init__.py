"""Workloads, topologies, chunk plans, tile orders, candidates and the search space.

Pure Python: importing this package imports neither torch nor triton.
"""

from syncopate.search_space.candidate import BACKENDS, Candidate
from syncopate.search_space.chunk_plan import COLLECTIVES, TEMPLATES, ChunkPlan, Transfer, block_bounds, build_plan
from syncopate.search_space.models import MODELS, model_shape
from syncopate.search_space.space import (
    TILE_CONFIGS,
    SpaceOptions,
    TileConfig,
    candidate_from_params,
    check_candidate,
    default_candidate,
    optuna_distributions,
    space,
    space_size,
    stall_risk,
    tile_orders_for,
)
from syncopate.search_space.tile_order import (
    CONSUMER_ORDERS,
    PRODUCER_ORDERS,
    TILE_ORDERS,
    TileSchedule,
    consumer_schedule,
    producer_schedule,
)
from syncopate.search_space.topology import GPUS, INTERCONNECTS, GpuSpec, Topology
from syncopate.search_space.workload import DTYPES, KINDS, Shape, Workload, canonical_dtype, dtype_bytes

__all__ = [
    "BACKENDS",
    "COLLECTIVES",
    "CONSUMER_ORDERS",
    "DTYPES",
    "GPUS",
    "INTERCONNECTS",
    "KINDS",
    "MODELS",
    "PRODUCER_ORDERS",
    "TEMPLATES",
    "TILE_CONFIGS",
    "TILE_ORDERS",
    "Candidate",
    "ChunkPlan",
    "GpuSpec",
    "Shape",
    "SpaceOptions",
    "TileConfig",
    "TileSchedule",
    "Topology",
    "Transfer",
    "Workload",
    "block_bounds",
    "build_plan",
    "candidate_from_params",
    "canonical_dtype",
    "check_candidate",
    "consumer_schedule",
    "default_candidate",
    "dtype_bytes",
    "model_shape",
    "optuna_distributions",
    "producer_schedule",
    "space",
    "space_size",
    "stall_risk",
    "tile_orders_for",
]
