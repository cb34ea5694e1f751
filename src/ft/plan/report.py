"""The report of ``ft plan``: the estimate for a recipe on a device, whether it fits the GPU's memory, and changes that
make it fit when it does not (as text, or as JSON with ``--json``). For a vision-language model it also says what its
vision tower and projector hold and train, and what a row's images cost: tokens per image, images per row, and the
share of the sequence their tokens take."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..recipe import Recipe
from ..units import human
from .memory import CPU_RUNTIME, FITS_BELOW, Estimate, Param, Setup, estimate, parameters, setup_for
from .shape import PlanError, Shape, read_shape
from .suggest import Suggestion, set_args, suggestions, yaml_value
from .vision import PARTS, image_load


def parse_memory(text: str) -> float:
    """'80GiB', '24GB', '16G' (GiB), '81920MiB', '80' (GiB) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*", text, re.I)
    if not match or float(match.group(1)) <= 0:
        raise PlanError(f"--gpu-memory: {text!r} is not an amount of memory; write it like 80GiB, 24GB or 16G.")
    value, prefix, suffix = float(match.group(1)), match.group(2).upper() or "G", match.group(3)
    power = "KMGT".index(prefix) + 1
    return value * (1000**power if suffix.upper() == "B" else 1024**power)


def local_gpu_memory() -> float | None:
    """Memory of this machine's first GPU, or None without CUDA."""
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


