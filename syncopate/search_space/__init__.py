"""Workloads, topologies, chunk plans, tile orders, candidates and the search space.

Pure Python: importing this package imports neither torch nor triton.
"""

from syncopate.search_space.candidate import BACKENDS, Candidate
from syncopate.search_space.chunk_plan import (
    A_STATIONARY,
    C_STATIONARY,
    CANDIDATE_TEMPLATES,
    COLLECTIVES,
    STATIONARY_KINDS,
    TEMPLATES,
    ChunkPlan,
    Transfer,
    block_bounds,
    build_plan,
    row_chunks,
)
from syncopate.search_space.liveness import LivenessReport, check_liveness
from syncopate.search_space.models import MODELS, model_shape
from syncopate.search_space.space import (
    TILE_CONFIGS,
    SpaceOptions,
    TileConfig,
    a_stationary_candidate,
    c_stationary_candidate,
    candidate_from_params,
    check_candidate,
    default_candidate,
    empty_space_message,
    optuna_distributions,
    space,
    space_size,
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
from syncopate.search_space.topology import GPUS, INTERCONNECTS, GpuSpec, Topology, topology_key
from syncopate.search_space.workload import DTYPES, KINDS, MAX_DIM, MAX_ELEMENTS, Shape, Workload, canonical_dtype, dtype_bytes

__all__ = [
    "A_STATIONARY",
    "BACKENDS",
    "CANDIDATE_TEMPLATES",
    "C_STATIONARY",
    "STATIONARY_KINDS",
    "COLLECTIVES",
    "CONSUMER_ORDERS",
    "DTYPES",
    "GPUS",
    "INTERCONNECTS",
    "KINDS",
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MODELS",
    "PRODUCER_ORDERS",
    "TEMPLATES",
    "TILE_CONFIGS",
    "TILE_ORDERS",
    "Candidate",
    "ChunkPlan",
    "GpuSpec",
    "LivenessReport",
    "Shape",
    "SpaceOptions",
    "TileConfig",
    "TileSchedule",
    "Topology",
    "Transfer",
    "Workload",
    "a_stationary_candidate",
    "block_bounds",
    "c_stationary_candidate",
    "build_plan",
    "candidate_from_params",
    "canonical_dtype",
    "check_candidate",
    "check_liveness",
    "consumer_schedule",
    "default_candidate",
    "empty_space_message",
    "dtype_bytes",
    "model_shape",
    "optuna_distributions",
    "producer_schedule",
    "row_chunks",
    "space",
    "space_size",
    "topology_key",
    "tile_orders_for",
]
