"""GPU presets: dense peak TFLOP/s per dtype, HBM capacity and bandwidth, NVLink and
network bandwidth per GPU, GPUs per node; each from its vendor's datasheet (``source``).

Conventions: peaks are *dense* tensor-core figures (the datasheets' sparsity figures
halved); ``hbm_bytes`` is the datasheet's "GB" read as GiB (the capacity ``nvidia-smi``
reports, e.g. 81,559 MiB on an H100 SXM, is within 1% of 80 GiB); ``nvlink_bandwidth``
is bytes/s per GPU per direction (half the datasheets' bidirectional figure);
``network_bandwidth`` is bytes/s per GPU per direction of the scale-out NIC the vendor's
reference system gives each GPU (one 400 Gb/s ConnectX-7 per H100/H200/B200/MI300X, one
200 Gb/s HDR per A100). Every field can be overridden (:func:`gpu_preset`), within the
range a real GPU has (:data:`GPU_RANGES`).

Plain Python + pydantic.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from schedsim.errors import ScenarioError
from schedsim.util.units import GIB as GiB     # bytes in a GiB (one home)

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: bytes per element of each dtype (tf32 is stored as fp32)
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_T, _G = 1e12, 1e9


#: the range of each figure of a GPU, in its unit: what a real GPU (datacenter, any
#: vendor, with room for a few generations) can have, so that a figure in another unit
#: (``hbm_bytes = 80`` meant as GiB, ``peak_tflops.bf16 = 989e12`` as FLOP/s,
#: ``hbm_bandwidth = 3.35`` as TB/s) is refused naming the unit and the range rather
#: than run. ``field: (lowest, highest, unit, the range as text)``; ``peak_tflops`` holds
#: for each dtype's entry.
GPU_RANGES: dict[str, tuple[float, float, str, str]] = {
    "peak_tflops": (1.0, 20_000.0, "TFLOP/s", "1 to 20,000 TFLOP/s (dense)"),
    "hbm_bytes": (float(GiB), float(4096 * GiB), "bytes", "1 GiB to 4 TiB, in bytes"),
    "hbm_bandwidth": (1e11, 1e14, "bytes/s", "1e11 to 1e14 bytes/s (100 GB/s to 100 TB/s)"),
    "nvlink_bandwidth": (1e9, 1e13, "bytes/s", "1e9 to 1e13 bytes/s per direction (1 GB/s "
                         "to 10 TB/s)"),
    "network_bandwidth": (1e8, 1e12, "bytes/s", "1e8 to 1e12 bytes/s per direction (0.8 to "
                          "8,000 Gb/s)"),
    "gpus_per_node": (1, 1024, "GPUs", "1 to 1,024 GPUs a node"),
}


def check_gpu_figure(key: str, value: float, preset: dict[str, Any] | None = None) -> None:
    """Raise ``ValueError`` when ``value`` of GPU figure ``key`` (a field of
    :data:`GPU_RANGES`; ``peak_tflops.DTYPE`` for a peak) lies outside its range (NaN
    and infinities included), naming the key, the value, the unit and the range (and
    ``preset``'s own figure, when given, as an example of the unit)."""
    field = key.split(".")[0]
    lo, hi, unit, text = GPU_RANGES[field]
    if not lo <= value <= hi:
        ref = _figure(preset, key) if preset else None
        eg = (f"; {preset['name']} has {_figure_text(ref, unit)}"   # type: ignore[index]
              if ref is not None else "")
        raise ValueError(f"{key} = {value:g} is out of range for a real GPU: {text}{eg}")


def _figure(preset: dict[str, Any], key: str) -> float | None:
    field, _, dtype = key.partition(".")
    v = preset.get(field, Hardware.model_fields[field].default)
    return v.get(dtype) if isinstance(v, dict) else v


def _figure_text(value: float, unit: str) -> str:
    """A preset's figure in its unit: ``85899345920 bytes (80 GiB)``, ``3.35e+12
    bytes/s``, ``989.4 TFLOP/s``, ``8 GPUs``."""
    if unit == "bytes":
        from schedsim.util.units import fmt_gib

        return f"{value:.0f} bytes ({fmt_gib(value)})"
    return f"{value:g} {unit}"


#: spellings of other tools (and datasheets) for a GPU figure -> the field
_KEY_HINTS = {"memory": "hbm_bytes", "hbm": "hbm_bytes", "hbm_gb": "hbm_bytes",
              "hbm_gib": "hbm_bytes", "memory_bytes": "hbm_bytes", "mem": "hbm_bytes",
              "bandwidth": "hbm_bandwidth", "memory_bandwidth": "hbm_bandwidth",
              "tflops": "peak_tflops", "flops": "peak_tflops", "peak_flops": "peak_tflops"}


def _key_hint(key: str) -> str:
    """For an unknown GPU key: the field it names elsewhere with its unit and range
    (``memory`` -> ``hbm_bytes, in bytes: 1 GiB to 4 TiB``), else a typo suggestion."""
    from schedsim.util.suggest import did_you_mean

    field = _KEY_HINTS.get(key.lower())
    if field is None:
        return did_you_mean(key, Hardware.model_fields)
    return f" (the field is {field}: {GPU_RANGES[field][3]})"


class Hardware(BaseModel):
    """One GPU type (module docstring). ``peak_tflops``: dense TFLOP/s per dtype (a dtype
    the GPU lacks is absent: asking for it raises :class:`ScenarioError`). Every figure
    lies in its range of :data:`GPU_RANGES` (``ValueError`` naming it otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    peak_tflops: dict[Dtype, float]
    hbm_bytes: float
    hbm_bandwidth: float
    nvlink_bandwidth: float
    network_bandwidth: float
    gpus_per_node: int = 8
    source: str = ""

    @model_validator(mode="after")
    def _in_range(self) -> "Hardware":
        preset = GPUS.get(self.name)
        for dt, v in self.peak_tflops.items():
            check_gpu_figure(f"peak_tflops.{dt}", v, preset)
        for key in GPU_RANGES:
            if key != "peak_tflops":
                check_gpu_figure(key, getattr(self, key), preset)
        return self

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of ``dtype``. Raises ScenarioError when the GPU has none."""
        v = self.peak_tflops.get(dtype)      # type: ignore[call-overload]
        if v is None:
            raise ScenarioError(f"{self.name} has no {dtype} tensor-core peak (it has "
                                f"{', '.join(self.peak_tflops)}): pick another gemm dtype "
                                f"or set gpu peak_tflops.{dtype}")
        return v * _T


def _tf(fp32: float, tf32: float, bf16: float, fp8: float | None) -> dict[str, float]:
    d = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16}
    if fp8:
        d["fp8"] = fp8
    return d