@dataclass(frozen=True)
class Plan:
    source: str
    shape: Shape
    estimate: Estimate
    budget: float | None
    suggestions: list[Suggestion]

    @property
    def vllm_bytes(self) -> float | None:
        """What vLLM holds on each GPU beside training (``Setup.vllm_share`` of its memory); None without a GPU's
        size to take the share of."""
        return None if self.budget is None else self.estimate.setup.vllm_share * self.budget

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.estimate.total <= room(self.budget, self.estimate.setup)

    @property
    def process_peak(self) -> float | None:
        """On a CPU, the peak RSS of the ``ft train`` process: the estimate and the libraries' own memory
        (``CPU_RUNTIME``), what summary.json's ``peak_memory_gb`` measures. None on a GPU."""
        return self.estimate.total + CPU_RUNTIME if self.estimate.setup.device == "cpu" else None

    def drivers(self) -> str:
        """What makes the peak, in words: the moment it is in and the parts that grow with the recipe's keys."""
        e, s = self.estimate, self.estimate.setup
        if e.phase == "evaluation":
            return (f"The peak is the evaluation pass: {s.eval_batch} rows × {s.max_length} tokens × "
                    f"{self.shape.vocab} logits (train.per_device_eval_batch_size, data.max_length, the "
                    "vocabulary); a smaller evaluation batch lowers it.")
        weights = next((p.at_peak for p in e.parts if p.name.startswith("weights")), 0.0)
        return (f"The peak is the training step's {e.phase}: its activations and logits grow with "
                f"train.per_device_train_batch_size ({s.batch}) × data.max_length ({s.max_length}); the weights "
                f"({human(weights)}) do not.")

    def as_dict(self) -> dict:
        e = self.estimate
        return {
            "recipe": self.source, "model": asdict(self.shape), "setup": asdict(e.setup),
            "parameters": e.params, "trainable_parameters": e.trainable, "vision": self.vision_dict(),
            "components": [{"name": p.name, "bytes": round(p.size), "at_peak_bytes": round(p.at_peak)}
                           for p in e.parts],
            "peak_bytes": round(e.total), "peak_phase": e.phase,
            "process_peak_bytes": None if self.process_peak is None else round(self.process_peak),
            "gpu_memory_bytes": None if self.budget is None else round(self.budget), "fits": self.fits,
            "vllm_bytes": None if self.vllm_bytes is None else round(self.vllm_bytes),
            "suggestions": [{"changes": x.changes, "set": set_args(x.changes), "peak_bytes": round(x.estimate.total)}
                            for x in self.suggestions],
        }

    def vision_dict(self) -> dict | None:
        """A vision-language model's parts (parameters, trained ones, their state) and its images, or None."""
        load = self.estimate.setup.images
        if self.shape.vision is None or load is None:
            return None
        params = parameters(self.shape, self.estimate.setup)
        return {**{part: {"parameters": _count(params, part), "trainable_parameters": _count(params, part, True),
                          "state": _state(params, part)} for part in PARTS},
                **asdict(load), "image_token_share": self._share()}

    def _share(self) -> float:
        """The share of the sequence a row's image tokens take (the worst row's, at most all of it)."""
        load, length = self.estimate.setup.images, self.estimate.setup.max_length
        return min(load.row_tokens / length, 1.0)

    def _vision_lines(self) -> list[str]:
        """What the vision tower and projector hold and train, and what a row's images cost."""
        v, s = self.shape.vision, self.estimate.setup
        load, params = s.images, parameters(self.shape, s)
        tower, projector = (f"{_millions(_count(params, part))} parameters, {_state(params, part)}" for part in PARTS)
        lines = [f"vision: {v.family}; tower {v.tower} ({v.layers} layers, hidden {v.hidden}) {tower}; "
                 f"projector {projector}"]
        per_image = f"{load.tokens_per_image} tokens per image" if load.tokens_per_image else "tokens per image unknown"
        share = f"{self._share():.1%} of the {s.max_length}-token sequence"
        if load.source != "data":
            lines += [f"images: {per_image} ({load.detail})",
                      f"        per row unknown, counted as one: {load.row_tokens} image tokens a row, {share}"]
        elif load.images_per_row:
            lines += [f"images: {per_image}, {load.images_per_row} per row at most, {load.mean_images:.2f} on average "
                      f"({load.detail})", f"        up to {load.row_tokens} image tokens a row: {share}"]
        else:
            lines.append(f"images: none in {load.detail}")
        if load.row_tokens > s.max_length:
            lines.append("        a row's image tokens alone exceed data.max_length: such rows are refused "
                         "(data.truncation: truncate) or dropped (drop); raise data.max_length, or make images "
                         "smaller with data.image.max_pixels")
        return lines

    def render(self) -> str:
        e, s, shape = self.estimate, self.estimate.setup, self.shape
        where = ("the CPU" if s.device == "cpu" else f"{s.gpus} GPUs (DDP)" if s.gpus > 1 else "1 GPU")
        precision = f"{s.mixed} autocast" if s.mixed else "no autocast"
        trained = ("full fine-tuning" if s.adapter is None
                   else f"LoRA r={s.adapter.r}{' (DoRA)' if s.adapter.dora else ''}")
        lines = [
            f"ft plan: {self.source}, per device on {where}",
            f"model: {shape.name} ({shape.model_type}, {shape.layers} layers, hidden {shape.hidden}, vocab "
            f"{shape.vocab}): {e.params / 1e6:,.1f}M parameters, {e.trainable / 1e6:,.2f}M trained ({trained})",
            f"step: {s.batch} × {s.max_length} tokens{' packed' if s.packing else ''}, gradient accumulation "
            f"{s.accumulation}; {precision}; activation checkpointing {'on' if s.checkpointing else 'off'}; "
            f"{s.attention} attention; optimizer {s.optimizer}",
            *(self._vision_lines() if shape.vision is not None and s.images is not None else []),
            "",
            f"{'component':<52}{'size':>12}{'at peak':>12}",
        ]
        lines += [f"{p.name:<52}{human(p.size):>12}{human(p.at_peak):>12}" for p in e.parts]
        lines.append(f"{'peak (in the ' + e.phase + ')':<52}{'':>12}{human(e.total):>12}")
        lines.append(self.drivers())
        if self.process_peak is not None:
            lines.append(f"On a CPU the process also holds Python, torch and the libraries ({human(CPU_RUNTIME)}): "
                         f"summary.json's peak_memory_gb, the process's peak, should read about "
                         f"{self.process_peak / 2**30:.2f} GiB.")
        if s.vllm_share:
            held = f" ({human(self.vllm_bytes)})" if self.vllm_bytes is not None else ""
            lines.append(f"vLLM (train.use_vllm, colocate mode) holds train.vllm_gpu_memory_utilization "
                         f"{s.vllm_share:g} of each GPU's memory{held} beside this, for its weights and KV cache.")
        if self.budget is None:
            lines.append("\nNo GPU here to compare with: pass --gpu-memory (e.g. 80GiB) to check that it fits.")
            return "\n".join(lines)
        share = (e.total + (self.vllm_bytes or 0.0)) / self.budget
        verdict = ("fits" if self.fits else "too tight (over 90%: leave room for the CUDA context and fragmentation)"
                   if share <= 1 else "does not fit")
        lines.append(f"\n{human(self.budget)} {'per GPU' if s.device == 'cuda' else 'of memory'}: {verdict}, "
                     f"{share:.1%} of it.")
        if not self.fits:
            lines += self._render_suggestions()
        return "\n".join(lines)

    def _render_suggestions(self) -> list[str]:
        if not self.suggestions:
            return ["No change ft plan knows makes it fit: use GPUs with more memory or a smaller model "
                    "(FSDP/DeepSpeed sharding is not modelled yet)."]
        alone = len(self.suggestions) > 1 or len(self.suggestions[0].changes) <= 2
        lines = ["Changes that make it fit" + (", each on its own:" if alone else " (together):")]
        for x in self.suggestions:
            lines.append(f"  {'; '.join(f'{k}: {yaml_value(v)}' for k, v in x.changes.items()):<62}"
                         f"{human(x.estimate.total):>12}")
        first = " ".join(f"--set {arg}" for arg in set_args(self.suggestions[0].changes))
        lines.append(f"Check one with: ft plan {self.source} {first}")
        return lines


