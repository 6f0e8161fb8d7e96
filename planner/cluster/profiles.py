"""Machine profiles: datasheet constants of a device and its interconnects, never measured.

Profiles are read from the datasheet table shipped in the package
(``planner/cluster/data/hardware.csv``, each constant's source cited in its header; ``--hardware
PATH`` reads another table in the same format), from a user JSON file, or are the built-in
``symbolic`` profile (SMSG's premise: per-device computation and communication volumes in one
unit, 1 FLOP = 1 byte = 1 ns, every byte charged; no latency).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from planner.jsonfile import read_json, read_text
from planner.errors import ProfileError

# None: the table shipped inside the package (planner/cluster/data/hardware.csv).
DEFAULT_HARDWARE_CSV: Path | None = None


def _hardware_text(path: Path | str | None) -> tuple[str, str]:
    """The datasheet table's text and a name for messages (the built-in table when ``path`` is
    None)."""
    if path is None:
        return resources.files("planner.cluster").joinpath("data", "hardware.csv").read_text(
            encoding="utf-8"
        ), "built-in"
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"--hardware: table {path}: file not found")
    # a datasheet table is a few KiB; a file past 16 MiB is not one
    return read_text(path, f"--hardware: table {path}", ProfileError, 16 << 20), str(path)


# Latencies are not in the datasheet table: documented assumptions (NCCL-scale per-hop latency).
INTRA_NODE_LATENCY_S = 2e-6
INTER_NODE_LATENCY_S = 8e-6
# Sustained fraction of peak FLOP/s; Megatron-LM measures 44-52% (SC'21 Table 1). Fitted in
# experiments/fidelity.py.
DEFAULT_EFFICIENCY = 0.5
# Roofline model (planner/cost/compute.py). Documented assumptions, not fitted: large BF16 GEMMs in
# cuBLAS/CUTLASS sustain about 80% of the tensor-core peak; a kernel launch costs about 4 us of GPU
# idle time in eager frameworks.
DEFAULT_GEMM_EFFICIENCY = 0.8
KERNEL_LAUNCH_S = 4e-6
# A profile's rates (FLOP/s, bytes/s) and delays outside these are no device's (a typo in a
# profile's exponent), refused by field.
MIN_RATE = 1e3
MAX_DELAY_S = 1.0
# above these, a step's costs round to nothing (every plan 0 s: no optimum to find) or a memory
# figure prints hundreds of digits; today's fastest devices are near 2e15 FLOP/s and 1e13 B/s
MAX_RATE = 1e18
MAX_MEMORY_BYTES = 2.0**60
RATES = (
    "peak_flops",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "hbm_bandwidth",
    "vector_flops",
    "fp8_flops",
)
# 1 byte costs 1 ns: the integer objective of the symbolic profile is in bytes.
SYMBOLIC_BANDWIDTH = 1e9
# The one ratio of the symbolic profile: FLOPs computed per byte moved at equal cost, the order
# of a GPU's tensor-core rate over its NVLink bandwidth (A100: 312 TFLOP/s / 300 GB/s = 1,040;
# H100: 989 / 450 = 2,200).
SYMBOLIC_FLOPS_PER_BYTE = 1000


@dataclass(frozen=True, slots=True)
class MachineProfile:
    """Datasheet constants of one device type and its interconnects."""

    name: str
    peak_flops: float
    memory_bytes: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    gpus_per_node: int
    efficiency: float = DEFAULT_EFFICIENCY
    intra_node_latency: float = INTRA_NODE_LATENCY_S
    inter_node_latency: float = INTER_NODE_LATENCY_S
    compute_weight: float = 1.0  # 0: compute ignored, strategies ranked by communication alone
    # share of the communication hidden behind compute that the objective counts as hidden (0:
    # every byte is charged, as SMSG charges it: the symbolic profile)
    overlap_weight: float = 1.0
    # bytes/s; 0: unknown, the roofline is off (flops / (peak x efficiency))
    hbm_bandwidth: float = 0.0
    sm_count: int = 0  # streaming multiprocessors (wave quantisation); 0: unknown, no quantisation
    vector_flops: float = 0.0  # non-tensor FP32 FLOP/s (elementwise ops); 0: the tensor peak
    gemm_efficiency: float = DEFAULT_GEMM_EFFICIENCY
    kernel_launch_s: float = KERNEL_LAUNCH_S
    roofline: bool = True  # False: cost model v1's compute, for ablation
    # bytes a process holds outside its tensors (CUDA context, NCCL buffers, workspaces): not
    # derived, subtracted from memory_bytes for the plan's budget (hardware.csv says its sources)
    reserve_bytes: float = 0.0
    # dense FP8 tensor FLOP/s (the GEMMs of ``dtype fp8``); 0: no FP8 tensor cores
    fp8_flops: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "peak_flops",
            "memory_bytes",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
            "efficiency",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' must be a positive finite number, got "
                    f"{value!r}"
                )
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node <= 0:
            raise ProfileError(
                f"profile {self.name}: field 'gpus_per_node' must be a positive integer"
            )
        if self.efficiency > 1:
            raise ProfileError(
                f"profile {self.name}: field 'efficiency' is a fraction of peak, at most 1, got "
                f"{self.efficiency!r}"
            )
        for name in (
            "intra_node_latency",
            "inter_node_latency",
            "compute_weight",
            "overlap_weight",
            "hbm_bandwidth",
            "vector_flops",
            "kernel_launch_s",
            "sm_count",
            "reserve_bytes",
            "fp8_flops",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ProfileError(
                    f"profile {self.name}: field '{name}' must be a non-negative number"
                )
        self._check_kinds()
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Rates and times no device has are refused here, by field, rather than found later as
        a cost out of the integer objective's range (which reads as a model too large)."""
        for name in ("peak_flops", "intra_node_bandwidth", "inter_node_bandwidth"):
            if getattr(self, name) < MIN_RATE:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' ({getattr(self, name):g}) is below "
                    f"{MIN_RATE:g} per second: no device is that slow"
                )
        for name in ("hbm_bandwidth", "vector_flops", "fp8_flops"):
            if 0 < getattr(self, name) < MIN_RATE:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' ({getattr(self, name):g}) is below "
                    f"{MIN_RATE:g} per second (0: unknown)"
                )
        for name in RATES:
            if getattr(self, name) > MAX_RATE:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' ({getattr(self, name):g}) is over "
                    f"{MAX_RATE:g} per second: no device is that fast"
                )
        for name in ("memory_bytes", "reserve_bytes"):
            if getattr(self, name) > MAX_MEMORY_BYTES:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' ({getattr(self, name):g}) is over "
                    f"2^60 bytes: no device holds that much"
                )
        for name in ("intra_node_latency", "inter_node_latency", "kernel_launch_s"):
            if getattr(self, name) > MAX_DELAY_S:
                raise ProfileError(
                    f"profile {self.name}: field '{name}' ({getattr(self, name):g} s) is over "
                    f"{MAX_DELAY_S:g} s: no link or launch is that slow"
                )

    def _check_kinds(self) -> None:
        """Whole numbers, fractions and flags, and a reserve that leaves memory."""
        if not isinstance(self.sm_count, int):
            raise ProfileError(f"profile {self.name}: field 'sm_count' must be a whole number")
        if not isinstance(self.gemm_efficiency, (int, float)) or not 0 < self.gemm_efficiency <= 1:
            raise ProfileError(
                f"profile {self.name}: field 'gemm_efficiency' is a fraction of peak in (0, 1]"
            )
        if not isinstance(self.roofline, bool):
            raise ProfileError(f"profile {self.name}: field 'roofline' must be true or false")
        if self.reserve_bytes >= self.memory_bytes:
            raise ProfileError(
                f"profile {self.name}: field 'reserve_bytes' ({self.reserve_bytes:g}) leaves no "
                f"memory of 'memory_bytes' ({self.memory_bytes:g})"
            )

    @property
    def budget_bytes(self) -> float:
        """The memory a plan may use per device: the device's less its reserve."""
        return self.memory_bytes - self.reserve_bytes

    @property
    def flops_per_second(self) -> float:
        return self.peak_flops * self.efficiency

    def with_overrides(self, **changes: float) -> "MachineProfile":
        fields = {f: getattr(self, f) for f in self.__slots__}
        fields.update(changes)
        return MachineProfile(**fields)


