"""Recommendations in the words of the framework the run used, all in one place.

``framework_of(run)`` reads what the run's processes had imported (run.json and
process.json ``versions``) and tells PyTorch (torch, Lightning, Keras on the
torch backend), TensorFlow (tf.data, Keras on the TensorFlow backend) and runs
with neither (generic advice). The rules take their data-pipeline advice from
``ADVICE`` below; docs/rules.md ("Advice per framework") explains the choice.
"""

from __future__ import annotations

from typing import Optional

from stepscope.core.vocabulary import KERAS_PROFILER_WINDOW

TORCH, TENSORFLOW, GENERIC = "torch", "tensorflow", "generic"
FRAMEWORKS = (TORCH, TENSORFLOW, GENERIC)
TORCH_MODULES = ("torch", "lightning", "pytorch_lightning")


def framework_of(run) -> str:
    """TORCH, TENSORFLOW or GENERIC: whose data pipeline fed this run's training loop."""
    versions = getattr(run, "versions", None) or {}
    torch_like = any(m in versions for m in TORCH_MODULES)
    tf_like = "tensorflow" in versions
    if tf_like and not torch_like:
        return TENSORFLOW  # tf.data loops; Keras on TensorFlow (or JAX over tf.data)
    if torch_like and not tf_like:
        return TORCH
    if not (torch_like or tf_like):
        return GENERIC
    # Both imported. Keras on the TensorFlow backend samples profiler windows; Keras on the
    # torch backend imports TensorFlow too (for its tf.data adapter) but feeds batches
    # through torch; Lightning is torch.
    if _has_keras_window(run):
        return TENSORFLOW
    if "keras" in versions or any(m in versions for m in TORCH_MODULES[1:]):
        return TORCH
    return GENERIC  # a torch job that imported TensorFlow, or the reverse: cannot tell


def _has_keras_window(run) -> bool:
    try:
        return bool(len(run.select(names=[KERAS_PROFILER_WINDOW], columns=["name"])))
    except Exception:  # noqa: BLE001 - no events table
        return False


