"""Event payloads are written straight from Python objects; the text must be exactly what the
tree path (used for message content) writes."""

import random
import struct

import kerman


def test_direct_json_text_matches_the_tree_path() -> None:
    log = kerman.MemoryStore().create()
    inbox = kerman.Inbox(log)
    values = [
        0.1,
        -0.0,
        1e300,
        1.5e-7,
        123456789.0,
        2**63,
        -(2**63),
        2**64 - 1,
        1e16,
        3.0,
        'é"\\\n\x00\u2028😀',
        {"a": [1, None, True, False, {"b": 2.5}]},
        [],
        {},
        "",
        0.30000000000000004,
        5e-324,
        1.7976931348623157e308,
    ]
    r = random.Random(1)
    values += [r.uniform(-1e10, 1e10) * 10 ** r.randint(-300, 290) for _ in range(500)]
    for i, v in enumerate(values):
        event = log.append("x/y", {"v": v})
        inbox.append("next-turn", kerman.UserMessage([{"type": "t", "v": v}], id=f"m{i}"))
        direct = event.to_json().split('"data":{"v":', 1)[1].rsplit("}}", 1)[0]
        tree = log[len(log) - 1].to_json().split('"v":', 1)[1].split('}],"source"', 1)[0]
        assert direct == tree, v


def test_floats_read_back_exactly(tmp_path) -> None:
    """Found with the message_from_json fuzz target's checks: the JSON parser was allowed to be
    one ulp off, so about a third of all doubles came back changed from event data and replayed
    messages."""
    r = random.Random(2)
    values = [3.0555915654315343e-167, 2.6708959935055662e-269]
    values += [struct.unpack("<d", struct.pack("<Q", r.getrandbits(52) | r.randrange(1, 2046) << 52))[0] for _ in range(2000)]
    store = kerman.FileStore(tmp_path, durability="none")
    log = store.create("f")
    log.append("x/y", {"v": values})
    inbox = kerman.Inbox(log)
    message = kerman.UserMessage([{"type": "t", "v": values}], id="m")
    inbox.append("next-turn", message)
    assert log[0].data["v"] == values
    log.close()
    log = store.open("f")
    try:
        assert log[0].data["v"] == values
        assert kerman.Inbox(log).next_turn == (message,)
    finally:
        log.close()
