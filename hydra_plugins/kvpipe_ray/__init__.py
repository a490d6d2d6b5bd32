"""Hydra finds launchers only in the hydra_plugins namespace: this names kvpipe's Ray launcher there
(hydra/launcher=ray_cluster, conf/hydra/launcher/ray_cluster.yaml). It is Hydra's Ray launcher, each
job given the GPUs its own model needs (kvpipe.orchestrate.cluster); nothing of Ray is imported until a
sweep launches, so Hydra's plugin scan costs nothing where Ray is not installed."""

from hydra.plugins.launcher import Launcher


class KvpipeRayLauncher(Launcher):
    def __init__(self, ray) -> None:
        self.ray_cfg = ray  # Hydra's Ray launcher's settings: init (how to join), remote (what each job asks)
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides, initial_job_idx):
        from kvpipe.orchestrate.cluster import launch_on_ray

        return launch_on_ray(self, job_overrides, initial_job_idx)
