"""An offloaded cache's capacity in `kvpipe plan`: bounded by the device and by the host memory its
offloaded layers live in, each checked by hand; without a host figure, the device's bound, said so."""

from __future__ import annotations

import json
import math

import pytest

from kvpipe.jobspec import spec_from
from kvpipe.predict import hardware
from kvpipe.predict.bytes_plan import make_plan
from kvpipe.predict.in_flight import DEVICE, HOST, HOST_NOT_COUNTED

from conftest import run_cli

LLAMA_8B = ["model=llama31_8b_instruct"]  # config in the preset: no weights, no network
LAYER_TOKEN_BYTES = 8 * 128 * 2 * 2  # KV heads x head_dim x (key, value) x 2 bytes (bfloat16)
# of a request of 1,024 tokens, the 30 of 32 layers not on the device (the one in use and the next,
# prefetched, are): what host memory holds for it; a dynamic cache holds the 1,023 tokens fed to the
# model, a static one allocates all 1,024
HOST_PER_REQUEST = 30 * 1023 * LAYER_TOKEN_BYTES
OFFLOADING = {"offloaded": HOST_PER_REQUEST, "offloaded_static": 30 * 1024 * LAYER_TOKEN_BYTES}


def capacities(**options) -> dict:
    plan = make_plan(spec_from(LLAMA_8B), contexts=[1024], request_tokens=1024, **options)
    return {row.label: row.capacity for row in plan.rows}


def test_on_an_h100_node_host_memory_bounds_the_offloaded_caches():
    rows = capacities(hardware_name="h100_sxm")
    host = hardware.get("h100_sxm").host_memory_bytes
    assert host == 274_880_000_000  # a DGX H100's 2 TiB over its 8 GPUs, in the file's GB
    for label, per_request in OFFLOADING.items():
        offloaded = rows[label]
        assert offloaded.bound == HOST and offloaded.requests == math.floor(host / per_request)
        assert offloaded.host_kv_bytes == offloaded.requests * per_request <= host
        assert offloaded.device_requests > 3 * offloaded.requests  # what plan offered before: 7,619
        assert offloaded.tpot_floor_ms is None  # the host link sets its pace, not the memory bandwidth
    assert rows["offloaded"].requests == 2186


def test_without_a_host_figure_the_device_bound_stands_and_says_host_memory_was_not_counted():
    rows = capacities(hardware_name="h100_pcie")  # a PCIe card: no reference system, no host figure
    assert hardware.get("h100_pcie").host_memory_bytes is None
    for label, per_request in OFFLOADING.items():
        assert rows[label].bound == HOST_NOT_COUNTED and rows[label].requests == rows[label].device_requests
        assert rows[label].host_kv_bytes == rows[label].requests * per_request  # what it would take


def test_host_memory_given_overrides_the_hardwares_and_binds_only_when_smaller():
    roomy = capacities(hardware_name="h100_sxm", host_memory=2 * 2**40)["offloaded"]
    assert roomy.bound == DEVICE and roomy.requests == roomy.device_requests == 7619
    tight = capacities(hardware_name="h100_sxm", host_memory=100 * 2**30)["offloaded"]
    assert tight.bound == HOST and tight.requests == math.floor(100 * 2**30 / HOST_PER_REQUEST)
    budget_only = capacities(budget=80 * 10**9, device="cuda", host_memory=100 * 2**30)["offloaded"]  # no hardware
    assert budget_only.bound == HOST and budget_only.requests == tight.requests


def test_caches_that_keep_every_layer_on_the_device_ignore_host_memory():
    with_host, without = capacities(hardware_name="h100_sxm"), capacities(hardware_name="h100_pcie")
    for label in ("dynamic", "static", "paged", "quanto int4 kivi"):
        assert with_host[label].bound == DEVICE and with_host[label].host_kv_bytes == 0
        assert without[label].bound == DEVICE
    tiny_host = capacities(hardware_name="h100_sxm", host_memory=2**30)
    assert tiny_host["dynamic"].requests == with_host["dynamic"].requests


@pytest.mark.parametrize("entry", hardware.table(), ids=lambda entry: entry.name)
def test_every_host_figure_names_where_it_comes_from(entry):
    if entry.host_memory_bytes is not None:
        assert entry.sources[hardware.HOST_MEMORY] and entry.host_memory_bytes > entry.memory_bytes


def test_the_plan_says_which_bound_binds(tmp_path):
    said = run_cli(["plan", *LLAMA_8B, "--hardware", "h100_sxm", "--request-tokens", "1024"], cwd=tmp_path)
    assert said.returncode == 0 and "2,186 (host)" in said.stdout
    assert "offloaded: 2,186 requests, bound by host memory" in " ".join(said.stdout.split())
    said = run_cli(["plan", *LLAMA_8B, "--hardware", "h100_pcie", "--request-tokens", "1024"], cwd=tmp_path)
    assert "7,619 (device only)" in said.stdout and "host memory was not counted" in " ".join(said.stdout.split())
    said = run_cli(
        ["plan", *LLAMA_8B, "--hardware", "h100_sxm", "--request-tokens", "1024", "--host-memory", "512GiB", "--json"],
        cwd=tmp_path,
    )
    document = json.loads(said.stdout)
    offloaded = next(row for row in document["rows"] if row["strategy"] == "offloaded")["capacity"]
    assert document["host_memory_bytes"] == 2**39 and offloaded["bound"] == HOST
    assert offloaded["requests"] == 2**39 // HOST_PER_REQUEST == 4373


def test_host_memory_is_one_line_when_malformed_or_without_a_capacity_to_bound(tmp_path):
    said = run_cli(["plan", *LLAMA_8B, "--host-memory", "2TiB"], cwd=tmp_path)
    assert said.returncode == 2 and "--host-memory='2TiB' is not valid: it bounds capacity" in said.stderr
    said = run_cli(["plan", *LLAMA_8B, "--hardware", "h100_sxm", "--request-tokens", "1024", "--host-memory", "lots"],
                   cwd=tmp_path)  # fmt: skip
    assert said.returncode == 2 and said.stderr.count("\n") == 1
    assert "--host-memory='lots' is not valid: expected a positive size" in said.stderr