#: name -> fields (see the module docstring for the conventions)
GPUS: dict[str, dict[str, Any]] = {
    "a100-80gb": dict(
        name="a100-80gb", peak_tflops=_tf(19.5, 156, 312, None), hbm_bytes=80 * GiB,
        hbm_bandwidth=2039 * _G, nvlink_bandwidth=300 * _G, network_bandwidth=25 * _G,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB: 312 TFLOPS BF16 dense, "
               "2,039 GB/s, NVLink 600 GB/s); DGX A100: 1x 200 Gb/s HDR per GPU"),
    "h100-sxm": dict(
        name="h100-sxm", peak_tflops=_tf(67, 494.7, 989.4, 1978.9), hbm_bytes=80 * GiB,
        hbm_bandwidth=3350 * _G, nvlink_bandwidth=450 * _G, network_bandwidth=50 * _G,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM: 1,979 TFLOPS BF16 and 3,958 "
               "FP8 with sparsity, 3.35 TB/s, NVLink 900 GB/s); DGX H100: 1x 400 Gb/s "
               "ConnectX-7 per GPU"),
    "h800": dict(
        name="h800", peak_tflops=_tf(67, 494.7, 989.4, 1978.9), hbm_bytes=80 * GiB,
        hbm_bandwidth=3350 * _G, nvlink_bandwidth=200 * _G, network_bandwidth=50 * _G,
        source="NVIDIA H800 SXM5 (H100 compute and HBM, NVLink 400 GB/s); DeepSeek-V3 "
               "report section 3.1: 8 GPUs per node, 400 Gb/s InfiniBand per GPU"),
    "h200": dict(
        name="h200", peak_tflops=_tf(67, 494.7, 989.4, 1978.9), hbm_bytes=141 * GiB,
        hbm_bandwidth=4800 * _G, nvlink_bandwidth=450 * _G, network_bandwidth=50 * _G,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB, 4.8 TB/s, H100 "
               "compute, NVLink 900 GB/s); HGX H200: 1x 400 Gb/s per GPU"),
    "b200": dict(
        name="b200", peak_tflops=_tf(75, 1100, 2250, 4500), hbm_bytes=180 * GiB,
        hbm_bandwidth=7700 * _G, nvlink_bandwidth=900 * _G, network_bandwidth=50 * _G,
        source="NVIDIA HGX B200 datasheet per GPU (4.5 PFLOPS BF16, 9 FP8, 2.2 TF32 with "
               "sparsity; 1,440 GB and 62 TB/s per 8 GPUs; NVLink 5 1.8 TB/s); DGX B200: "
               "1x 400 Gb/s per GPU"),
    "mi300x": dict(
        name="mi300x", peak_tflops=_tf(163.4, 653.7, 1307.4, 2614.9), hbm_bytes=192 * GiB,
        hbm_bandwidth=5300 * _G, nvlink_bandwidth=448 * _G, network_bandwidth=50 * _G,
        source="AMD Instinct MI300X datasheet (1,307.4 TFLOPS BF16 dense, 2,614.9 FP8, "
               "192 GB HBM3 at 5.3 TB/s, Infinity Fabric 896 GB/s peer-to-peer); 1x 400 "
               "Gb/s NIC per GPU"),
}


