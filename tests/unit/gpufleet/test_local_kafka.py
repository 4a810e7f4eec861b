import base64

from gpufleet.kafka_node_config import cluster_id


def test_cluster_ids_are_16_bytes_and_never_look_like_an_option():
    ids = [cluster_id() for _ in range(5000)]  # about 1 in 64 random ids starts with '-'
    assert not any(i.startswith("-") for i in ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
