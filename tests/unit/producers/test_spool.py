from producers.agent.spool.disk import Spool


def values(records):
    return [r.value for r in records]


def test_records_come_back_in_order_until_acknowledged(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    for i in range(100):
        spool.append("t", f"k{i}".encode() if i % 2 else None, f"v{i}".encode() * 20)
    got = spool.read(spool.cursor(), limit=1000)
    assert values(got) == [f"v{i}".encode() * 20 for i in range(100)]
    assert got[0].key is None and got[1].key == b"k1"
    assert spool.pending() == 100
    spool.acknowledge(got[59].position, 60)
    assert spool.read(spool.cursor(), limit=1)[0].value == b"v60" * 20
    assert spool.pending() == 40
    spool.close()
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)  # after a restart
    assert values(again.read(again.cursor(), limit=1000)) == [f"v{i}".encode() * 20 for i in range(60, 100)]
    assert again.pending() == 40


def test_a_full_spool_drops_the_oldest_and_counts_them(tmp_path):
    spool = Spool(tmp_path, max_bytes=8192, segment_bytes=2048)
    for i in range(200):
        spool.append("t", None, b"x" * 100 + str(i).encode())
    left = spool.read(spool.cursor(), limit=1000)
    assert spool.dropped == 200 - len(left) > 0
    assert spool.pending() == len(left)
    assert left[-1].value.endswith(b"199")  # the newest are kept
    assert sum(p.stat().st_size for p in tmp_path.glob("*.seg")) <= 8192