def gpu_preset(name: str | Hardware, **overrides: Any) -> Hardware:
    """The preset ``name`` (or a :class:`Hardware` as is) with ``overrides`` applied
    (``peak_tflops`` entries merge into the preset's). Raises :class:`ScenarioError` for
    an unknown name or a bad override (named; a figure outside :data:`GPU_RANGES` with
    its unit and range)."""
    from schedsim.util.suggest import did_you_mean

    if isinstance(name, Hardware):
        base = name.model_dump()
    else:
        key = str(name).lower()
        if key not in GPUS:
            raise ScenarioError(f"unknown gpu {name!r}{did_you_mean(key, GPUS)}: expected one "
                                f"of {', '.join(GPUS)}")
        base = dict(GPUS[key])
    if "peak_tflops" in overrides and isinstance(overrides["peak_tflops"], dict):
        overrides = {**overrides, "peak_tflops": {**base["peak_tflops"],
                                                  **overrides["peak_tflops"]}}
    try:
        return Hardware.model_validate({**base, **overrides})
    except ValidationError as e:
        from schedsim.util.validation import describe_error, error_location

        err = e.errors()[0]
        if err["type"] == "extra_forbidden":
            raise ScenarioError(f"gpu {base['name']}: unknown key "
                                f"{error_location(tuple(err['loc']))}"
                                f"{_key_hint(str(err['loc'][0]))} (keys: "
                                f"{', '.join(Hardware.model_fields)})") from None
        raise ScenarioError(f"gpu {base['name']}: {describe_error(err)}") from None


def mem_limit_above_hbm(nbytes: float, gpu: Hardware) -> str | None:
    """Why a memory limit of ``nbytes`` per GPU is refused on ``gpu``, or None: a limit
    above the GPU's HBM would pass layouts and plans whose peak cannot fit the GPU
    (``plan --mem-limit 500GiB`` recommended an 83.4 GiB peak on an 80 GiB H100), so
    ``plan --mem-limit``, ``simulate --mem-limit`` and ``[schedule] mem_limit`` with a
    ``[workload]`` all refuse it by this one rule. The text reads after the flag or key
    (``500 GiB is above the h100-sxm's 80 GiB; give at most 80GiB``), the suggestion
    one that is at most the HBM as typed."""
    hbm = gpu.hbm_bytes
    if not nbytes > hbm:
        return None
    import math

    from schedsim.util.units import fmt_gib_pair, fmt_time

    if hbm % GiB == 0:
        most = f"{int(hbm // GiB)}GiB"
    elif hbm % 10 ** 9 == 0:
        most = f"{int(hbm // 10 ** 9)}GB"
    else:       # 4 significant digits rounded down (fmt_time's), so the suggestion passes
        v = hbm / GiB
        d = 10 ** max(0, 4 - len(str(int(v))))
        most = f"{fmt_time(math.floor(v * d) / d)}GiB"
    given, has = fmt_gib_pair(nbytes, hbm)      # (two sizes that differ never read alike)
    return f"{given} is above the {gpu.name}'s {has}; give at most {most}"
