"""What each job asks of a Ray cluster, from its own config: one GPU where its model runs on one.

Ray hides the GPUs from a task that asks none (its CUDA_VISIBLE_DEVICES is left empty) and places a
task that asks one only on a node with one free, so a job on `model.device=auto` left to the launcher's
one `remote` setting would run on a node's CPU without a word. kvpipe's Ray launcher
(hydra/launcher=ray_cluster, hydra_plugins/kvpipe_ray) is Hydra's, with each job's `num_gpus` set from that job's model once the
sweep has joined the cluster (where the cluster's GPUs are known); a `num_gpus` the user sets stands.
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf


def gpus_per_job(device: str) -> int:
    """1 where the model runs on a GPU: model.device=cuda (or cuda:N), or auto on a cluster that has
    one; 0 on a CPU (model.device=cpu, or auto on a cluster without GPUs)."""
    device = str(device)
    if device.startswith("cuda"):
        return 1
    ray = sys.modules.get("ray")  # imported by the launcher that joined a cluster, if any
    if device != "auto" or ray is None or not ray.is_initialized():
        return 0
    return int(ray.cluster_resources().get("GPU", 0) > 0)


def launch_on_ray(launcher, job_overrides, initial_job_idx):
    """Hydra's Ray launcher's launch (it joins the cluster, then submits each job as a Ray task),
    each job's `remote` given `num_gpus` from its own model where the user set none."""
    from hydra_plugins.hydra_ray_launcher import _core

    submit = _core.launch_job_on_ray

    def with_resources(hydra_context, ray_remote, sweep_config, task_function, singleton_state):
        remote = OmegaConf.to_container(ray_remote, resolve=True) if ray_remote else {}
        if remote.get("num_gpus") is None:
            remote["num_gpus"] = gpus_per_job(sweep_config.model.device)
        return submit(hydra_context, OmegaConf.create(remote), sweep_config, task_function, singleton_state)

    _core.launch_job_on_ray = with_resources  # what _core.launch calls for each job, once Ray is joined
    try:
        return _core.launch(launcher=launcher, job_overrides=job_overrides, initial_job_idx=initial_job_idx)
    finally:
        _core.launch_job_on_ray = submit
