"""One process or many (``accelerate launch``): the accelerator, each process's share of a
step, and the collective operations that keep processes in step."""

from __future__ import annotations

from pathlib import Path

import torch


def make_accelerator(cfg, run_dir: Path, command: str, *, trackers: bool = True):
    """One CPU, one GPU or many (``accelerate launch``): device placement, backward and
    gradient clipping go through accelerate; on a GPU, accelerate's bf16 autocast when
    ``cfg.precision`` resolves to bf16 there (the trainers also enter autocast themselves,
    see ``compute_dtype``, which is how bf16 reaches CPUs).
    With ``--report-to`` the same metrics also reach that tracker (``trackers=False``
    defers that to ``start_trackers``, e.g. until the run directory has been checked).

    Under several processes ``prepare`` wraps the model in DistributedDataParallel, whose
    forward calls (with gradients) broadcast buffers: every process must make the same
    forward calls through the wrapper, which the trainers ensure.
    """
    from accelerate import Accelerator

    from labelrl.models.precision import resolve_dtype

    cuda = torch.cuda.is_available()
    gpu_bf16 = cuda and resolve_dtype(getattr(cfg, "precision", "auto"), "cuda") == torch.bfloat16
    accelerator = Accelerator(
        cpu=not cuda, mixed_precision="bf16" if gpu_bf16 else "no",
        log_with=cfg.report_to, project_dir=str(run_dir / "tracking") if cfg.report_to else None,
    )
    if trackers:
        start_trackers(accelerator, cfg, command)
    return accelerator


def end_training(accelerator, model=None) -> None:
    """``accelerator.end_training()`` (trackers finished, process group destroyed), after
    releasing the reducer of ``model`` (the prepared model: under several processes the DDP
    wrapper; accelerate's own list keeps the unwrapped one), in an order that cannot hang.

    DDP's reducer owns the process group through a C++ pointer whose destructor keeps the GIL.
    Destroyed after the group was, the reducer is its last owner: freeing the group then joins
    gloo's worker thread, which may be waiting for the GIL to free the tensors of its last
    collective, and neither moves (seen: a two-process run printed its summary and hung until
    killed, under load; py-spy: ``~Reducer → ~ProcessGroupGloo → thread join`` against
    ``~AsyncBarrierWork → gil_scoped_acquire``). Released first, while the group is still
    registered, the reducer is not the last owner; the group's is its Python object, whose
    destructor lets go of the GIL. The wrapper holds the reducer twice: as ``reducer`` and
    through its ``logger`` (``dist.Logger(self.reducer)`` in DDP's constructor). The wrapper
    is not used after this."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        for owner in ("logger", "reducer"):
            if hasattr(model, owner):
                delattr(model, owner)
    accelerator.end_training()


def compute_dtype(cfg, accelerator) -> torch.dtype:
    """The dtype the trainer's matrix products run in: ``cfg.precision`` resolved on the
    accelerator's device (``labelrl.models.precision.resolve_dtype``)."""
    from labelrl.models.precision import resolve_dtype

    return resolve_dtype(cfg.precision, accelerator.device)


def start_trackers(accelerator, cfg, command: str) -> None:
    if cfg.report_to:
        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in cfg.model_dump().items()}
        accelerator.init_trackers(f"labelrl-{command}", config=flat)


def process_share(total: int, accelerator, option: str) -> slice:
    """This process's contiguous share of the ``total`` items of every step (all of them
    for a single process); ``option`` names the setting in the error."""
    n, rank = accelerator.num_processes, accelerator.process_index
    if total % n:
        flag = "--" + option.replace("_", "-")
        raise ValueError(
            f"{option}={total} does not split evenly over {n} processes: each process takes an equal share "
            f"of every step; set {flag} to a multiple of {n}"
        )
    size = total // n
    return slice(rank * size, (rank + 1) * size)


def gather_objects(accelerator, obj) -> list:
    """``obj`` of every process, in process order (``[obj]`` for a single process)."""
    if accelerator.num_processes == 1:
        return [obj]
    out = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(out, obj)
    return out


def reduce_value(accelerator, value: float, op: str = "sum") -> float:
    """``value`` summed (``op="sum"``) or maximised (``"max"``) over processes."""
    if accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return float(tensor.item())


def any_process(accelerator, flag: bool) -> bool:
    """True on every process when ``flag`` is true on any (keeps their loops in step)."""
    return reduce_value(accelerator, float(bool(flag)), "max") > 0


def broadcast_from_main(accelerator, obj):
    """The main process's ``obj``, on every process."""
    if accelerator.num_processes == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
