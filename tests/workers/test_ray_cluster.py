"""The multi-node path: a Ray cluster of two worker nodes (``ray.cluster_utils.Cluster``).

The head node has no CPU and no GPU, so nothing can train there; each worker node declares one
CPU and one GPU, so the two workers land on two different nodes. The experiment folder stays with
the controller (this process): run state reaches the nodes through Ray's object store only.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import ray  # noqa: E402  (the test extra installs it: no skip)
from ray.cluster_utils import Cluster  # noqa: E402

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig  # noqa: E402
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model  # noqa: E402

pytestmark = pytest.mark.slow   # slow tier: a real two-node Ray cluster


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    # every node on loopback (conftest.py keeps Ray from turning 127.0.0.1 into the machine's
    # network address, without which the driver could not reach a GCS bound to loopback)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "node_ip_address": "127.0.0.1"})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=1, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def group():
    return RFGridSearch(RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-2, 3e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False)), trainer_type="SFT")


def weights(exp, rid):
    w = exp.engine.run_weights(rid)
    return {k.replace(f".run_{rid}.", ".run_X."): v for k, v in w.items()}


@contextlib.contextmanager
def one_thread():
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def test_two_nodes_train_and_match_the_kernel_engine(two_nodes, tmp_path):
    train, evald = make_demo_datasets(32, 8)
    # "auto" on a cluster the user connected to: one worker per GPU of the cluster
    exp = Experiment("nodes", experiment_path=tmp_path)
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, seed=11)
    (workers,) = [e for e in exp.events.since(0) if e["type"] == "workers"]
    assert len(workers["workers"]) == 2
    nodes = {w["node_id"] for w in workers["workers"]}
    head = {n["NodeID"] for n in ray.nodes() if n["Resources"].get("CPU", 0) == 0}
    assert len(nodes) == 2 and not nodes & head, "each worker on its own worker node"
    chunks = [e for e in exp.events.since(0) if e["type"] == "chunk_done"]
    assert len(chunks) == 4 and {c["worker"] for c in chunks} == {"w0", "w1"}
    assert set(exp.get_runs_info().status) == {"completed"}
    # nothing of the experiment folder was needed on the nodes: the runs' checkpoints are here
    assert all(exp.store.checkpoint_path(rid).exists() for rid in (1, 2))
    with one_thread():
        ref = Experiment("nodes-ref", experiment_path=tmp_path, num_workers=0)
        ref.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, seed=11)
    for rid in (1, 2):
        a, b = weights(exp, rid), weights(ref, rid)
        assert a.keys() == b.keys() and a
        assert all(torch.equal(a[k], b[k]) for k in a)
    exp.end()
    ref.end()
