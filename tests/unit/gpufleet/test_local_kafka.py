import base64

from gpufleet.local.kafka_node_config import cluster_id


def test_cluster_ids_are_16_bytes_and_never_look_like_an_option():
    ids = [cluster_id() for _ in range(5000)]  # about 1 in 64 random ids starts with '-'
    assert not any(i.startswith("-") for i in ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)


def test_port_gives_each_node_its_own_client_port_in_a_row_and_says_which_is_taken():
    import socket

    import pytest

    from gpufleet.local.kafka import KafkaRunnerError, client_ports
    from gpufleet.local.ports import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(KafkaRunnerError, match=f"port {busy} is in use: choose another --port \\(node i"):
            client_ports(busy - 1, 3)
        # The demo's option is --kafka-port: the message names what the user typed.
        with pytest.raises(KafkaRunnerError, match=f"port {busy} is in use: choose another --kafka-port$"):
            client_ports(busy, 1, "--kafka-port")
    first = free_port()
    assert client_ports(first, 1) == [first]
    with pytest.raises(KafkaRunnerError, match="past 65535"):
        client_ports(65534, 3)


def test_a_made_cluster_keeps_its_ports_and_refuses_another_port(tmp_path):
    import pytest

    from gpufleet.local.kafka import KafkaRunnerError, _write_raw, start

    _write_raw(tmp_path, {"cluster_id": cluster_id(), "secure": False, "nodes": [
        {"node_id": i, "port": 39000 + i, "controller_port": 39100 + i, "pid": 0} for i in (1, 2, 3)]})
    with pytest.raises(KafkaRunnerError, match="39001, 39002, 39003: a cluster keeps its ports"):
        start(tmp_path, brokers=3, port=40000)
