"""The Ray cluster a sweep runs on: connect (or start a local one), fail fast when it cannot be
reached, and count how many gangs of a topology its GPUs hold.

Ray's start and shutdown are not interrupted: a SIGTERM or SIGINT that arrives while `ray.init` or
`ray.shutdown` runs is held, Ray is shut down (a cluster started here, with every process it
started), and the signal is then delivered to the handler the process had before, so that the
command stops as it documents (`syncopate tune`: one line, exit 143 or 130). Ray's own SIGTERM
handler, which exits at once, is never installed; an interrupted `ray.init` would leave Ray half
started, its agents running on and the process dying in Ray's native code.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.search_space import Topology
from syncopate.workers.env import apply_to_current_process

__all__ = [
    "REACH_TIMEOUT_S",
    "Cluster",
    "check_local_gpus",
    "check_reachable",
    "connect",
    "gang_capacity",
    "gang_shape",
    "local_gpu_count",
]

log = logging.getLogger(__name__)

REACH_TIMEOUT_S = 5.0
"""How long a TCP connection to a Ray address may take before the address counts as unreachable."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The Ray cluster this process is connected to."""

    address: str
    """What was connected to: an address, or `local` for a cluster started here."""
    owned: bool
    """True when this process connected (or started the cluster) and must disconnect at the end."""
    gpus_by_node: tuple[tuple[str, int], ...]
    """(node address, whole GPUs) of every live node."""

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.gpus_by_node)

    def describe(self) -> str:
        nodes = ", ".join(f"{ip}: {g}" for ip, g in self.gpus_by_node) or "no nodes"
        return f"{self.gpus} GPU(s) on {len(self.gpus_by_node)} node(s) ({nodes})"

    def disconnect(self) -> None:
        if self.owned:
            _shutdown()


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `host:port` or `ray://host:port`; None for `auto` and other forms."""
    if address in ("auto", "local"):
        return None
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(
            f"Ray address {address!r} has a bad port: give HOST:PORT such as 10.0.0.1:6379"
        ) from None
    if not parsed.hostname or port is None:
        raise ConfigError(
            f"Ray address {address!r} does not parse: give HOST:PORT such as 10.0.0.1:6379, or ray://HOST:10001"
        )
    return parsed.hostname, port


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise RuntimeUnavailableError unless a TCP connection to `address` opens within `timeout_s`
    (Ray itself would retry for minutes)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise RuntimeUnavailableError(
            f"cannot reach the Ray cluster at {address} ({reason}): start its head with `ray start --head`, "
            f"or leave out --ray-address to start a local cluster"
        ) from None


def _gpus_by_node() -> tuple[tuple[str, int], ...]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return tuple(sorted((n["NodeManagerAddress"], int(n.get("Resources", {}).get("GPU", 0))) for n in nodes))


_HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _signals_held(held: list[int]) -> Iterator[None]:
    """Hold SIGTERM and SIGINT inside the block (see the module docstring): the signals that
    arrive are appended to `held`, and the process's handlers are back in place after it, where
    the caller delivers them with :func:`_deliver`. Off the main thread, where no handler can be
    set, it holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    def hold(signum: int, _frame: object) -> None:
        held.append(signum)

    previous = {s: signal.getsignal(s) for s in _HELD_SIGNALS}
    ray_sets_sigterm = getattr(ray_utils, "set_sigterm_handler", None)
    for s in _HELD_SIGNALS:
        signal.signal(s, hold)
    if ray_sets_sigterm is not None:
        ray_utils.set_sigterm_handler = lambda _handler: None
    try:
        yield
    finally:
        if ray_sets_sigterm is not None:
            ray_utils.set_sigterm_handler = ray_sets_sigterm
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _deliver(held: list[int]) -> None:
    """Deliver the first signal held to the process's own handler (which raises, for a command)."""
    if held:
        signal.raise_signal(held[0])


def _shutdown() -> None:
    """Shut down Ray (every process of a cluster started here), signals held."""
    import ray

    held: list[int] = []
    with _signals_held(held):
        if ray.is_initialized():
            ray.shutdown()
    _deliver(held)


def _init(**kwargs: object) -> None:
    """`ray.init(**kwargs)`, signals held; where the process's handler raises for a signal that
    came meanwhile, Ray is shut down again before the error goes on."""
    import ray

    held: list[int] = []
    try:
        with _signals_held(held):
            ray.init(**kwargs)
    except BaseException:
        if held:  # a stop asked for meanwhile goes first
            _shutdown()
            _deliver(held)
        raise
    try:
        _deliver(held)
    except BaseException:
        _shutdown()
        raise


def _connected(address: str) -> Cluster:
    """The cluster just connected to; Ray is shut down again where even this is interrupted."""
    try:
        return Cluster(address=address, owned=True, gpus_by_node=_gpus_by_node())
    except BaseException:
        _shutdown()
        raise