# --- the texts ------------------------------------------------------------------------------
# Each entry: framework -> text. Rules compose their recommendation from these.
ADVICE = {
    # GetNextBottleneck: the loop waits for its next batch.
    "feed": {
        TORCH: ("Feed the loop faster (PyTorch DataLoader): raise num_workers (and prefetch_factor), use "
                "persistent_workers=True and pin_memory=True, move costly decoding or augmentation out of "
                "__getitem__ (pre-process once, cache decoded data), or read from faster storage."),
        TENSORFLOW: ("Feed the loop faster (tf.data): end the input pipeline with "
                     "dataset.prefetch(tf.data.AUTOTUNE), run its transformations in parallel with "
                     "map(..., num_parallel_calls=tf.data.AUTOTUNE) (and interleave(..., "
                     "num_parallel_calls=tf.data.AUTOTUNE) over files), cache() the data after the costly "
                     "map when it fits in memory or on local disk, or read from faster storage. Keras's fit "
                     "takes such a dataset directly instead of NumPy arrays."),
        GENERIC: ("Feed the loop faster: prepare batches ahead of the loop in background workers (processes or "
                  "threads) with a few batches prefetched, decode and augment in parallel, pre-process once "
                  "and cache the decoded data, or read from faster storage."),
    },
    # GetNextBottleneck, PyTorch: the first step of every epoch waits for workers that start again.
    "epoch_start": {
        TORCH: ("persistent_workers=True would remove about {excess_ms:.0f} ms per epoch: the DataLoader starts "
                "its worker processes again at every epoch (and shuts them down at its end), so the first step "
                "of each epoch waits {first_step_getnext_ms:.1f} ms for its batch against "
                "{other_getnext_ms:.1f} ms for the other steps (medians over {epochs} epochs). "),
    },
    # IOBottleneck: let reads overlap, and keep what was decoded.
    "overlap_reads": {
        TORCH: "raise DataLoader num_workers and prefetch_factor so reads overlap, and cache decoded samples "
               "between epochs",
        TENSORFLOW: "read files in parallel with interleave(..., num_parallel_calls=tf.data.AUTOTUNE) and end the "
                    "tf.data pipeline with prefetch(tf.data.AUTOTUNE) so reads overlap, and cache() decoded "
                    "samples between epochs",
        GENERIC: "read with several workers in parallel and prefetch so reads overlap, and cache decoded samples "
                 "between epochs",
    },
    # CPUBottleneck, the training process itself is busy.
    "offload": {
        TORCH: ("Take work off the training process: move preprocessing into DataLoader workers "
                "(num_workers > 0), cut per-step Python (logging, metric computation on the host), and "
                "launch fewer, larger GPU operations (larger batch, torch.compile, CUDA graphs)."),
        TENSORFLOW: ("Take work off the training loop: move preprocessing into the tf.data pipeline "
                     "(map(..., num_parallel_calls=tf.data.AUTOTUNE) runs it on tf.data's own threads), cut "
                     "per-step Python (callbacks and logging every batch, metrics computed on the host), and "
                     "run fewer, larger steps (larger batch, jit_compile=True, steps_per_execution > 1 in "
                     "Keras's compile)."),
        GENERIC: ("Take work off the training process: move preprocessing into background data-loading "
                  "workers, cut per-step Python (logging, metric computation on the host), and launch fewer, "
                  "larger GPU operations (larger batch, a compiler, CUDA graphs)."),
    },
    # CPUBottleneck, all cores busy.
    "cheaper_cpu": {
        TORCH: ("The host cannot produce batches as fast as the GPU consumes them: make preprocessing cheaper "
                "(decode once and cache, lighter augmentation, do augmentation on the GPU, e.g. with "
                "torchvision.transforms.v2 on CUDA tensors or NVIDIA DALI), avoid oversubscribing cores "
                "(DataLoader workers x intra-op threads), or use an instance with more CPUs per GPU."),
        TENSORFLOW: ("The host cannot produce batches as fast as the GPU consumes them: make preprocessing "
                     "cheaper (decode once and cache(), lighter augmentation, do augmentation on the GPU, e.g. "
                     "with Keras preprocessing layers inside the model or NVIDIA DALI), avoid oversubscribing "
                     "cores (tf.data's parallel calls x TensorFlow's op threads, tf.config.threading), or use an "
                     "instance with more CPUs per GPU."),
        GENERIC: ("The host cannot produce batches as fast as the GPU consumes them: make preprocessing cheaper "
                  "(decode once and cache, lighter augmentation, do augmentation on the GPU, e.g. with NVIDIA "
                  "DALI), avoid oversubscribing cores (data-loading workers x compute threads), or use an "
                  "instance with more CPUs per GPU."),
    },
    # HostSyncStall: after naming the phase and its usual culprit.
    "sync": {
        TORCH: ("Keep values on the GPU and read them every N steps (accumulate the loss as a tensor, log it "
                "periodically), avoid print() of tensors, and copy host-to-device with pin_memory=True and "
                ".to(device, non_blocking=True). torch.cuda.set_sync_debug_mode(\"warn\") points at each "
                "synchronizing call."),
        TENSORFLOW: ("Keep values on the GPU and read them every N steps (steps_per_execution > 1 in Keras's "
                     "compile, callbacks that read logs less often), avoid print() and .numpy() of tensors, and "
                     "let tf.data stage batches ahead (prefetch(tf.data.AUTOTUNE), "
                     "tf.data.experimental.prefetch_to_device)."),
        GENERIC: ("Keep values on the GPU and read them every N steps, avoid printing tensors, and copy "
                  "host-to-device asynchronously from pinned (page-locked) memory."),
    },
}

# HostSyncStall: what usually synchronizes in each phase.
SYNC_CULPRITS = {
    TORCH: {
        "Loss": "reading the loss on the host every step (loss.item(), float(loss), print(loss), a metric on "
                ".cpu())",
        "Forward": "host reads of GPU tensors in the model (tensor.item(), .tolist(), .cpu(), data-dependent "
                   "control flow such as `if x.sum() > 0`, torch.nonzero / boolean indexing)",
        "Backward": "host reads of GPU tensors in backward hooks, or gradient clipping that checks for "
                    "non-finite norms on the host",
        "Optimizer": "host reads in the optimizer step (e.g. GradScaler's inf checks read on the host, "
                     "clip_grad_norm_ with error_if_nonfinite, learning-rate schedulers reading tensors)",
        "GetNext": "blocking host-to-device copies of the batch (.to(device) from pageable memory)",
    },
    TENSORFLOW: {
        "Loss": "reading the loss on the host every step (loss.numpy(), float(loss), print(loss), a metric or "
                "callback reading logs every batch)",
        "Forward": "host reads of GPU tensors in the model (.numpy(), Python control flow on tensor values)",
        "GetNext": "copies of the batch to the GPU that nothing prefetched",
    },
    GENERIC: {},
}


def advice(key: str, framework: str, **figures) -> str:
    """The text for ``key`` in the run's framework (GENERIC where the framework has none)."""
    texts = ADVICE[key]
    text = texts.get(framework, texts.get(GENERIC, ""))
    return text.format(**figures) if figures else text


def sync_culprit(framework: str, phase: str) -> str:
    return SYNC_CULPRITS.get(framework, {}).get(phase, "host reads of GPU tensors")


def label(framework: Optional[str]) -> str:
    return {TORCH: "PyTorch", TENSORFLOW: "TensorFlow"}.get(framework or GENERIC, "no framework recognised")