def _millions(count: int) -> str:
    return f"{count / 1e6:,.1f}M" if count >= 1e6 else f"{count:,}"


def _count(params: list[Param], part: str, trainable: bool = False) -> int:
    return sum(p.numel for p in params if p.part == part and p.kind != "adapter" and (p.trainable or not trainable))


def _state(params: list[Param], part: str) -> str:
    """What of a vision-language model's part trains: all of it, LoRA adapters on it, or nothing."""
    mine = [p for p in params if p.part == part]
    if any(p.kind == "adapter" for p in mine):
        return "LoRA"
    return "trained" if any(p.trainable for p in mine) else "frozen"


def plan(recipe: Recipe, source: str, gpu_memory: str | None = None, gpus: int = 1, device: str = "cuda") -> Plan:
    """The whole of ``ft plan``: the estimate for the recipe, and changes that make it fit when it does not. A
    vision-language model's images are counted from the recipe's data where it can be read
    (``ft.plan.vision.image_load``)."""
    budget = parse_memory(gpu_memory) if gpu_memory is not None else (
        local_gpu_memory() if device == "cuda" else None)
    shape = read_shape(recipe)
    images = image_load(recipe, shape.vision) if shape.vision is not None else None
    setup = setup_for(recipe, shape, device, gpus, images)
    result = estimate(shape, setup)
    fits = budget is None or result.total <= room(budget, setup)
    return Plan(source, shape, result, budget,
                [] if fits else suggestions(shape, setup, room(budget, setup) / FITS_BELOW))


def room(budget: float, setup: Setup) -> float:
    """What training may use of a GPU's ``budget``: ``FITS_BELOW`` of it (the rest for the CUDA context and
    fragmentation), less what vLLM holds there in colocate mode."""
    return FITS_BELOW * budget - setup.vllm_share * budget