def local_gpu_count() -> int | None:
    """The GPUs a local Ray cluster started here would count (Ray's own detection, this process's
    CUDA_VISIBLE_DEVICES respected), without starting it; None where Ray does not say."""
    try:
        from ray._private import accelerators

        manager = accelerators.get_accelerator_manager_for_resource("GPU")
        count = int(manager.get_current_node_num_accelerators())
        visible = manager.get_current_process_visible_accelerator_ids()
    except Exception as e:  # noqa: BLE001 - Ray's private API moved: Ray counts them when it starts
        log.debug("cannot count the GPUs before Ray starts: %s", e)
        return None
    return min(count, len(visible)) if visible is not None else count


def check_local_gpus(topology: Topology | None, runner: str, moe: bool = False) -> None:
    """Before a local cluster starts for `runner`: raise RuntimeUnavailableError, as
    :func:`gang_shape` does once it runs, where this machine's GPUs hold no gang of `topology`.
    A process already connected to Ray keeps that cluster (:func:`connect`): nothing to check here."""
    import ray

    if ray.is_initialized():
        return
    count = local_gpu_count()
    if count is not None:
        gang_shape(
            topology,
            Cluster(address="local", owned=False, gpus_by_node=(("this machine", count),)),
            runner,
            moe=moe,
        )


def connect(address: str | None, *, declared_gpus: int | None = None, verbose: bool = False) -> Cluster:
    """Connect to the Ray cluster at `address` (`HOST:PORT`, `ray://HOST:PORT` or `auto`), or start a
    local one when `address` is None. `declared_gpus` makes a local cluster declare that many GPUs
    (the CPU fixture runs on them); otherwise Ray counts the real ones. A process already
    connected stays connected to what it has."""
    import ray

    apply_to_current_process()
    if ray.is_initialized():
        return Cluster(address="(already connected)", owned=False, gpus_by_node=_gpus_by_node())
    address = address or os.environ.get("RAY_ADDRESS") or None
    common = dict(
        log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.ERROR, namespace="syncopate"
    )
    if address is None:
        kwargs = dict(include_dashboard=False, **common)
        if declared_gpus is not None:
            kwargs.update(num_gpus=declared_gpus, num_cpus=max(os.cpu_count() or 1, 1))
        _init(**kwargs)
        cluster = _connected("local")
        log.info("started a local Ray cluster: %s", cluster.describe())
        return cluster
    check_reachable(address)
    try:
        _init(address=address, **common)
    except ConnectionError as e:
        raise RuntimeUnavailableError(
            f"cannot connect to the Ray cluster at {address}: {str(e).splitlines()[0]} "
            f"Start one with `ray start --head`, "
            f"or leave out --ray-address to start a local cluster"
        ) from None
    cluster = _connected(address)
    log.info("connected to the Ray cluster at %s: %s", address, cluster.describe())
    return cluster


def gang_capacity(world_size: int, nodes: int, gpus_by_node: tuple[tuple[str, int], ...]) -> int:
    """How many gangs of `world_size` GPUs over `nodes` nodes fit at once: for one node,
    `world_size` GPUs of one node each; for N nodes, world_size / N GPUs on each of N distinct nodes."""
    if nodes == 1:
        return sum(g // world_size for _, g in gpus_by_node)
    slots = sorted((g // (world_size // nodes) for _, g in gpus_by_node), reverse=True)
    gangs = 0
    while len([s for s in slots if s > 0]) >= nodes:
        for i in range(nodes):
            slots[i] -= 1
        slots.sort(reverse=True)
        gangs += 1
    return gangs


def gang_shape(
    topology: Topology | None, cluster: Cluster, runner: str, *, moe: bool = False
) -> tuple[int, int]:
    """(world size, nodes) of one gang of `topology` (detected: all GPUs of the largest node);
    raises RuntimeUnavailableError unless the cluster holds at least one such gang (`moe`: the
    sweep lists MoE layers, whose test run without GPUs is runner cpu's)."""
    where = (
        "on this machine (Ray found none)"
        if cluster.address == "local"
        else f"in the Ray cluster at {cluster.address}"
    )
    if cluster.gpus == 0:
        need = topology.world_size if topology is not None else "at least one"
        test_run = (
            "--runner cpu for a test run of the MoE layers (gloo ranks on the CPU)"
            if moe
            else "--runner cpu-fixture for a test run"
        )
        raise RuntimeUnavailableError(
            f"no GPUs {where}: runner {runner} needs {need}; run on GPU nodes, or let the cost model "
            f"predict instead with --runner model (no GPU needed; its numbers are predictions), "
            f"or use {test_run}"
        )
    if topology is None:
        return max(g for _, g in cluster.gpus_by_node), 1
    ws, nodes = topology.world_size, topology.nodes
    if gang_capacity(ws, nodes, cluster.gpus_by_node) == 0:
        need = f"{ws} GPUs on one node" if nodes == 1 else f"{ws // nodes} GPUs on each of {nodes} nodes"
        raise RuntimeUnavailableError(
            f"topology {topology.key()} needs {need}; the cluster has {cluster.describe()}: "
            f"add GPUs, or choose a smaller topology"
        )
    return ws, nodes
