"""What this machine can do, the defaults that follow from it, and the rules that depend on it.

TRL's configs default to ``bf16=True`` and ``gradient_checkpointing=True`` everywhere; on a CPU both
make training several times slower (or fail), so ft turns them off there. A value the recipe sets
always wins. These checks run at the start of ``ft train``, before any model or data loads.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..recipe import Problem, Recipe
from ..recipe.methods import models_of
from ..recipe.optimizers import PACKAGES, traits
from ..recipe.processes import uses_deepspeed, uses_fsdp
from . import trackers

# the same optimizer, not CUDA-only, for each CUDA-only one
CPU_ALTERNATIVE = {"adalomo": "lomo", "galore_adamw_8bit": "galore_adamw",
                   "galore_adamw_8bit_layerwise": "galore_adamw_layerwise"}

# constructor arguments ft adds on a machine without CUDA, for optimizers whose transformers handler cannot be told
# them through optim_args (it reads only the keys in their Traits.args). torch-optimi decides Triton-or-not from
# an empty parameter list, so wherever Triton is importable it takes the Triton path, which fails on CPU tensors
# ("0 active drivers"); triton=False selects its for-loop path.
_NO_CUDA_OPTIMIZER_KWARGS = {"stable_adamw": {"triton": False}}


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    bf16: bool
    devices: int
    name: str

    @property
    def summary(self) -> str:
        return f"{self.devices}× {self.name}" if self.cuda else "CPU (no CUDA device)"


def probe() -> Hardware:
    import torch

    if torch.cuda.is_available():
        return Hardware(True, torch.cuda.is_bf16_supported(), torch.cuda.device_count(),
                        torch.cuda.get_device_name(0))
    return Hardware(False, cpu_has_bf16(), 0, "cpu")


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (the ``avx512_bf16`` or ``amx_bf16`` flag): without
    either, oneDNN emulates bfloat16 and it runs 3-7x slower than float32 (generating and scoring measured,
    benchmarks/README.md, generation_options). Where no x86 flags can be read (not Linux, an ARM CPU), True: no notice
    rather than a wrong one."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), None)
    return flags is None or bool({"avx512_bf16", "amx_bf16"} & set(flags))


def slow_bf16_notice(recipe: Recipe, hw: Hardware) -> str | None:
    """On a CPU without bfloat16 units (``Hardware.bf16`` False), the recipe keys that ask for bfloat16 (the weights,
    autocast, a reward or reference model's ``dtype``), said with what they cost here; None when none does."""
    if hw.cuda or hw.bf16:
        return None
    keys = [key for key, asked in (("model.dtype", recipe.model.dtype == "bfloat16"),
                                   ("train.bf16", bool(recipe.train_args.get("bf16")))) if asked]
    keys += [f"{extra.key.rsplit('.', 1)[0]}.dtype" for extra in models_of(recipe) if extra.dtype == "bfloat16"]
    if not keys:
        return None
    return (f"ft: notice: {', '.join(keys)} ask{'s' if len(keys) == 1 else ''} for bfloat16, and this CPU has no "
            "bfloat16 matrix units (no AVX512-BF16 or AMX flag in /proc/cpuinfo): bfloat16 is emulated here and "
            "runs 3-7x slower than float32 (training, generation and reward scoring alike). Remove "
            f"{'it' if len(keys) == 1 else 'them'} to run in float32 on this machine; keep "
            f"{'it' if len(keys) == 1 else 'them'} for a CPU or GPU that has them.")


def busy_cpu_notice(load: float, cores: int, threads: int) -> str | None:
    """What to say when other processes keep the CPU busy (``load``: the 1-minute load average, ``cores``: this
    machine's, ``threads``: torch's intra-op threads): torch's threads then wait on each other at every operation, and
    fewer threads run faster (measured on a busy 2-core machine: 25 tokens/s with 2 threads, 90-132 with 1). None when
    the cores left idle can run every thread."""
    idle = max(cores - load, 0.0)
    if load < 1 or threads <= max(1, int(idle)):
        return None
    fewer = max(1, int(idle))
    return (f"ft: other processes keep this CPU busy (load average {load:.1f} on {cores} cores) and torch runs "
            f"{threads} threads, which then wait on each other at every step; a run on a busy CPU is often faster "
            f"with fewer: set OMP_NUM_THREADS={fewer} before `ft train` (summary.json records torch_threads)")


def device_defaults(recipe: Recipe, hw: Hardware) -> dict:
    """Trainer arguments ft chooses for this machine. They fill only the keys the recipe leaves unset (the rule is
    applied where the config is built, ``ft.trainers.build``); here a default is also dropped when the recipe set
    its alias or its rival (``gradient_checkpointing`` for ``activation_checkpointing``, ``fp16`` for ``bf16``).
    Also the tracker, by what is installed here (``ft.machine.trackers.defaults``)."""
    explicit = recipe.train_args
    if hw.cuda:
        # TRL's own default, restated under transformers' new name so it warns of no deprecation
        defaults = {"bf16": hw.bf16, "activation_checkpointing": True}
    else:
        # use_cpu: several processes (torchrun) then train data-parallel over gloo instead of each on its own
        defaults = {"bf16": False, "activation_checkpointing": False, "dataloader_pin_memory": False, "use_cpu": True}
    if "fp16" in explicit:
        defaults.pop("bf16")
    if "gradient_checkpointing" in explicit:  # the deprecated alias counts as setting it
        defaults.pop("activation_checkpointing")
    return {**defaults, **trackers.defaults(recipe)}  # report_to: tensorboard where it is installed


def check_hardware(recipe: Recipe, hw: Hardware, processes: int = 1) -> list[Problem]:
    """What this machine cannot run of the recipe with ``processes`` processes (checked before any model or data
    loads)."""
    problems = []
    train = recipe.train_args
    if recipe.model.quantization is not None:
        problems += _quantization_problems(hw)
    if not hw.cuda and train.get("fp16"):
        problems.append(Problem("train.fp16", "fp16 mixed precision needs a CUDA GPU and none is visible; "
                                "remove it (CPU trains in float32) or use `train.bf16: true`."))
    if hw.cuda and train.get("bf16") and not hw.bf16:
        problems.append(Problem("train.bf16", f"this GPU ({hw.name}) does not support bfloat16; "
                                "use `train.fp16: true` instead."))
    if not hw.cuda and train.get("use_liger_kernel"):
        problems.append(Problem("train.use_liger_kernel", "Liger kernels are Triton GPU kernels and no CUDA "
                                "device is visible; remove `train.use_liger_kernel` here."))
    if train.get("use_vllm"):
        problems += _vllm_problems(hw)
    problems += _optimizer_problems(recipe, hw)
    problems += _distributed_problems(recipe, hw, processes)
    problems += trackers.problems(recipe)  # train.report_to naming a tracker that is not installed
    return problems


def optimizer_defaults(recipe: Recipe, hw: Hardware) -> dict:
    """Keyword arguments ft adds to the named optimizer's constructor on this machine (on top of what transformers'
    handler builds from the recipe): ``{"triton": False}`` for ``stable_adamw`` without CUDA, else nothing."""
    return {} if hw.cuda else dict(_NO_CUDA_OPTIMIZER_KWARGS.get(recipe.optimizer.name, {}))


def _quantization_problems(hw: Hardware) -> list[Problem]:
    """4/8-bit loading runs wherever the installed bitsandbytes has kernels for the device: asked of bitsandbytes
    (its ``supported_torch_devices``; the CPU since its multi-backend releases), not assumed to be CUDA only."""
    device = "cuda" if hw.cuda else "cpu"
    try:
        import bitsandbytes
    except ImportError as exc:
        return [Problem("model.quantization", f"4/8-bit loading needs bitsandbytes, which does not import here "
                        f"({exc}); run `pip install bitsandbytes`, or remove `model.quantization`.")]
    supported = getattr(bitsandbytes, "supported_torch_devices", {"cuda"})  # older releases: CUDA only
    if device not in supported:
        return [Problem("model.quantization", f"the installed bitsandbytes {bitsandbytes.__version__} cannot load "
                        f"4/8-bit weights on this machine's {device} (it supports {', '.join(sorted(supported))}); "
                        "upgrade bitsandbytes, or remove `model.quantization` to train in full precision here.")]
    return []


def _vllm_problems(hw: Hardware) -> list[Problem]:
    """GRPO's and RLOO's generation through vLLM (``train.use_vllm``): CUDA GPUs only, and a package ft does not
    install (it pins its own torch build)."""
    if not hw.cuda:
        return [Problem("train.use_vllm", "vLLM generates on CUDA GPUs and no CUDA device is visible; remove "
                        "`train.use_vllm` here: the trainer then generates with transformers' `generate`.")]
    if importlib.util.find_spec("vllm") is None:
        return [Problem("train.use_vllm", "vLLM is not installed here (ft does not install it: each vLLM release "
                        "pins its torch); `pip install vllm` for this machine's torch and CUDA, or remove "
                        "`train.use_vllm` to generate with transformers' `generate`.")]
    return []


def _optimizer_problems(recipe: Recipe, hw: Hardware) -> list[Problem]:
    name = recipe.optimizer.name
    info = traits(name)
    if info.cuda_only and not hw.cuda:
        return [Problem("optimizer.name", f"`{name}` runs on CUDA GPUs only (it fails on a CPU-only torch) and none "
                        f"is visible; on this machine use `{CPU_ALTERNATIVE.get(name, 'adamw_torch')}`.")]
    if info.package and importlib.util.find_spec(PACKAGES[info.package].module) is None:
        return [Problem("optimizer.name", _missing_package(name, info.package))]
    return []


def _distributed_problems(recipe: Recipe, hw: Hardware, processes: int) -> list[Problem]:
    """DeepSpeed where it is not installed (ft does not install it: it builds CUDA kernels against the machine's
    toolkit), and FSDP over several processes without CUDA: accelerate attaches its FSDP plugin only for GPU-like
    distributed types, and on the CPU (``DistributedType.MULTI_CPU``, which ``use_cpu`` gives) drops it, so the
    Trainer would train plain DDP with none of the sharding the recipe asks for (and with ``use_cpu: false`` on a
    machine without GPUs, transformers stops with "Using fsdp only works in distributed training")."""
    problems = []
    if uses_deepspeed(recipe) and importlib.util.find_spec("deepspeed") is None:
        key = "distributed.kind" if recipe.distributed.kind == "deepspeed" else "train.deepspeed"
        problems.append(Problem(key, "DeepSpeed is not installed here (ft does not install it); run `pip install "
                                "deepspeed` on a machine with the CUDA toolkit, or use `distributed.kind: fsdp` (no "
                                "extra package)."))
    if uses_fsdp(recipe) and not hw.cuda and processes > 1:
        key = "distributed.kind" if recipe.distributed.kind == "fsdp" else "train.fsdp"
        problems.append(Problem(key, f"FSDP needs GPUs: on a machine without CUDA accelerate trains the "
                                f"{processes} processes as plain DDP (it has no FSDP for CPU processes), "
                                "sharding nothing. Use `distributed.kind: ddp` here, and FSDP on GPUs."))
    return problems


def _missing_package(name: str, package: str) -> str:
    """Why ``name`` cannot train here and the fix, by where the package comes from (``PACKAGES``)."""
    source = PACKAGES[package]
    if source.install == "ft[optim]":
        return (f"`{name}` needs the `{package}` package, which is not installed; run `pip install {package}` "
                "(or `pip install 'ft[optim]'` for all of ft's optional optimizers).")
    if source.install == "ft":
        return (f"`{name}` needs the `{package}` package, one of ft's own dependencies, which is not installed; "
                f"run `pip install {package}` (or reinstall ft).")
    if source.install == "pip":
        return (f"`{name}` needs `{package}` ({source.purpose}), which ft does not install; run "
                f"`pip install {package}`, or choose e.g. `adamw_torch`.")
    return (f"`{name}` needs `{package}` ({source.purpose}), which is not installed and which ft does not install; "
            "on this machine choose e.g. `adamw_torch`.")
