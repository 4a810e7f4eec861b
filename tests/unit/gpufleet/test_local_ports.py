"""The ports gpufleet gives what it starts on loopback: outside the kernel's ephemeral range, so
that no connection opened meanwhile takes one before its server binds it; free; never the same
twice."""

from __future__ import annotations

import socket

import pytest

from gpufleet.local.ports import ephemeral_range, free_port


def test_a_port_is_drawn_where_the_kernel_hands_out_none():
    span = ephemeral_range()
    if span is None:
        pytest.skip("this kernel does not say its ephemeral range")
    ports = [free_port() for _ in range(50)]
    assert not any(span[0] <= p <= span[1] for p in ports), (span, ports)
    assert len(set(ports)) == len(ports)
    # what the kernel gives a connection is inside it (what the ports above are kept from)
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as c:
        assert span[0] <= c.getsockname()[1] <= span[1]


def test_a_port_in_use_is_not_handed_out_nor_one_handed_out_before(tmp_path):
    kernel = tmp_path / "range"
    kernel.write_text("11001\t65535\n")  # (1,001 ports below it: a pool small enough to meet the one in use)
    with socket.socket() as taken:
        used = next(p for p in range(10500, 11001) if _bind(taken, p))
        taken.listen()
        ports = [free_port(kernel) for _ in range(300)]
    assert used not in ports
    assert len(set(ports)) == 300 and all(10000 <= p < 11001 for p in ports)


def _bind(s: socket.socket, port: int) -> bool:
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("kernel_says", ["1024 65535", None, "not numbers"])
def test_where_the_range_leaves_no_room_or_is_unknown_the_kernel_is_asked(tmp_path, kernel_says):
    kernel = tmp_path / "range"
    if kernel_says is not None:
        kernel.write_text(kernel_says)
    ports = [free_port(kernel) for _ in range(20)]
    assert len(set(ports)) == 20
    for p in ports:
        with socket.create_server(("127.0.0.1", p)):
            pass  # (free: it binds)
