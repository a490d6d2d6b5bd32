"""What a configuration costs, from its config alone: one place that plan, the search's pruning and
the calibration all ask (kvpipe.predict.floors.ModelCosts: bytes and FLOPs of any strategy at any
context)."""

from __future__ import annotations

from kvpipe.predict.floors import ModelCosts, model_costs


def costs_for(spec, device: str, dtype: str | None = None, batch_size: int | None = None) -> ModelCosts:
    """The costs of the spec's model on `device`, in `dtype` (default: what model.dtype resolves to
    there) at `batch_size` (default: the workload's). Raises what reading the model's config raises."""
    from kvpipe import model
    from kvpipe.model.weights import weights

    dtype = dtype or model.dtype_name(spec.model.dtype, device)
    batch_size = batch_size or spec.workload.batch_size
    shape = model.read_shape(spec.model)
    return model_costs(spec.model, shape, weights(spec.model, dtype).bytes, dtype, batch_size, device)