# SMSG's premise (symbolic, profiling-free): a plan is ranked by its per-device volumes alone, in
# one unit: a byte moved costs 1 ns and SYMBOLIC_FLOPS_PER_BYTE FLOPs computed cost as much; every
# byte charged (no overlap), no latency, no launches, no roofline. Computation counts, as SMSG's
# balanced halving assumes it does: splitting an operator over p devices divides its FLOPs by p,
# so the exact plan shards wherever sharding lowers the per-device volume, and among equal splits
# the communication decides.
SYMBOLIC = MachineProfile(
    "symbolic",
    peak_flops=SYMBOLIC_BANDWIDTH * SYMBOLIC_FLOPS_PER_BYTE,
    memory_bytes=1e15,
    intra_node_bandwidth=SYMBOLIC_BANDWIDTH,
    inter_node_bandwidth=SYMBOLIC_BANDWIDTH,
    gpus_per_node=8,  # every link is alike: only the axes' names follow the datasheet devices'
    efficiency=1.0,
    intra_node_latency=0.0,
    inter_node_latency=0.0,
    kernel_launch_s=0.0,
    gemm_efficiency=1.0,
    overlap_weight=0.0,
)


def load_profiles(path: Path | str | None = DEFAULT_HARDWARE_CSV) -> dict[str, MachineProfile]:
    """Read every device row of a datasheet table in the format of ``hardware.csv`` (None:
    built-in)."""
    text, path = _hardware_text(path)
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    profiles = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("device") in profiles:
            raise ProfileError(
                f"hardware table {path}: device {row['device']!r} has two rows (which one?)"
            )
        try:
            profiles[row["device"]] = MachineProfile(
                name=row["device"],
                peak_flops=float(row["peak_bf16_flops"]),
                memory_bytes=float(row["hbm_bytes"]),
                intra_node_bandwidth=float(row["intra_node_bandwidth"]),
                inter_node_bandwidth=float(row["inter_node_bandwidth_per_gpu"]),
                gpus_per_node=int(row["gpus_per_node"]),
                hbm_bandwidth=float(row.get("hbm_bandwidth") or 0),
                sm_count=int(row.get("sm_count") or 0),
                vector_flops=float(row.get("fp32_vector_flops") or 0),
                reserve_bytes=float(row.get("reserve_bytes") or 0),
                gemm_efficiency=float(row.get("gemm_efficiency") or DEFAULT_GEMM_EFFICIENCY),
                fp8_flops=float(row.get("peak_fp8_flops") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(
                f"hardware table {path}: row {row.get('device')!r} is malformed ({exc})"
            ) from None
    return profiles


def profile_from_json(path: Path | str) -> MachineProfile:
    """A user profile: a JSON object with the fields of ``MachineProfile``."""
    data = read_json(path, "--device", ProfileError)
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path}: must hold a JSON object")
    known = set(MachineProfile.__slots__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"profile file {path}: unknown field {unknown[0]!r}")
    data.setdefault("name", Path(path).stem)
    if not isinstance(data["name"], str) or not data["name"].strip():
        raise ProfileError(f"profile file {path}: field 'name' must be a non-empty string")
    try:
        return MachineProfile(**data)
    except TypeError as exc:
        raise ProfileError(f"profile file {path}: {exc}") from None


def get_profile(
    name: str, hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV
) -> MachineProfile:
    """A profile by name (``symbolic``, a row of the hardware table) or by path to a JSON file."""
    if not isinstance(name, str):
        raise ProfileError(
            f"--device: a device name or a profile file's path (or a MachineProfile), got {name!r}"
        )
    if name == "symbolic":
        return SYMBOLIC
    if name.endswith(".json"):
        return profile_from_json(name)
    profiles = load_profiles(hardware_csv)
    if name not in profiles:
        import difflib

        close = difflib.get_close_matches(name, list(profiles) + ["symbolic"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ProfileError(
            f"--device: unknown device profile {name!r}{hint} (known: symbolic, "
            f"{', '.join(sorted(profiles))})"
        )
    return profiles[name]
